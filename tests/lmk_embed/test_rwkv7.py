"""RWKV-7 (flash-linear-attention's model) as a recurrent embedder, on CPU.

fla's forward is Triton kernels only (on CPU it fails with "0 active drivers"), so the embedder
runs RWKV-7 through our plain-torch path (`lmk_embed/modeling_rwkv7.py`). The reference here is
fla's own `RWKV7Model.forward` with each Triton kernel swapped for the torch reference fla ships
beside it (`token_shift_ref`, `torch_addcmul_rwkv7`, `k_update_ref`, `gate_output_correction_ref`,
`layer_norm_ref`, `group_norm_ref`, and `dplr_recurrence` for the WKV state).
"""

import sys

import pytest
import torch
import torch.nn.functional as F

from lmk_embed.configuration_recurrent import RecurrentEmbedConfig, register_external_backbone

try:  # through our registration, which undoes fla's takeover of transformers' mamba2 for the session
    register_external_backbone({"model_type": "rwkv7"})
    import fla.models.rwkv7 as fla_rwkv7
except ImportError as error:  # not installed, or installed without triton (fla imports it everywhere)
    fla_rwkv7, FLA_ERROR = None, f"{type(error).__name__}: {error.__cause__ or error}"

needs_fla = pytest.mark.skipif(
    fla_rwkv7 is None,
    reason=f"RWKV-7 needs the `rwkv7` extra (flash-linear-attention + triton); importing it failed: "
    f"{FLA_ERROR if fla_rwkv7 is None else ''}",
)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # fla warns on every RWKV-7 layer it builds

V = 8  # the vertical block size under test


def tiny_rwkv7_config(**overrides):
    settings = dict(
        hidden_size=32, head_dim=8, num_hidden_layers=3, vocab_size=600, intermediate_size=64,
        decay_low_rank_dim=8, gate_low_rank_dim=16, a_low_rank_dim=8, v_low_rank_dim=8,
        pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )
    settings.update(overrides)
    return fla_rwkv7.RWKV7Config(**settings)


def randomize(model, seed=0):
    """fla initialises o_proj, value and the LoRA inputs to zero: give every weight random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g) if name.endswith("weight") else 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) * (fan_in**-0.5 if p.dim() > 1 else 0.5))
    return model


@pytest.fixture
def fla_with_torch_kernels(monkeypatch):
    """fla's model code with its Triton kernels replaced by fla's own torch references."""
    import fla.layers.rwkv7 as layer_module
    import fla.models.rwkv7.modeling_rwkv7 as model_module
    from fla.modules import GroupNorm, LayerNorm
    from fla.modules.norm.layernorm import group_norm_ref, layer_norm_ref
    from fla.modules.token_shift import token_shift_ref
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_recurrence
    from fla.ops.rwkv7.fused_addcmul import torch_addcmul_rwkv7
    from fla.ops.rwkv7.fused_k_update import k_update_ref
    from fla.ops.rwkv7.gate_output_correction import gate_output_correction_ref

    def shift(x, cu_seqlens=None, output_cache=False, cache=None):
        assert cache is None and cu_seqlens is None  # one full forward from the start
        delta = token_shift_ref(x)
        return (delta, x[:, -1]) if output_cache else delta

    def dplr(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, **_):
        key_dim = r.shape[-1]  # the naive recurrence scales q by key_dim ** -0.5 itself: undo it
        q = r * scale * key_dim**0.5
        o, state = dplr_recurrence(*(t.transpose(1, 2) for t in (q, k, v, a, b, w)), initial_state=initial_state)
        return o.transpose(1, 2), state

    monkeypatch.setattr(layer_module, "token_shift", shift)
    monkeypatch.setattr(model_module, "token_shift", shift)
    monkeypatch.setattr(layer_module, "fused_addcmul_rwkv7", torch_addcmul_rwkv7)
    monkeypatch.setattr(layer_module, "fused_k_rwkv7", lambda k, a, ka, **_: k_update_ref(k, a, ka))
    monkeypatch.setattr(layer_module, "gate_output_correction", gate_output_correction_ref)
    monkeypatch.setattr(layer_module, "l2_norm", lambda x, eps=1e-6: x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps))
    monkeypatch.setattr(layer_module, "chunk_rwkv7", dplr)
    monkeypatch.setattr(layer_module, "fused_mul_recurrent_rwkv7",
                        lambda r, w, k, v, kk, a, scale=1.0, **kw: dplr(r, w, k, v, -kk, kk * a, scale, **kw))
    monkeypatch.setattr(LayerNorm, "forward", lambda self, x, residual=None, prenorm=False, residual_in_fp32=False:
                        layer_norm_ref(x, self.weight, self.bias, residual=residual, eps=self.eps, prenorm=prenorm))
    monkeypatch.setattr(GroupNorm, "forward", lambda self, x, residual=None, prenorm=False, residual_in_fp32=False:
                        group_norm_ref(x, self.weight, self.bias, self.num_groups, residual=residual, eps=self.eps,
                                       is_rms_norm=self.is_rms_norm, prenorm=prenorm))

    def reference_hidden(backbone, input_ids):
        for layer in backbone.layers:
            monkeypatch.setattr(layer.ffn, "act_fn", lambda x: F.relu(x) ** 2)
        with torch.no_grad():
            return backbone(input_ids=input_ids, use_cache=False).last_hidden_state

    return reference_hidden


@needs_fla
def test_fla_forward_needs_a_gpu_here():
    """Why the plain-torch path exists: fla's own forward does not run on this CPU."""
    model = fla_rwkv7.RWKV7Model(tiny_rwkv7_config()).eval()
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: fla's Triton forward may run")
    with pytest.raises(Exception, match="active drivers|[Tt]riton|CUDA|cuda"):
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3]]))


