"""A saved checkpoint holds its own family's code: `save_pretrained` copies the family's files and
removes the other family's shipped files a reused folder still holds, leaving any other file alone."""

import shutil

import pytest

import lmk_embed


@pytest.mark.parametrize("which", ["lmk_checkpoint", "mamba2_checkpoint"])
def test_save_pretrained_leaves_exactly_the_family_code(which, request, tmp_path):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(request.getfixturevalue(which))  # our package's classes
    family = model.config.model_type
    for path in lmk_embed.shipped_files():  # a folder converted before, when checkpoints carried every file
        shutil.copyfile(path, tmp_path / path.name)
    (tmp_path / "user_helper.py").write_text("X = 1\n")
    model.save_pretrained(tmp_path)
    expected = {path.name for path in lmk_embed.shipped_files(family)}
    assert {path.name for path in tmp_path.glob("*.py")} == expected | {"user_helper.py"}
    assert all((tmp_path / name).read_bytes() == (lmk_embed.PACKAGE_DIR / name).read_bytes() for name in expected)
