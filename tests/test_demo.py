"""The demo's command line: arguments that cannot work are refused with a message that names them."""

import pytest

import demo


def test_rescore_needs_a_positive_number_of_queries(capsys):
    with pytest.raises(SystemExit) as stop:
        demo.main(["--rescore", "0"])
    assert stop.value.code == 2 and "--rescore must be a positive number of queries, got 0" in capsys.readouterr().err


def test_rescore_names_the_checkpoints_it_cannot_find(tmp_path):
    (tmp_path / "run-lmk" / "final").mkdir(parents=True)  # a folder without a checkpoint in it
    with pytest.raises(SystemExit, match=r"--rescore needs the trained checkpoints.*run-lmk/final nor .*run-cls/final"):
        demo.main(["--rescore", "50", "--out", str(tmp_path)])