@needs_fla
def test_wkv7_recurrence_equals_fla_naive_dplr():
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_recurrence

    from lmk_embed.modeling_rwkv7 import wkv7_recurrence

    g = torch.Generator().manual_seed(1)
    B, T, H, K, Vd = 2, 11, 3, 8, 5
    r, k = torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, K, generator=g)
    v = torch.randn(B, T, H, Vd, generator=g)
    w = -0.6 * torch.rand(B, T, H, K, generator=g)
    kk = F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    a, b = -kk, kk * torch.rand(B, T, H, K, generator=g)
    state = torch.randn(B, H, K, Vd, generator=g)
    ours, ours_state = wkv7_recurrence(r, w, k, v, a, b, state)
    q = r * K**0.5  # dplr_recurrence scales q by K ** -0.5
    theirs, theirs_state = dplr_recurrence(*(t.transpose(1, 2) for t in (q, k, v, a, b, w)), initial_state=state)
    assert (ours - theirs.transpose(1, 2)).abs().max() <= 1e-5
    assert (ours_state - theirs_state).abs().max() <= 1e-5
    # Split in two with the state carried: the same outputs.
    first, carried = wkv7_recurrence(*(t[:, :4] for t in (r, w, k, v, a, b)), state)
    second, _ = wkv7_recurrence(*(t[:, 4:] for t in (r, w, k, v, a, b)), carried)
    assert (torch.cat([first, second], 1) - ours).abs().max() <= 1e-5


@needs_fla
@pytest.mark.parametrize("fuse_norm", [True, False])
def test_plain_torch_forward_equals_fla_with_its_torch_references(fla_with_torch_kernels, fuse_norm):
    from lmk_embed.modeling_rwkv7 import rwkv7_block_step

    backbone = randomize(fla_rwkv7.RWKV7Model(tiny_rwkv7_config(fuse_norm=fuse_norm))).eval()
    input_ids = torch.randint(1, 600, (2, 21), generator=torch.Generator().manual_seed(2))
    expected = fla_with_torch_kernels(backbone, input_ids)
    with torch.no_grad():
        ours, _ = rwkv7_block_step(backbone, input_ids, None)
    assert expected.std() > 0.5  # a live model, not one of fla's zero-initialised ones
    assert (ours - expected).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def rwkv7_source(tmp_path_factory, bpe_tokenizer_dir):
    """A tiny random RWKV-7 causal LM (fla's classes) with the BPE tokenizer: (folder, its base model's weights)."""
    from transformers import AutoTokenizer

    source = tmp_path_factory.mktemp("rwkv7-lm")
    lm = fla_rwkv7.RWKV7ForCausalLM(tiny_rwkv7_config())
    randomize(lm.model)
    lm.save_pretrained(source)
    AutoTokenizer.from_pretrained(bpe_tokenizer_dir).save_pretrained(source)
    return source, {k: v.clone() for k, v in lm.model.state_dict().items()}


