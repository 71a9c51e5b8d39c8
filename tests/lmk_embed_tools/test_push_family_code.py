"""push.py ships a checkpoint's own family's code: staging refreshes exactly the family's shipped files
(an older checkpoint's copies of the other family's are left out), and validation refuses a staged
folder whose .py files are not exactly that set."""

import shutil

import pytest

import lmk_embed
from lmk_embed_tools import push

FAMILIES = [("lmk_checkpoint", "lmk_embedder"), ("mamba2_checkpoint", "recurrent_embedder")]


def names(family=None):
    return {path.name for path in lmk_embed.shipped_files(family)}


@pytest.mark.parametrize("checkpoint, family", FAMILIES)
def test_staging_an_old_all_families_checkpoint_ships_only_its_family(checkpoint, family, request, tmp_path):
    folder = shutil.copytree(request.getfixturevalue(checkpoint), tmp_path / "old")
    for path in lmk_embed.shipped_files():  # as checkpoints written before carried every shipped file
        shutil.copyfile(path, folder / path.name)
    report = push.stage(folder, tmp_path / "staged")
    staged = {path.name for path in report.folder.rglob("*.py")}
    assert staged == names(family)
    assert sorted(report.left_out) == sorted(names() - names(family))
    push.check_staged_code(report.folder)  # exactly the family's files: no complaint


@pytest.mark.parametrize("checkpoint, family", FAMILIES)
def test_staged_code_must_be_exactly_the_family_set(checkpoint, family, request, tmp_path):
    staged = push.stage(request.getfixturevalue(checkpoint), tmp_path / "staged").folder
    other = sorted(names() - names(family))[0]
    shutil.copyfile(lmk_embed.PACKAGE_DIR / other, staged / other)
    with pytest.raises(push.PushError, match=rf"{other} is not one of the {family} files"):
        push.check_staged_code(staged)
    (staged / other).unlink()
    (staged / "compat.py").unlink()
    with pytest.raises(push.PushError, match=r"compat\.py is missing"):
        push.check_staged_code(staged)
