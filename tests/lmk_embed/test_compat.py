"""The shipped compat module: its reaches into transformers' internals refuse untested versions loudly,
naming the version, and undoing another package's takeover of transformers' model types changes only
the entries that package took over, deleting nothing."""

import importlib
import re

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


# ---- every foreign attribute the recurrent block steps read goes through the adapters ----------------

MODEL_FILES = ("modeling_recurrent.py", "modeling_rwkv7.py", "ssd.py")


def _reads_while(backbone, run, files: tuple[str, ...]) -> set[tuple[str, str]]:
    """(module path, attribute) pairs that code in `files` reads from `backbone`'s modules while `run()`
    runs (layer indices as `[0]`; reads by torch or by the library itself not counted, nor
    nn.Module's / PreTrainedModel's public API)."""
    import sys

    import torch
    from transformers import PreTrainedModel

    paths = {id(module): re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", name) for name, module in backbone.named_modules()}
    reads, tracked = set(), {}

    def tracking_class(cls):
        def __getattribute__(self, name):
            caller = sys._getframe(1).f_code.co_filename
            if caller.endswith(files) and not (hasattr(torch.nn.Module, name) or hasattr(PreTrainedModel, name)):
                reads.add((paths[id(self)], name))
            return cls.__getattribute__(self, name)

        return tracked.setdefault(cls, type(cls.__name__, (cls,), {"__getattribute__": __getattribute__}))

    modules = list(backbone.modules())
    classes = [type(module) for module in modules]
    for module, cls in zip(modules, classes):
        module.__class__ = tracking_class(cls)
    try:
        run()
    finally:
        for module, cls in zip(modules, classes):
            module.__class__ = cls
    return reads


def _xlstm_embedder():
    from transformers import xLSTMConfig

    from lmk_embed import RecurrentEmbedModel
    from lmk_embed.configuration_recurrent import RecurrentEmbedConfig

    backbone = xLSTMConfig(vocab_size=64, hidden_size=32, num_heads=2, num_blocks=1, qk_dim_factor=1.0, chunk_size=8,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict(), block_size=8)).eval()


def _rwkv7_backbone():
    from tests.lmk_embed.test_rwkv7 import fla_rwkv7, randomize, tiny_rwkv7_config

    if fla_rwkv7 is None:
        pytest.skip("RWKV-7 needs the `rwkv7` extra (flash-linear-attention), which failed to import here")
    return randomize(fla_rwkv7.RWKV7Model(tiny_rwkv7_config(norm_first=True))).eval()


@pytest.fixture(scope="module")
def backbones(mamba2_checkpoint):
    """Per adapted model type: (backbone, a vertical block step through the model files)."""
    import torch

    from lmk_embed import RecurrentEmbedModel
    from lmk_embed.modeling_rwkv7 import rwkv7_block_step

    ids = torch.randint(3, 60, (2, 21))
    embedders = {"mamba2": RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).eval(), "xlstm": _xlstm_embedder()}
    steps = {name: (model.backbone, lambda m=model: m(ids, torch.ones_like(ids), schedule="vertical", block_size=8))
             for name, model in embedders.items()}
    try:
        rwkv7 = _rwkv7_backbone()
        steps["rwkv7"] = (rwkv7, lambda: rwkv7_block_step(rwkv7, ids, None))
    except pytest.skip.Exception:
        pass
    return steps


@pytest.mark.parametrize("model_type", sorted(compat.BACKBONE_ADAPTERS))
def test_the_model_files_read_no_attribute_of_a_backbone_module(model_type, backbones):
    """The layout rule, checked on a real block step: the model files read the backbone's modules only
    through compat's adapter, so a renamed attribute can only be missed there."""
    import torch

    if model_type not in backbones:
        pytest.skip("RWKV-7 needs the `rwkv7` extra (flash-linear-attention), which failed to import here")
    backbone, step = backbones[model_type]
    with torch.no_grad():
        assert not _reads_while(backbone, step, MODEL_FILES)
        adapter_reads = _reads_while(backbone, step, ("compat.py",))
    assert adapter_reads, "nothing recorded: the recorder is broken"


@pytest.mark.parametrize("model_type", sorted(compat.BACKBONE_ADAPTERS))
def test_each_attribute_an_adapter_reads_renamed_is_refused_naming_library_version_and_attribute(model_type, backbones):
    """Every attribute the adapter reads (recorded, not listed by hand), renamed on the first layer as
    a release that renamed it would, fails the load check with one message naming it."""
    if model_type not in backbones:
        pytest.skip("RWKV-7 needs the `rwkv7` extra (flash-linear-attention), which failed to import here")
    backbone, _ = backbones[model_type]
    library = {"rwkv7": "fla"}.get(model_type, "transformers")
    version = compat._library_version(library)
    reads = _reads_while(backbone, lambda: compat.check_backbone_internals(model_type, backbone), ("compat.py",))
    first = {}  # per attribute of any layer, its read on the first layer that has it (RWKV-7's `v_lora`: layer 1)
    for path, name in sorted(reads, key=lambda read: [int(i) for i in re.findall(r"\[(\d+)\]", read[0])]):
        first.setdefault((re.sub(r"\[\d+\]", "[i]", path), name), (path, name))
    first = set(first.values())
    assert len(first) >= {"mamba2": 25, "xlstm": 5, "rwkv7": 50}[model_type], sorted(first)
    modules = dict(backbone.named_modules())
    for path, name in sorted(first):
        module = modules[re.sub(r"\[(\d+)\]", r".\1", path)]
        value = getattr(module, name)
        delattr(module, name)  # as a release that renamed it: the value lives on under another name
        object.__setattr__(module, f"renamed_{name}", value)
        try:
            where = f"{path}.{name}" if path else name
            with pytest.raises(compat.MissingInternalError,
                               match=rf"reads `{re.escape(where)}` of {type(backbone).__name__}, which {library} "
                                     rf"{re.escape(version)} does not have"):
                compat.check_backbone_internals(model_type, backbone)
        finally:
            object.__delattr__(module, f"renamed_{name}")
            setattr(module, name, value)
    compat.check_backbone_internals(model_type, backbone)  # all restored


def test_a_gated_norm_storing_its_groups_under_another_name_fails_at_load(mamba2_checkpoint, monkeypatch):
    """The issue's case: transformers' `MambaRMSNormGated` with its `group_size` renamed loaded and
    encoded 0.14 off transformers' own forward (read as one group); now loading names it."""
    import transformers
    from transformers.models.mamba2 import modeling_mamba2

    from lmk_embed import RecurrentEmbedModel

    original = modeling_mamba2.MambaRMSNormGated.__init__

    def renamed(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.groups_of = self.__dict__.pop("group_size")

    monkeypatch.setattr(modeling_mamba2.MambaRMSNormGated, "__init__", renamed)
    with pytest.raises(compat.MissingInternalError,
                       match=rf"reads `layers\[0\]\.mixer\.norm\.group_size` of Mamba2Model, which transformers "
                             rf"{re.escape(transformers.__version__)} does not have"):
        RecurrentEmbedModel.from_pretrained(mamba2_checkpoint)