@pytest.fixture(scope="module")
def rwkv7_checkpoint(tmp_path_factory, rwkv7_source):
    from lmk_embed_tools.training.convert import convert_to_recurrent

    return convert_to_recurrent(rwkv7_source[0], tmp_path_factory.mktemp("rwkv7-emb"), block_size=V)


@pytest.fixture(scope="module")
def rwkv7_model(rwkv7_checkpoint):
    from lmk_embed import RecurrentEmbedModel

    return RecurrentEmbedModel.from_pretrained(rwkv7_checkpoint).eval()


@needs_fla
def test_checkpoint_holds_the_source_weights(rwkv7_source, rwkv7_model):
    weights = rwkv7_model.backbone.state_dict()
    assert weights.keys() == rwkv7_source[1].keys()
    assert all(torch.equal(weights[k], v) for k, v in rwkv7_source[1].items())


@needs_fla
@pytest.mark.parametrize("length", [1, V - 1, V, V + 1, 3 * V + 17])
def test_vertical_equals_horizontal_and_fla(rwkv7_model, fla_with_torch_kernels, length):
    input_ids = torch.randint(1, 600, (1, length), generator=torch.Generator().manual_seed(length))
    input_ids[0, -1] = rwkv7_model.tokenizer.eos_id
    with torch.no_grad():
        vertical = rwkv7_model(input_ids, schedule="vertical", block_size=V).embeddings
        horizontal = rwkv7_model(input_ids, schedule="horizontal").embeddings
    expected = fla_with_torch_kernels(rwkv7_model.backbone, input_ids)[:, -1]
    assert (vertical - horizontal).abs().max() <= 1e-4
    assert (vertical - expected).abs().max() <= 1e-4


@needs_fla
def test_mixed_batch_streaming_and_encode(rwkv7_model):
    """Rows that finish early leave the batch; streaming in pieces equals the whole text."""
    texts = ["short", "The json module exposes an API familiar to users of marshal and pickle. " * 3, "x" * 40]
    batch = rwkv7_model.encode(texts, normalize=False, schedule="vertical", convert_to_tensor=True)
    one_by_one = torch.stack([rwkv7_model.encode(t, normalize=False, schedule="vertical", convert_to_tensor=True)
                              for t in texts])
    assert (batch - one_by_one).abs().max() <= 1e-4
    pieces = [texts[1][i : i + 7] for i in range(0, len(texts[1]), 7)]
    streamed = rwkv7_model.encode_stream(pieces, normalize=False, convert_to_tensor=True, block_size=V)
    assert (streamed - one_by_one[1]).abs().max() <= 1e-4


