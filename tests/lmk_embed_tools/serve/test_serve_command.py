"""`lmk-embed serve`'s argument checks: each bad argument is one line naming it, before Ray starts."""

import pytest

from lmk_embed_tools import cli


def test_a_file_as_checkpoint_is_one_line(tmp_path, capsys):
    (tmp_path / "model.bin").write_text("x")
    assert cli.main(["serve", str(tmp_path / "model.bin")]) == 2
    assert "CHECKPOINT" in capsys.readouterr().err


def test_an_index_that_is_not_one_is_named(tmp_path, lmk_checkpoint, capsys):
    assert cli.main(["serve", str(lmk_checkpoint), "--index", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "--index" in error and len(error.strip().splitlines()) == 1


@pytest.mark.parametrize("option, value", [("--port", "70000"), ("--replicas", "0"), ("--max-batch-size", "-1"),
                                           ("--batch-wait-ms", "-5"), ("--max-input-tokens", "0"),
                                           ("--backend", "tensorrt")])
def test_bad_options_exit_2_naming_them(lmk_checkpoint, option, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", str(lmk_checkpoint), option, value])
    assert exit_info.value.code == 2 and option in capsys.readouterr().err
