"""The shipped compat module: its reaches into transformers' internals refuse untested versions loudly,
naming the version, and undoing another package's takeover of transformers' model types changes only
the entries that package took over, deleting nothing."""

import importlib

import pytest
from transformers import CONFIG_MAPPING, AutoConfig, Mamba2Config, PretrainedConfig

from lmk_embed import compat


@pytest.mark.parametrize("version", ["5.24.0", "5.22.1", "6.0.0", "5.24.0.dev0"])
def test_restoring_model_types_refuses_an_untested_transformers(monkeypatch, version):
    # The module compat imports now (transformers' lazy module can be replaced in sys.modules).
    monkeypatch.setattr(importlib.import_module("transformers"), "__version__", version)
    with pytest.raises(compat.UntestedVersionError, match=rf"transformers {version} is installed.*transformers>=5\.23,<5\.24"):
        compat.restore_transformers_model_types("fla")


@pytest.mark.parametrize("version, ok", [("5.23.0", True), ("5.23.9rc1", True), ("5.24", False), ("4.57.1", False),
                                         ("not-a-version", False)])
def test_require_tested_range(version, ok):
    if ok:
        compat.require_tested("transformers", version, compat.TESTED_TRANSFORMERS, "A reach")
    else:
        with pytest.raises(compat.UntestedVersionError, match=f"transformers|{version}"):
            compat.require_tested("transformers", version, compat.TESTED_TRANSFORMERS, "A reach")


def test_only_the_taken_over_types_point_back_at_transformers_and_nothing_is_deleted():
    foreign = type("Mamba2Config", (PretrainedConfig,), {"model_type": "mamba2", "__module__": "someone_else.models"})
    registered_before = set(CONFIG_MAPPING._extra_content)
    AutoConfig.register("mamba2", foreign, exist_ok=True)  # as importing fla does with its own Mamba2
    try:
        assert CONFIG_MAPPING["mamba2"] is foreign
        assert compat.restore_transformers_model_types("fla") == []  # another package's registration: left alone
        assert CONFIG_MAPPING["mamba2"] is foreign
        assert compat.restore_transformers_model_types("someone_else") == ["mamba2"]
        assert CONFIG_MAPPING["mamba2"] is Mamba2Config
        assert type(AutoConfig.for_model("mamba2")) is Mamba2Config
        assert registered_before <= set(CONFIG_MAPPING._extra_content)  # nothing deleted
        assert CONFIG_MAPPING["lmk_embedder"].__module__ == "lmk_embed.configuration_lmk"  # ours untouched
    finally:
        CONFIG_MAPPING.register("mamba2", Mamba2Config, exist_ok=True)


def test_the_content_backend_copy_is_kept_beside_the_tokenizer_not_in_it(minilm_path):
    """The private backend copy lives in a weak map keyed by the tokenizer: nothing is written into the
    tokenizer object, the user's backend keeps its settings, and the copy goes with its tokenizer."""
    import gc

    from transformers import AutoTokenizer

    from lmk_embed import encoding

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    attributes = dict(vars(tokenizer))
    backend = encoding.content_backend(tokenizer)
    assert encoding.content_backend(tokenizer) is backend and vars(tokenizer) == attributes
    assert backend.truncation is None and tokenizer.backend_tokenizer.truncation is not None  # MiniLM's 128 stays
    tokenizer.add_tokens(["zzqx-new-token"])
    assert encoding.content_backend(tokenizer) is not backend  # a new vocabulary, a new copy
    entries = len(encoding._CONTENT_BACKENDS)
    del tokenizer
    gc.collect()
    assert len(encoding._CONTENT_BACKENDS) == entries - 1


def test_the_recurrent_backbones_have_every_internal_their_block_steps_read(mamba2_checkpoint):
    from transformers import xLSTMConfig, xLSTMModel

    from lmk_embed import RecurrentEmbedModel

    model = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint)  # checks its Mamba2 on load
    compat.check_backbone_internals("mamba2", model.backbone)
    xlstm = xLSTMModel(xLSTMConfig(vocab_size=64, hidden_size=32, embedding_dim=32, num_heads=2, num_blocks=1,
                                   qk_dim_factor=1.0))
    compat.check_backbone_internals("xlstm", xlstm)
    assert compat.cache_keyword(xlstm.forward) in ("cache_params", "cache")


def test_a_missing_internal_fails_at_load_naming_library_version_and_attribute(mamba2_checkpoint, monkeypatch):
    import transformers
    from transformers.models.mamba2 import modeling_mamba2

    from lmk_embed import RecurrentEmbedModel

    original = modeling_mamba2.Mamba2Mixer.__init__

    def without_limit(self, *args, **kwargs):  # a release that renamed `time_step_limit`
        original(self, *args, **kwargs)
        del self.time_step_limit

    monkeypatch.setattr(modeling_mamba2.Mamba2Mixer, "__init__", without_limit)
    with pytest.raises(compat.MissingInternalError,
                       match=rf"reads `layers\[0\]\.mixer\.time_step_limit` of Mamba2Model, which transformers "
                             rf"{transformers.__version__} does not have"):
        RecurrentEmbedModel.from_pretrained(mamba2_checkpoint)
