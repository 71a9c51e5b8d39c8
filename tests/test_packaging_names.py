"""Installing the distribution adds only our own import names to site-packages."""

import importlib.metadata
import subprocess
import sys
import zipfile

import pytest

from tests.helpers import REPO_ROOT

OUR_NAMES = {"lmk_embed", "lmk_embed_tools"}


def test_the_installed_distribution_declares_only_our_names():
    top_level = importlib.metadata.distribution("lmk-embed").read_text("top_level.txt")
    assert set(top_level.split()) == OUR_NAMES


def test_a_built_wheel_holds_only_our_names(tmp_path):
    """The wheel `pip install .` would install: every top-level entry is ours (or its metadata)."""
    pytest.importorskip("setuptools")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO_ROOT), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == OUR_NAMES
    assert "lmk_embed_tools/model_cards/template.md" in archive.namelist()
