"""mamba_ssm-layout Mamba2 (the state-spaces/mamba2-* releases) -> our recurrent checkpoint.

The synthetic checkpoints below are laid out exactly as mamba_ssm saves them (MambaConfig fields in
config.json, `backbone.*` weights, a padded vocabulary, `lm_head.weight` sharing the embedding when
tied). The reference forward is written here from mamba_ssm's equations, one token at a time, in
float64, and shares no code with the converter or with transformers.
"""

import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from lmk_embed_tools import cli
from lmk_embed_tools.training.convert import ConversionError, convert_to_recurrent

# mamba_ssm's Mamba2 defaults, restated from its module so that the test does not read ours.
SSM_DEFAULTS = dict(d_state=128, d_conv=4, expand=2, headdim=64, d_ssm=None, ngroups=1, bias=False, conv_bias=True,
                    dt_limit=(0.0, math.inf))
EPS = 1e-5

# "release": only {"layer": "Mamba2"}, as the state-spaces configs give it (so mamba_ssm's defaults
# apply), tied embeddings, pytorch_model.bin. "custom": everything away from the defaults, safetensors.
VARIANTS = {
    "release": dict(
        config=dict(d_model=32, n_layer=2, vocab_size=600, ssm_cfg={"layer": "Mamba2"}, rms_norm=True,
                    residual_in_fp32=True, fused_add_norm=True, pad_vocab_size_multiple=16, tie_embeddings=True,
                    d_intermediate=0, attn_layer_idx=[], attn_cfg={}),
        weights="pytorch_model.bin",
    ),
    "custom": dict(
        config=dict(d_model=32, n_layer=3, vocab_size=600, pad_vocab_size_multiple=48, tie_embeddings=False,
                    residual_in_fp32=False,
                    ssm_cfg={"layer": "Mamba2", "d_state": 16, "d_conv": 3, "expand": 3, "headdim": 12, "d_ssm": 96,
                             "ngroups": 2, "chunk_size": 16, "bias": True, "conv_bias": False,
                             "dt_limit": [0.02, 0.3], "dt_min": 0.01, "A_init_range": [1, 8]}),
        weights="model.safetensors",
    ),
}


def ssm_settings(config: dict) -> dict:
    ssm = {**SSM_DEFAULTS, **{k: v for k, v in config["ssm_cfg"].items() if k in SSM_DEFAULTS}}
    d_inner = ssm["expand"] * config["d_model"]
    ssm["d_ssm"] = ssm["d_ssm"] or d_inner
    ssm["nheads"] = ssm["d_ssm"] // ssm["headdim"]
    ssm["vocab"] = config["vocab_size"] + (-config["vocab_size"]) % config.get("pad_vocab_size_multiple", 8)
    return ssm


