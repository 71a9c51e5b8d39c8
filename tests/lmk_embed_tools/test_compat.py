"""The tooling's compat module: each reach into a library's internals works with the tested versions and
refuses any other loudly, naming the installed version (the version string is patched here)."""

import importlib

import pytest

from lmk_embed_tools import compat
from lmk_embed_tools.evaluation.metrics import score_run

RUN = {"q1": {"d1": 0.9, "d2": 0.1}, "q2": {"d1": 0.8, "d2": 0.7}}
RELEVANT = {"q1": {"d1": 1}, "q2": {"d2": 1}}


def test_mteb_scores_with_a_tested_mteb():
    scores = compat.mteb_retrieval_scores(RUN, RELEVANT, [1, 10])
    assert scores["ndcg_at_1"] == pytest.approx(0.5) and scores["recall_at_10"] == pytest.approx(1.0)
    assert score_run(RUN, RELEVANT)["mrr_at_10"] == pytest.approx(0.75)


@pytest.mark.parametrize("version", ["3.0.0", "1.39.7"])
def test_mteb_scores_refuse_an_untested_mteb(monkeypatch, version):
    monkeypatch.setattr(importlib.import_module("mteb"), "__version__", version)
    with pytest.raises(compat.UntestedVersionError, match=rf"mteb {version} is installed"):
        compat.mteb_retrieval_scores(RUN, RELEVANT, [1, 10])
    with pytest.raises(compat.UntestedVersionError, match=rf"mteb {version}"):
        score_run(RUN, RELEVANT)


def test_dataset_fingerprint_with_a_tested_datasets():
    datasets = importlib.import_module("datasets")
    one, other = datasets.Dataset.from_dict({"text": ["a", "b"]}), datasets.Dataset.from_dict({"text": ["a", "c"]})
    assert compat.dataset_fingerprint(one) == one._fingerprint != compat.dataset_fingerprint(other)


@pytest.mark.parametrize("version", ["6.0.0", "3.6.0", "garbage"])
def test_dataset_fingerprint_refuses_an_untested_datasets(monkeypatch, version):
    datasets = importlib.import_module("datasets")
    dataset = datasets.Dataset.from_dict({"text": ["a"]})
    monkeypatch.setattr(datasets, "__version__", version)
    with pytest.raises(compat.UntestedVersionError, match=rf"datasets {version} is installed"):
        compat.dataset_fingerprint(dataset)


def test_tested_ranges_hold_the_installed_versions():
    assert all(spec.contains(importlib.import_module(name).__version__, prereleases=True) for name, spec in compat.TESTED.items())


def test_the_trainer_saves_on_the_saving_rank_only(tmp_path):
    # transformers 5 checks `should_save` inside `Trainer._save`, which sentence-transformers overrides.
    from types import SimpleNamespace

    from sentence_transformers import SentenceTransformerTrainer

    from lmk_embed_tools.compat import single_writer_trainer

    class Recording(SentenceTransformerTrainer):
        def __init__(self, should_save):
            self.args, self.saved = SimpleNamespace(should_save=should_save), []

    trainer_class = single_writer_trainer(Recording)
    for should_save in (True, False):
        trainer = trainer_class(should_save)
        trainer.model = SimpleNamespace(save_pretrained=lambda folder, **_: trainer.saved.append(folder))
        trainer.processing_class = None
        trainer.args.save_safetensors = True
        if should_save:  # sentence-transformers' own `_save` runs
            trainer._save(str(tmp_path / "a"))
            assert trainer.saved == [str(tmp_path / "a")] and (tmp_path / "a" / "training_args.bin").is_file()
        else:
            assert trainer._save(str(tmp_path / "b")) is None and trainer.saved == [] and not (tmp_path / "b").exists()
    assert trainer_class.__name__ == "Recording" and issubclass(trainer_class, SentenceTransformerTrainer)
