"""The tooling's one door into other libraries' private internals, each behind a version guard.

Each function here reaches into something a library does not promise to keep, because no public
API does the job. It first checks the library's installed version against the range the reach was
tested with, and outside it fails at once with an error that names the installed version, rather
than computing something wrong. Everything else in the tooling uses public APIs. Its error is the
shipped code's `UntestedVersionError`.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from importlib.util import find_spec

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from lmk_embed.compat import TESTED_TRANSFORMERS, UntestedVersionError, tested_spec  # one error class, one range

# The versions each library's reach below was tested with.
TESTED = {
    "mteb": SpecifierSet(">=2,<3"),
    "datasets": SpecifierSet(">=4,<6"),  # the train / scale extras need datasets>=4; 5.2.0 is pinned
    "sentence_transformers": SpecifierSet(">=6,<7"),
    "transformers": SpecifierSet(tested_spec(TESTED_TRANSFORMERS)),  # the shipped code's range, written once there
}


def check_tested(module, purpose: str) -> None:
    """Raise `UntestedVersionError`, naming the installed version, unless `module.__version__` is in
    the tested range of its library (`TESTED`)."""
    name = module.__name__.split(".")[0]
    tested, installed = TESTED[name], str(getattr(module, "__version__", "unknown"))
    try:
        ok = tested.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise UntestedVersionError(
            f"{purpose} uses private {name} internals, tested with {name}{tested}; {name} {installed} is "
            f"installed. Install a tested version (pip install '{name}{tested}')."
        )


def mteb_retrieval_scores(run: dict, relevant: dict, k_values: list[int]) -> dict:
    """mteb's own retrieval scores of a ready-made `run` (query id -> {doc id: score}) against the
    qrels `relevant`: the dict `mteb.evaluate` reports for a retrieval task (pytrec_eval underneath).

    Private: mteb has no public entry point that scores a run it did not make (`mteb._evaluators`)."""
    import mteb

    check_tested(mteb, "Scoring a retrieval run with mteb's scorer")
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores, make_score_dict

    result = calculate_retrieval_scores(run, relevant, k_values)
    return make_score_dict(ndcg=result.ndcg, _map=result.map, recall=result.recall, precision=result.precision,
                           mrr=result.mrr, naucs=result.naucs, naucs_mrr=result.naucs_mrr, hit_rate=result.hit_rate,
                           task_scores={})


def single_writer_trainer(trainer_class):
    """`trainer_class` (sentence-transformers' trainer) with a `_save` that writes on the saving rank
    only. transformers 5 moved the "only the main process saves" check from `Trainer.save_model` into
    `Trainer._save`, which sentence-transformers 6 overrides without it: under DDP every rank wrote
    the same checkpoint folder at once, and one rank could read a torn tokenizer_config.json.

    Private: `_save` is the hook both libraries use, and there is no public one."""
    import sentence_transformers

    check_tested(sentence_transformers, "Saving training checkpoints from one rank only")

    class SingleWriterTrainer(trainer_class):
        def _save(self, output_dir=None, state_dict=None):
            if not self.args.should_save:
                return None
            return super()._save(output_dir, state_dict=state_dict)

    SingleWriterTrainer.__name__ = SingleWriterTrainer.__qualname__ = trainer_class.__name__
    return SingleWriterTrainer


def dataset_fingerprint(dataset) -> str:
    """The fingerprint `datasets` keeps for a dataset (`Dataset._fingerprint`): it changes whenever the
    data does, so a saved dataset need not be hashed byte by byte. Private: there is no public accessor."""
    import datasets

    check_tested(datasets, "Fingerprinting a saved dataset")
    return str(dataset._fingerprint)


def attention_implementation(model) -> str:
    """The attention implementation a transformers model runs now ("sdpa", "eager", ...), to restore
    after `set_attn_implementation`. Private: the setter is public, the getter (`config._attn_implementation`) is not."""
    import transformers

    check_tested(transformers, "Reading a model's attention implementation")
    return model.config._attn_implementation


def transformers_model(model):
    """The transformers model a SentenceTransformer's first module holds (sentence-transformers'
    `Transformer.auto_model`), or an `UntestedVersionError` naming the version and the attribute when
    that module holds none under that name."""
    import sentence_transformers

    check_tested(sentence_transformers, "Reading the transformers model of a SentenceTransformer")
    try:
        return model[0].auto_model
    except AttributeError:
        raise UntestedVersionError(
            f"The first module of this SentenceTransformer ({type(model[0]).__name__}) has no `auto_model` in "
            f"sentence-transformers {sentence_transformers.__version__}: give a model whose first module is "
            "sentence-transformers' Transformer, or update this code.") from None


__all__ = ["TESTED", "UntestedVersionError", "attention_implementation", "check_tested", "dataset_fingerprint",
           "mteb_retrieval_scores", "single_writer_trainer", "transformers_model"]


@contextmanager
def bitsandbytes_kept_out(keep_out: bool = True):
    """Inside, bitsandbytes is reported missing (a `None` in `sys.modules`, Python's own rule) unless it
    is imported already or `keep_out` is False (a run that asks for 4-bit weights).

    peft 0.21 imports bitsandbytes whenever it is installed: at `import peft` (`peft/helpers.py`), which
    transformers' trainer and sentence-transformers do, and when it wraps a layer in LoRA (its
    bitsandbytes dispatchers). bitsandbytes 0.50 then logs "Failed to load CPU gemm_4bit_forward from
    kernels-community" on a CPU with AVX512_BF16 and without the `kernels` package. On exit, peft's
    cached answers (`peft.import_utils.is_bnb_available`, `is_bnb_4bit_available`) are dropped, so that
    a later QLoRA run in the process finds bitsandbytes. Private: peft has no switch for it. No version
    guard: a peft without these caches has nothing to drop, and nothing is computed from them here."""
    if not keep_out or "bitsandbytes" in sys.modules:
        yield
        return
    sys.modules["bitsandbytes"] = None
    try:
        yield
    finally:
        del sys.modules["bitsandbytes"]
        import_utils = sys.modules.get("peft.import_utils")
        for name in ("is_bnb_available", "is_bnb_4bit_available"):
            cached = getattr(import_utils, name, None)
            if hasattr(cached, "cache_clear"):
                cached.cache_clear()


def import_peft_without_bitsandbytes() -> None:
    """Import peft with bitsandbytes kept out for that import only (`bitsandbytes_kept_out`): training
    calls this before sentence-transformers imports peft."""
    if "peft" not in sys.modules and find_spec("peft") is not None:
        with bitsandbytes_kept_out():
            import peft  # noqa: F401