def random_mamba_ssm_weights(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under mamba_ssm's names and shapes (in_proj rows ordered [z, x, B, C, dt])."""
    g = torch.Generator().manual_seed(seed)
    s, d = ssm_settings(config), config["d_model"]
    gn, h = s["ngroups"] * s["d_state"], s["nheads"]
    conv_dim = s["d_ssm"] + 2 * gn

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    weights = {"backbone.embedding.weight": randn(s["vocab"], d), "backbone.norm_f.weight": 1 + randn(d, scale=0.1)}
    for i in range(config["n_layer"]):
        p = f"backbone.layers.{i}."
        dt = torch.exp(torch.rand(h, generator=g) * (math.log(0.5) - math.log(0.01)) + math.log(0.01))
        weights.update({
            p + "norm.weight": 1 + randn(d, scale=0.1),
            p + "mixer.in_proj.weight": randn(2 * s["d_ssm"] + 2 * gn + h, d, scale=d**-0.5),
            p + "mixer.conv1d.weight": randn(conv_dim, 1, s["d_conv"], scale=0.5),
            p + "mixer.dt_bias": dt + torch.log(-torch.expm1(-dt)),  # inverse softplus, as mamba_ssm initialises
            p + "mixer.A_log": torch.log(torch.rand(h, generator=g) * 15 + 1),
            p + "mixer.D": 1 + randn(h, scale=0.1),
            p + "mixer.norm.weight": 1 + randn(s["d_ssm"], scale=0.1),
            p + "mixer.out_proj.weight": randn(d, s["d_ssm"], scale=s["d_ssm"] ** -0.5),
        })
        if s["conv_bias"]:
            weights[p + "mixer.conv1d.bias"] = randn(conv_dim, scale=0.1)
        if s["bias"]:
            weights[p + "mixer.in_proj.bias"] = randn(2 * s["d_ssm"] + 2 * gn + h, scale=0.1)
            weights[p + "mixer.out_proj.bias"] = randn(d, scale=0.1)
    # Tied: mamba_ssm's state_dict names the embedding twice; torch.save stores one shared tensor.
    weights["lm_head.weight"] = (
        weights["backbone.embedding.weight"] if config.get("tie_embeddings", True) else randn(s["vocab"], d)
    )
    return weights


def write_mamba_ssm_folder(folder, config, weights, weights_file, tokenizer_dir=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if weights_file.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / weights_file))
    else:
        torch.save(weights, folder / weights_file)
    if tokenizer_dir is not None:
        for path in tokenizer_dir.iterdir():
            shutil.copy(path, folder / path.name)
    return folder


# ---- the reference: mamba_ssm's equations, per token, float64 ----------------------------------


