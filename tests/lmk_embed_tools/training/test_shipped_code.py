"""Conversion writes a checkpoint's own family's code: `write_shipped_code` copies the family's files and
removes the other family's shipped files a reused folder still holds, leaving any other file alone."""

import shutil

import pytest

import lmk_embed
from lmk_embed_tools.training.convert import write_shipped_code


@pytest.mark.parametrize("family", sorted(lmk_embed.AUTO_MAPS))
def test_write_shipped_code_leaves_exactly_the_family_code(family, tmp_path):
    for path in lmk_embed.shipped_files():  # a folder converted before, when checkpoints carried every file
        shutil.copyfile(path, tmp_path / path.name)
    (tmp_path / "user_helper.py").write_text("X = 1\n")
    written = write_shipped_code(tmp_path, family)
    expected = {path.name for path in lmk_embed.shipped_files(family)}
    assert set(written) == expected
    assert {path.name for path in tmp_path.glob("*.py")} == expected | {"user_helper.py"}
    assert all((tmp_path / name).read_bytes() == (lmk_embed.PACKAGE_DIR / name).read_bytes() for name in expected)