@needs_fla
def test_lora_adapter_changes_the_plain_torch_forward(rwkv7_model):
    """peft's LoRA layers wrap fla's Linear modules, and our path calls those modules, so adapters apply."""
    import copy

    from peft import LoraConfig, get_peft_model

    model = copy.deepcopy(rwkv7_model)
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["r_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False))
    ids = torch.tensor([[5, 6, 7, rwkv7_model.tokenizer.eos_id]])
    with torch.no_grad():
        before = rwkv7_model(ids).embeddings
        after = peft_model(input_ids=ids).embeddings
    assert (before - after).abs().max() > 1e-3


def test_missing_fla_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla.models.rwkv7", None)  # as if flash-linear-attention were absent
    with pytest.raises(ImportError, match=r"lmk-embed\[rwkv7\]"):
        RecurrentEmbedConfig(backbone_config={"model_type": "rwkv7", "hidden_size": 32})


@needs_fla
def test_sentence_transformers_and_automodel_agree(rwkv7_checkpoint):
    """The checkpoint's shipped code (modeling_rwkv7.py included) loads through both front doors."""
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    texts = ["How do I parse JSON?", "The json module exposes an API familiar to users of marshal. " * 2]
    auto = AutoModel.from_pretrained(str(rwkv7_checkpoint), trust_remote_code=True)
    st = SentenceTransformer(str(rwkv7_checkpoint), trust_remote_code=True, device="cpu")
    a, b = auto.encode(texts), st.encode(texts)
    assert a.shape == (2, 32) and np.abs(a - b).max() <= 1e-5


@needs_fla
def test_fla_does_not_take_over_transformers_mamba2(tmp_path):
    """fla registers its own Triton-only `mamba2`; after loading RWKV-7, Mamba2 is transformers' again."""
    from transformers import AutoConfig, Mamba2Config
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from tests.helpers import tiny_mamba2_config

    import fla.models.mamba2

    AutoConfig.register("mamba2", fla.models.mamba2.Mamba2Config, exist_ok=True)  # as importing fla does
    assert CONFIG_MAPPING["mamba2"] is not Mamba2Config
    RecurrentEmbedConfig(backbone_config=tiny_rwkv7_config().to_dict())
    assert CONFIG_MAPPING["mamba2"] is Mamba2Config
    config = RecurrentEmbedConfig(backbone_config=tiny_mamba2_config().to_dict())
    assert type(config.backbone_config) is Mamba2Config


FLA_THEN_MAMBA2 = r"""
import json, sys
from transformers import CONFIG_MAPPING, AutoModel

rwkv7 = AutoModel.from_pretrained({rwkv7!r}, trust_remote_code=True)  # this process's first import of fla
fla_imported = "fla.models.mamba2" in sys.modules  # which registers fla's own, Triton-only `mamba2`
mamba2 = AutoModel.from_pretrained({mamba2!r}, trust_remote_code=True)
print(json.dumps({{
    "fla_imported": fla_imported,
    "modules": [type(m).__module__.split(".")[0] for m in (rwkv7, mamba2)],
    "rwkv7_backbone": type(rwkv7.backbone).__module__,
    "mamba2_backbone": type(mamba2.backbone).__module__,
    "mamba2_config": type(mamba2.config.backbone_config).__module__,
    "registry": {{name: CONFIG_MAPPING[name].__module__ for name in ("mamba2", "mamba", "bitnet", "rwkv7", "gla")}},
    "shape": list(mamba2.encode("hello world").shape),
}}))
"""


@needs_fla
def test_a_mamba2_checkpoint_loaded_after_an_rwkv7_one_is_transformers_mamba2(rwkv7_checkpoint, mamba2_checkpoint, tmp_path):
    """As a user would: one clean process loads an RWKV-7 checkpoint (importing fla takes over `mamba2`),
    then a Mamba2 one, both through their shipped code. The Mamba2 backbone is transformers' own (fla's
    would need Triton), and fla keeps its own model types: only what it took over is pointed back."""
    from tests.helpers import run_fresh_python

    report = run_fresh_python(FLA_THEN_MAMBA2.format(rwkv7=str(rwkv7_checkpoint), mamba2=str(mamba2_checkpoint)),
                              cwd=tmp_path, env_extra={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert report["fla_imported"] and report["modules"] == ["transformers_modules"] * 2
    assert report["rwkv7_backbone"].startswith("fla.models.rwkv7")
    assert report["mamba2_backbone"] == "transformers.models.mamba2.modeling_mamba2"
    assert report["mamba2_config"] == "transformers.models.mamba2.configuration_mamba2"
    assert report["registry"]["mamba2"] == "transformers.models.mamba2.configuration_mamba2"
    assert report["registry"]["mamba"].startswith("transformers.") and report["registry"]["bitnet"].startswith("transformers.")
    assert report["registry"]["rwkv7"].startswith("fla.") and report["registry"]["gla"].startswith("fla.")
    assert report["shape"] == [64]