def rms_norm(x, weight, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def reference_mixer(u, w, s):
    """u [T, d] -> [T, d]: in_proj -> [z, xBC, dt]; causal depthwise conv + SiLU on xBC; the SSD
    recurrence per token; gated RMSNorm (gate first, per group); out_proj."""
    T = u.shape[0]
    gn, h, p, n, g = s["ngroups"] * s["d_state"], s["nheads"], s["headdim"], s["d_state"], s["ngroups"]
    zxbcdt = u @ w["in_proj.weight"].T + (w["in_proj.bias"] if s["bias"] else 0)
    z, xBC, dt = zxbcdt.split([s["d_ssm"], s["d_ssm"] + 2 * gn, h], dim=-1)
    k = s["d_conv"]
    kernel = w["conv1d.weight"][:, 0]  # [channels, k]; kernel[:, -1] multiplies the current token
    conv = torch.zeros_like(xBC)
    for t in range(T):
        for j in range(k):
            if t - (k - 1) + j >= 0:
                conv[t] += kernel[:, j] * xBC[t - (k - 1) + j]
    if s["conv_bias"]:
        conv = conv + w["conv1d.bias"]
    x, B, C = F.silu(conv).split([s["d_ssm"], gn, gn], dim=-1)
    dt = F.softplus(dt + w["dt_bias"]).clamp(*s["dt_limit"])
    A = -torch.exp(w["A_log"])
    state = torch.zeros(h, p, n, dtype=u.dtype)
    ys = []
    for t in range(T):
        x_t = x[t].view(h, p)
        B_t = B[t].view(g, n).repeat_interleave(h // g, dim=0)  # head i reads group i // (h / g)
        C_t = C[t].view(g, n).repeat_interleave(h // g, dim=0)
        state = torch.exp(dt[t] * A)[:, None, None] * state + dt[t][:, None, None] * x_t[:, :, None] * B_t[:, None, :]
        ys.append((state @ C_t[:, :, None])[..., 0] + w["D"][:, None] * x_t)
    y = torch.stack(ys).reshape(T, s["d_ssm"]) * F.silu(z)
    y = rms_norm(y.view(T, g, -1), w["norm.weight"].view(g, -1)).reshape(T, s["d_ssm"])
    return y @ w["out_proj.weight"].T + (w["out_proj.bias"] if s["bias"] else 0)


def reference_forward(config, weights, ids):
    """ids [T] -> final hidden states [T, d]: pre-norm residual blocks, then norm_f (mamba_ssm's MixerModel)."""
    s = ssm_settings(config)
    w64 = {k: v.double() for k, v in weights.items()}
    hidden = w64["backbone.embedding.weight"][ids]
    for i in range(config["n_layer"]):
        layer = {k.split(".mixer.")[1]: v for k, v in w64.items() if k.startswith(f"backbone.layers.{i}.mixer.")}
        hidden = hidden + reference_mixer(rms_norm(hidden, w64[f"backbone.layers.{i}.norm.weight"]), layer, s)
    return rms_norm(hidden, w64["backbone.norm_f.weight"])


# ---- tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def converted(request, tmp_path_factory, bpe_tokenizer_dir):
    """(variant, its mamba_ssm weights, the converted checkpoint folder)."""
    variant = VARIANTS[request.param]
    weights = random_mamba_ssm_weights(variant["config"])
    root = tmp_path_factory.mktemp(f"mamba-ssm-{request.param}")
    if request.param == "release":  # tokenizer files beside the weights
        source = write_mamba_ssm_folder(root / "src", variant["config"], weights, variant["weights"], bpe_tokenizer_dir)
        out = convert_to_recurrent(source, root / "out", block_size=7, ssd_chunk_size=4)
    else:  # no tokenizer in the folder: given separately, as for a real release
        source = write_mamba_ssm_folder(root / "src", variant["config"], weights, variant["weights"])
        out = convert_to_recurrent(source, root / "out", block_size=7, ssd_chunk_size=4, tokenizer=bpe_tokenizer_dir)
    return variant, weights, out


TEXT = "The json module exposes an API familiar to users of marshal and pickle."


def test_converted_mamba2_equals_the_mamba_ssm_equations(converted):
    """transformers' Mamba2Model holding the converted weights = the reference, every position, <= 1e-5."""
    from lmk_embed import RecurrentEmbedModel

    variant, weights, checkpoint = converted
    model = RecurrentEmbedModel.from_pretrained(checkpoint).eval()
    config = model.config.backbone_config
    s = ssm_settings(variant["config"])
    assert (config.vocab_size, config.n_groups, config.head_dim, config.num_heads) == (
        s["vocab"], s["ngroups"], s["headdim"], s["nheads"]
    )
    assert config.vocab_size > variant["config"]["vocab_size"]  # the padded rows came along
    ids = model.tokenizer.build_batch([TEXT]).tensors()["input_ids"]
    assert ids.shape[1] > 2 * 7  # several vertical blocks of V=7
    expected = reference_forward(variant["config"], weights, ids[0])
    with torch.inference_mode():
        hidden = model.backbone(input_ids=ids).last_hidden_state[0]
        horizontal = model.encode(TEXT, normalize=False, schedule="horizontal", convert_to_tensor=True)
        vertical = model.encode(TEXT, normalize=False, schedule="vertical", convert_to_tensor=True)
    assert expected.abs().max() > 0.5 and expected[1:].std(0).mean() > 0.1  # not a degenerate model
    assert (hidden.double() - expected).abs().max() <= 1e-5
    # The embedding is the final state at the appended EOS, through either schedule.
    assert ids[0, -1] == model.tokenizer.eos_id
    assert (horizontal.double() - expected[-1]).abs().max() <= 1e-5
    assert (vertical.double() - expected[-1]).abs().max() <= 1e-5


def test_no_lm_head_and_no_pickle_in_the_checkpoint(converted):
    from safetensors import safe_open

    _, _, checkpoint = converted
    assert not list(checkpoint.glob("*.bin"))
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert "backbone.embeddings.weight" in keys and not [k for k in keys if "lm_head" in k]


def test_cli_converts_a_mamba_ssm_folder_and_the_checkpoint_keeps_the_contract(tmp_path, bpe_tokenizer_dir, capsys):
    from tests.lmk_embed.test_packaging import check_contract

    variant = VARIANTS["release"]
    source = write_mamba_ssm_folder(
        tmp_path / "src", variant["config"], random_mamba_ssm_weights(variant["config"]), variant["weights"]
    )
    out = tmp_path / "out"
    assert cli.main(["convert-recurrent", str(source), str(out), "--tokenizer", str(bpe_tokenizer_dir)]) == 0
    reports = check_contract(out, tmp_path, ["in_proj"])
    assert reports["folder"]["auto_class"] == "RecurrentEmbedModel"


def _broken(config_change=None, ssm_change=None):
    config = json.loads(json.dumps(VARIANTS["release"]["config"]))
    config.update(config_change or {})
    config["ssm_cfg"].update(ssm_change or {})
    return config


@pytest.mark.parametrize(
    "config, named",
    [
        (_broken({"attn_layer_idx": [1]}), "attn_layer_idx"),
        (_broken({"ssm_cfg": {}}), "ssm_cfg.layer"),  # mamba_ssm's default layer is Mamba1
        (_broken(ssm_change={"layer": "Mamba1"}), "'Mamba1'"),
        (_broken(ssm_change={"d_ssm": 32}), "d_ssm"),  # the rest would be a gated MLP in the mixer
        (_broken(ssm_change={"norm_before_gate": True}), "norm_before_gate"),
        (_broken({"d_intermediate": 64}), "d_intermediate"),
        (_broken({"rms_norm": False}), "rms_norm"),
        (_broken(ssm_change={"new_knob": 1}), "new_knob"),
    ],
)
def test_unsupported_configs_are_refused_by_name(tmp_path, bpe_tokenizer_dir, config, named):
    source = write_mamba_ssm_folder(tmp_path / "src", config, {}, "pytorch_model.bin", bpe_tokenizer_dir)
    with pytest.raises(ConversionError, match="config.json") as error:
        convert_to_recurrent(source, tmp_path / "out")
    assert named in str(error.value)


def test_missing_tokenizer_names_the_release_tokenizer_in_one_cli_line(tmp_path, capsys):
    config = VARIANTS["release"]["config"]
    source = write_mamba_ssm_folder(tmp_path / "src", config, random_mamba_ssm_weights(config), "pytorch_model.bin")
    assert cli.main(["convert-recurrent", str(source), str(tmp_path / "out")]) == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1
    assert "EleutherAI/gpt-neox-20b" in message and "--tokenizer" in message


def test_weights_that_do_not_match_name_the_file_and_key(tmp_path, bpe_tokenizer_dir):
    config = VARIANTS["release"]["config"]
    weights = random_mamba_ssm_weights(config)
    weights["backbone.layers.1.mixer.D"] = torch.ones(3)
    source = write_mamba_ssm_folder(tmp_path / "src", config, weights, "pytorch_model.bin", bpe_tokenizer_dir)
    with pytest.raises(ConversionError, match=r"pytorch_model\.bin.*backbone\.layers\.1\.mixer\.D"):
        convert_to_recurrent(source, tmp_path / "out")


class _Payload:
    """Unpickling this would run `_Payload.__reduce__`'s call: weights_only must refuse it first."""

    def __reduce__(self):
        return (print, ("unpickled",))


def test_pickles_are_read_as_tensors_only(tmp_path, bpe_tokenizer_dir, capsys):
    config = VARIANTS["release"]["config"]
    weights = {**random_mamba_ssm_weights(config), "extra": _Payload()}
    source = write_mamba_ssm_folder(tmp_path / "src", config, weights, "pytorch_model.bin", bpe_tokenizer_dir)
    with pytest.raises(ConversionError, match=r"pytorch_model\.bin: cannot be read as plain tensors") as caught:
        convert_to_recurrent(source, tmp_path / "out")
    assert "unpickled" not in capsys.readouterr().out
    message = str(caught.value)
    assert "weights_only=False" not in message and "\n" not in message and "safetensors" in message
