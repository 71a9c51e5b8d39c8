"""Conversion: backbones into checkpoints that satisfy the checkpoint contract.

A checkpoint folder holds config.json (with `auto_map`), model.safetensors, the tokenizer files,
its family's shipped .py files (`lmk_embed.shipped_files(family)`, copied from `lmk_embed/`, so
they are never stale), and the sentence-transformers files: modules.json,
config_sentence_transformers.json and the `st_module.EmbedderModule` config. The model's own
`save_pretrained` (`lmk_embed.checkpoint.write_checkpoint_files`) writes all of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def check_output_folder(output_dir: str | Path) -> None:
    """A converter writes into a new or empty folder, or over one of our own checkpoints (a conversion
    done again); a folder holding other files is refused rather than mixed with a checkpoint."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return
    names = sorted(path.name for path in folder.iterdir())
    if not names:
        return
    config = folder / "config.json"
    model_type = None
    if config.is_file():
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except (ValueError, AttributeError):
            model_type = None
    if model_type not in CONVERTED_MODEL_TYPES:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise ConversionError(f"`output_dir` {str(output_dir)!r} is not empty ({shown}) and holds no lmk-embed "
                              "checkpoint: give a new or empty folder.")


def save_checkpoint(model, tokenizer, folder: str | Path) -> Path:
    """Write `model` + `tokenizer` as a complete checkpoint folder (see the module docstring): the
    model's own `save_pretrained` writes all of it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.tokenizer = tokenizer
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def load_source_backbone(source: str | Path, **kwargs):
    """The base model (any task head dropped) of a local folder or a Hub id. Pickled weights are not
    read (unpickling runs code): a folder that holds only those is refused, naming the fix."""
    from transformers import AutoModel

    folder = Path(source)
    if folder.is_dir() and not any(folder.glob("*.safetensors")):
        pickled = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        if pickled:
            raise ConversionError(f"`source` {str(source)!r} holds only pickled weights ({', '.join(pickled)}); "
                                  "conversion reads safetensors only: save the model with `save_pretrained(..., "
                                  "safe_serialization=True)` where you trust the file, then convert that folder.")
    from lmk_embed_tools import quiet_model_loading

    with quiet_model_loading():  # the task head is dropped on purpose: its "unexpected keys" report is noise
        return AutoModel.from_pretrained(str(source), **kwargs)


def hub_id_or_none(source: str | Path) -> str | None:
    """`source` if it names a Hub repository rather than a local folder."""
    return None if Path(source).exists() else str(source)


def backbone_config_dict(backbone) -> dict:
    """The backbone's config as a dict, without the local path it was loaded from."""
    config = backbone.config.to_dict()
    config.pop("_name_or_path", None)
    return config


def copy_backbone_weights(target: torch.nn.Module, state: dict, ignore_prefixes=("pooler.",)) -> None:
    """Load the backbone weights `state` (a state dict) into `target`, failing loudly on any missing weight."""
    expected = target.state_dict()
    # Key sets compared here: some backbones (fla's RWKV-7) override load_state_dict and return nothing.
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(key for key in state.keys() - expected.keys() if not key.startswith(ignore_prefixes))
    if missing or unexpected:
        raise ValueError(f"Backbone weights do not match: missing={missing}, unexpected={unexpected}.")
    target.load_state_dict(state, strict=False)


def convert_to_lmk(
    source: str | Path,
    output_dir: str | Path,
    *,
    pooling: str | None = None,
    granularity: int | None = None,
    splitter: str | None = None,
    granularities=None,
    normalize: bool | None = None,
    landmark_token: str | None = None,
    max_length: int | None = None,
    seed: int | None = None,
    base_model: str | None = None,
    max_positions: int | None = None,
    position_extension: str | None = None,
    long_input: str | None = None,
    window_length: int | None = None,
) -> Path:
    """Turn an encoder checkpoint (local folder, or a Hub id where the Hub is reachable) into an LMK checkpoint.

    Options left None take `LMKConfig`'s defaults (the one place they are written). `base_model` is the
    Hub id recorded for model cards; by default `source` when it is not a local folder. `max_positions`
    N extends the backbone past its positions with `position_extension` (see `plan_position_extension`);
    inputs that fit the original positions keep the base's vectors.
    """
    from lmk_embed.configuration_lmk import LMKConfig, check_lmk_max_length
    from lmk_embed.modeling_lmk import LMKModel
    from lmk_embed.tokenization_lmk import LMKTokenizer

    check_output_folder(output_dir)
    check_encoder_source(source)
    backbone = load_source_backbone(source)
    backbone_config = backbone_config_dict(backbone)
    state = backbone.state_dict()
    extension = None
    if max_positions is not None or position_extension is not None:
        if max_positions is None:
            raise ConversionError("`position_extension` needs `max_positions`, the new position limit N.")
        extension = plan_position_extension(backbone, backbone_config, state, max_positions, position_extension)
    options = {"pooling": pooling, "granularity": granularity, "splitter": splitter,
               "granularities": None if granularities is None else list(granularities), "splitter_seed": seed,
               "landmark_token": landmark_token, "normalize": normalize, "max_length": max_length,
               "long_input": long_input, "window_length": window_length}
    try:
        config = LMKConfig(backbone_config=backbone_config, position_extension=extension,
                           base_model=base_model if base_model is not None else hub_id_or_none(source),
                           **{name: value for name, value in options.items() if value is not None})
    except (TypeError, ValueError) as error:  # the option's rule names it
        raise ConversionError(str(error)) from None
    seed = config.splitter_seed
    torch.manual_seed(seed)  # the latent-attention pooler is the only new weight
    model = LMKModel(config)
    try:
        check_lmk_max_length(max_length, model.max_positions())
    except ValueError as error:
        hint = "" if extension else " To read longer inputs, extend the backbone with `--max-positions N`."
        raise ConversionError(f"{error}{hint}") from None
    copy_backbone_weights(model.backbone, state)
    tokenizer = LMKTokenizer.from_pretrained(str(source), **config.tokenizer_options())
    try:
        _ = tokenizer.landmark_token_id  # fails here, clearly, for a tokenizer with neither SEP nor EOS
    except ValueError as error:
        raise ConversionError(f"`source` {str(source)!r}: {error}") from None
    if extension is not None:
        tokenizer.model_max_length = extension["max_positions"]
    check_window_length(config, tokenizer, model.max_positions())
    return save_checkpoint(model, tokenizer, output_dir)


def check_window_length(config, tokenizer, limit: int | None) -> None:
    """The checkpoint's default window W (`config.window_length`) must fit the position table and hold
    one chunk of the default g (`check_window_holds_chunk`), or every text longer than W fails."""
    from lmk_embed.configuration_lmk import check_window_length as check_window_budget
    from lmk_embed.tokenization_lmk import check_window_holds_chunk

    if config.window_length is None:
        return
    try:
        check_window_holds_chunk(config.window_length, config.granularity, tokenizer.start_token_id is not None)
        check_window_budget(config.window_length, limit=limit)
    except ValueError as error:
        raise ConversionError(str(error)) from None


# Our own checkpoints' model types: already converted.
CONVERTED_MODEL_TYPES = ("lmk_embedder", "recurrent_embedder")


def check_not_converted(source: str | Path, config: dict | None) -> None:
    """Refuse one of our own checkpoints as a source: converting it again nests its config in another
    (a checkpoint that cannot load), and what a user wants from it needs no conversion."""
    model_type = (config or {}).get("model_type")
    if model_type in CONVERTED_MODEL_TYPES:
        base = (config or {}).get("base_model")
        raise ConversionError(
            f"`source` {str(source)!r} is already an lmk-embed checkpoint ({model_type}); converting it again would "
            f"nest it in another, which cannot load. Convert the model it was made from{f' ({base})' if base else ''} "
            "instead, or keep this checkpoint and set its options per call (encode(granularity=..., long_input=..., "
            "window_length=..., max_length=...)).")


def check_recurrent_source(source: str | Path, config: dict | None) -> None:
    """Recurrent conversion takes the recurrent LMs we embed with; an encoder belongs to `convert-lmk`."""
    from lmk_embed.modeling_recurrent import STATE_CARRIERS

    check_not_converted(source, config)
    model_type = (config or {}).get("model_type")
    if model_type is not None and model_type not in STATE_CARRIERS:
        hint = " (an encoder: convert it with `lmk-embed convert-lmk`)" if not (config or {}).get("is_decoder") else ""
        raise ConversionError(f"`source` {str(source)!r} is a {model_type!r} model, not a recurrent LM "
                              f"({', '.join(sorted(STATE_CARRIERS))}){hint}.")


def check_encoder_source(source: str | Path) -> None:
    """LMK conversion takes bidirectional encoders: a recurrent LM belongs to `convert-recurrent`, and
    other causal LMs are refused rather than converted untested (their landmarks would see only
    the text before them)."""
    from lmk_embed.modeling_recurrent import STATE_CARRIERS

    config = source_config(source) or {}
    check_not_converted(source, config)
    model_type = config.get("model_type")
    if model_type in {*STATE_CARRIERS, "mamba"} or find_mamba_ssm_folder(source) is not None:
        raise ConversionError(f"`source` {str(source)!r} is a recurrent language model ({model_type or 'mamba_ssm layout'}), "
                              "not an encoder: convert it with `lmk-embed convert-recurrent`.")
    causal = [name for name in config.get("architectures") or [] if name.endswith(("ForCausalLM", "LMHeadModel"))]
    if causal or config.get("is_decoder"):
        raise ConversionError(f"`source` {str(source)!r} is a causal language model ({', '.join(causal) or 'is_decoder'}): "
                              "LMK conversion takes bidirectional encoders (BERT, ModernBERT, MiniLM, ...).")


def _absolute_position_table(backbone) -> tuple[str, torch.nn.Embedding] | None:
    for name, module in backbone.named_modules():
        if name.rsplit(".", 1)[-1] == "position_embeddings" and isinstance(module, torch.nn.Embedding):
            return name, module
    return None


def plan_position_extension(backbone, backbone_config: dict, state: dict, max_positions: int, method: str | None) -> dict:
    """Extend the backbone to `max_positions` N: edits `backbone_config` and `state` in place and
    returns the `position_extension` entry of the LMK config.

    Absolute tables (BERT, RoBERTa with its padding offset, ...) gain N rows after their original
    rows (`interpolate` by default, `recurrent` or `group`); rotary backbones get their own dynamic
    NTK rope scaling (`dynamic`). Anything else is refused with the reason.
    """
    from lmk_embed.configuration_lmk import ABSOLUTE_POSITION_EXTENSIONS, ROTARY_POSITION_EXTENSIONS
    from lmk_embed.modeling_lmk import extended_position_table

    table = _absolute_position_table(backbone)
    kind = backbone_config.get("model_type")
    if table is not None:
        name, module = table
        method = method or "interpolate"
        if method not in ABSOLUTE_POSITION_EXTENSIONS:
            raise ConversionError(
                f"`position_extension` {method!r} is for rotary backbones; {kind!r} has an absolute position "
                f"table: use one of {list(ABSOLUTE_POSITION_EXTENSIONS)}."
            )
        offset = module.padding_idx + 1 if module.padding_idx is not None else 0
        rows = int(module.num_embeddings)
        original = rows - offset
        if max_positions <= original:
            raise ConversionError(f"`max_positions`={max_positions} must exceed the backbone's {original} positions.")
        weight = state[f"{name}.weight"]
        extended = extended_position_table(weight[offset:], method, max_positions)
        state[f"{name}.weight"] = torch.cat([weight, extended.to(weight.dtype)])
        backbone_config["max_position_embeddings"] = rows + max_positions
        return {"method": method, "original_positions": original, "max_positions": int(max_positions),
                "first_row": rows, "position_offset": offset}
    rope = backbone_config.get("rope_parameters")
    if isinstance(rope, dict) and rope and backbone_config.get("max_position_embeddings"):
        method = method or "dynamic"
        if method not in ROTARY_POSITION_EXTENSIONS:
            raise ConversionError(
                f"`position_extension` {method!r} needs an absolute position table; {kind!r} is rotary: "
                f"use {list(ROTARY_POSITION_EXTENSIONS)} (the backbone's own dynamic NTK rope scaling)."
            )
        original = int(backbone_config["max_position_embeddings"])
        if max_positions <= original:
            raise ConversionError(f"`max_positions`={max_positions} must exceed the backbone's {original} positions.")
        # One rope dict, or one per attention type (ModernBERT: full and sliding attention).
        nested = all(isinstance(value, dict) for value in rope.values())
        factor = max_positions / original
        scaled = lambda params: {**params, "rope_type": "dynamic", "factor": factor}  # noqa: E731
        backbone_config["rope_parameters"] = ({key: scaled(value) for key, value in rope.items()} if nested
                                              else scaled(rope))
        return {"method": method, "original_positions": original, "max_positions": int(max_positions)}
    raise ConversionError(
        f"`max_positions`: the {kind!r} backbone has neither an absolute position table nor rotary "
        "positions, so there is nothing to extend."
    )


def convert_to_recurrent(
    source: str | Path,
    output_dir: str | Path,
    *,
    schedule: str | None = None,
    block_size: int | str | None = None,
    ssd_chunk_size: int | None = None,
    normalize: bool | None = None,
    add_bos_token: bool | None = None,
    max_length: int | None = None,
    default_task: str | None = None,
    base_model: str | None = None,
    tokenizer: str | Path | None = None,
    distilled_from: str | None = None,
) -> Path:
    """Turn a recurrent causal LM (Mamba2, xLSTM, RWKV; folder or Hub id) into an embedder checkpoint.

    The LM head is dropped: `AutoModel` loads the base model only. A mamba_ssm-layout Mamba2 (the
    state-spaces releases) is detected and mapped onto transformers' Mamba2. `tokenizer` (a folder or
    Hub id) overrides the source's own tokenizer, for releases that ship none. Options left None take
    `RecurrentEmbedConfig`'s defaults (`RECURRENT_OPTIONS`, the one place they are written).
    """
    from lmk_embed.configuration_recurrent import (RecurrentEmbedConfig, check_recurrent_max_length,
                                                   register_external_backbone)
    from lmk_embed.modeling_recurrent import RecurrentEmbedModel
    from lmk_embed.tokenization_recurrent import RecurrentEmbedTokenizer

    check_output_folder(output_dir)

    mamba_ssm_folder = find_mamba_ssm_folder(source)
    if mamba_ssm_folder is not None:
        if tokenizer is None:
            check_tokenizer_present(mamba_ssm_folder, MAMBA_SSM_TOKENIZER)
        backbone = mamba2_from_mamba_ssm(mamba_ssm_folder)
    else:
        config = source_config(source)
        check_recurrent_source(source, config)
        register_external_backbone(config)  # RWKV-7 lives in flash-linear-attention
        # transformers 5 applies Mamba's init-only `rescale_prenorm_residual` to the weights it loads too
        # (out_proj / sqrt(layers)). The flag changes no computation: read the source with it off.
        rescaled = bool((config or {}).get("rescale_prenorm_residual"))
        backbone = load_source_backbone(source, **({"rescale_prenorm_residual": False} if rescaled else {}))
        if rescaled:
            backbone.config.rescale_prenorm_residual = True
    options = {"schedule": schedule, "block_size": block_size, "ssd_chunk_size": ssd_chunk_size, "normalize": normalize,
               "add_bos_token": add_bos_token, "max_length": max_length, "default_task": default_task}
    try:
        config = RecurrentEmbedConfig(
            backbone_config=backbone_config_dict(backbone),
            base_model=base_model if base_model is not None else hub_id_or_none(source),
            distilled_from=distilled_from,
            **{name: value for name, value in options.items() if value is not None},
        )
    except (TypeError, ValueError) as error:  # the option's rule names it
        raise ConversionError(str(error)) from None
    model = RecurrentEmbedModel(config)
    try:
        check_recurrent_max_length(config.max_length, config.add_bos_token, model.max_positions())
    except ValueError as error:
        raise ConversionError(str(error)) from None
    copy_backbone_weights(model.backbone, backbone.state_dict(), ignore_prefixes=())
    tokenizer_source = (mamba_ssm_folder or source) if tokenizer is None else tokenizer
    tokenizer = RecurrentEmbedTokenizer.from_pretrained(str(tokenizer_source), **config.tokenizer_options())
    try:
        _ = tokenizer.eos_id, tokenizer.prefix_ids  # fail here, clearly, without EOS (or BOS when asked for)
    except ValueError as error:
        raise ConversionError(f"tokenizer {str(tokenizer_source)!r}: {error}") from None
    return save_checkpoint(model, tokenizer, output_dir)


# ---- mamba_ssm-layout Mamba2 (the state-spaces/mamba2-* releases) ------------------------------
#
# transformers cannot load these folders: config.json has mamba_ssm's `MambaConfig` fields and the
# weights sit under `backbone.*`. We map both onto `Mamba2Config` / `Mamba2Model` without importing
# mamba_ssm (it does not install on CPU machines) and without unpickling anything but tensors.

MAMBA_SSM_TOKENIZER = "EleutherAI/gpt-neox-20b"  # the tokenizer the state-spaces releases were trained with
MAMBA_SSM_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")

# mamba_ssm's `Mamba2.__init__` defaults: a release's `ssm_cfg` often gives only {"layer": "Mamba2"}.
MAMBA2_DEFAULTS = {
    "d_state": 128, "d_conv": 4, "expand": 2, "headdim": 64, "d_ssm": None, "ngroups": 1, "D_has_hdim": False,
    "rmsnorm": True, "norm_before_gate": False, "dt_limit": (0.0, float("inf")), "bias": False, "conv_bias": True,
    "chunk_size": 256,
}
# Keys that only shape the random initialisation or the kernels, never the forward.
MAMBA2_INIT_ONLY = {"conv_init", "A_init_range", "dt_min", "dt_max", "dt_init_floor", "use_mem_eff_path", "layer"}
# `MambaConfig` keys that transformers' Mamba2 has no counterpart for, with the only value it can take.
MAMBA_SSM_FIXED = {"d_intermediate": 0, "rms_norm": True}
MAMBA_SSM_KNOWN = {
    "d_model", "n_layer", "vocab_size", "ssm_cfg", "attn_layer_idx", "attn_cfg", "residual_in_fp32",
    "fused_add_norm", "pad_vocab_size_multiple", "tie_embeddings", *MAMBA_SSM_FIXED,
}


class ConversionError(ValueError):
    """A source checkpoint we cannot convert; the message names the file and field."""


def is_mamba_ssm_layout(config: dict) -> bool:
    """A mamba_ssm `MambaConfig` (d_model, n_layer, ssm_cfg; no transformers `model_type`)."""
    return "model_type" not in config and {"d_model", "n_layer"} <= config.keys()


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
    """mamba_ssm rounds the embedding rows up to a multiple of `pad_vocab_size_multiple`."""
    return vocab_size + (-vocab_size) % multiple


def mamba2_config_from_mamba_ssm(config: dict, where: str = "config.json"):
    """A mamba_ssm `MambaConfig` dict -> transformers `Mamba2Config`, refusing what Mamba2Model cannot run."""
    from transformers import Mamba2Config

    unknown = sorted(config.keys() - MAMBA_SSM_KNOWN)
    if unknown:
        raise ConversionError(f"{where}: unknown mamba_ssm field(s) {unknown}; refusing to guess what they change.")
    if config.get("attn_layer_idx"):
        raise ConversionError(
            f"{where}: `attn_layer_idx` = {config['attn_layer_idx']} puts attention layers between the Mamba2 "
            "layers (a hybrid); transformers' Mamba2Model has none, so this checkpoint cannot be converted."
        )
    for field, only in MAMBA_SSM_FIXED.items():
        if config.get(field, only) != only:
            raise ConversionError(f"{where}: `{field}` = {config[field]!r} is not supported (only {only!r}).")
    ssm_cfg = dict(config.get("ssm_cfg") or {})
    layer = ssm_cfg.get("layer", "Mamba1")  # mamba_ssm's own default when `layer` is absent
    if layer != "Mamba2":
        raise ConversionError(
            f"{where}: `ssm_cfg.layer` is {layer!r} (mamba_ssm's default when `layer` is absent is Mamba1); "
            "only Mamba2 layers convert."
        )
    unknown = sorted(ssm_cfg.keys() - MAMBA2_DEFAULTS.keys() - MAMBA2_INIT_ONLY)
    if unknown:
        raise ConversionError(f"{where}: unknown `ssm_cfg` field(s) {unknown}; refusing to guess what they change.")
    ssm = {**MAMBA2_DEFAULTS, **{k: v for k, v in ssm_cfg.items() if k in MAMBA2_DEFAULTS}}
    for field, only in {"D_has_hdim": False, "rmsnorm": True, "norm_before_gate": False}.items():
        if ssm[field] != only:
            raise ConversionError(f"{where}: `ssm_cfg.{field}` = {ssm[field]!r} is not supported by Mamba2Model (only {only!r}).")
    d_model = config["d_model"]
    d_inner = ssm["expand"] * d_model
    d_ssm = d_inner if ssm["d_ssm"] is None else ssm["d_ssm"]
    if not float(ssm["expand"]).is_integer():
        raise ConversionError(f"{where}: `ssm_cfg.expand` = {ssm['expand']} is not an integer, as Mamba2Config needs.")
    if d_ssm != d_inner:
        raise ConversionError(
            f"{where}: `ssm_cfg.d_ssm` = {d_ssm} differs from expand * d_model = {d_inner}: the rest would be a gated "
            "MLP inside the mixer, which Mamba2Model does not have."
        )
    if d_ssm % ssm["headdim"] or d_ssm % ssm["ngroups"]:
        raise ConversionError(f"{where}: d_ssm = {d_ssm} must divide by `headdim` ({ssm['headdim']}) and `ngroups` ({ssm['ngroups']}).")
    return Mamba2Config(
        vocab_size=padded_vocab_size(config["vocab_size"], config.get("pad_vocab_size_multiple", 8)),
        hidden_size=d_model,
        num_hidden_layers=config["n_layer"],
        state_size=ssm["d_state"],
        conv_kernel=ssm["d_conv"],
        expand=int(ssm["expand"]),
        head_dim=ssm["headdim"],
        num_heads=d_ssm // ssm["headdim"],
        n_groups=ssm["ngroups"],
        use_bias=ssm["bias"],
        use_conv_bias=ssm["conv_bias"],
        time_step_limit=tuple(float(v) for v in ssm["dt_limit"]),
        chunk_size=ssm["chunk_size"],
        residual_in_fp32=config.get("residual_in_fp32", True),
        tie_word_embeddings=config.get("tie_embeddings", True),
        layer_norm_epsilon=1e-5,  # mamba_ssm's fixed eps for both the block norms and the gated norm
        pad_token_id=None, bos_token_id=None, eos_token_id=None,  # the tokenizer's, not Mamba2Config's defaults
    )


def load_tensor_file(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of one weight file: safetensors, or a torch pickle read with `weights_only=True` (tensors only)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # anything but plain tensors is refused by weights_only; torch's text suggests unsafe loading
        raise ConversionError(f"{path.name}: cannot be read as plain tensors (objects other than tensors are never "
                              "unpickled); save the weights with safetensors (model.save_pretrained) and convert that") from None
    if not isinstance(state, dict):
        raise ConversionError(f"{path.name}: expected a dict of tensors, got {type(state).__name__}.")
    return state


def mamba2_state_dict_from_mamba_ssm(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """`backbone.*` weights renamed for transformers' `Mamba2Model` (LM head dropped) and the file's name."""
    for name in MAMBA_SSM_WEIGHT_FILES:
        if (folder / name).is_file():
            break
    else:
        raise ConversionError(f"{folder}: no weights; expected one of {list(MAMBA_SSM_WEIGHT_FILES)}.")
    state = {}
    for key, tensor in load_tensor_file(folder / name).items():
        if key == "lm_head.weight":
            continue  # the embedder has no LM head (tied releases store it as a second name of the embedding)
        if not key.startswith("backbone."):
            raise ConversionError(f"{name}: unexpected weight {key!r} (mamba_ssm keeps the model under `backbone.`).")
        key = key.removeprefix("backbone.")
        state["embeddings.weight" if key == "embedding.weight" else key] = tensor
    return state, name


def mamba2_from_mamba_ssm(folder: str | Path):
    """A mamba_ssm-layout folder -> transformers `Mamba2Model` holding its weights (float32)."""
    from transformers import Mamba2Model

    folder = Path(folder)
    config = mamba2_config_from_mamba_ssm(json.loads((folder / "config.json").read_text()))
    state, name = mamba2_state_dict_from_mamba_ssm(folder)
    model = Mamba2Model(config)
    expected = model.state_dict()
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise ConversionError(f"{name} does not match config.json: missing={missing[:8]}, unexpected={unexpected[:8]}.")
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise ConversionError(
                f"{name}: `backbone.{key}` has shape {tuple(tensor.shape)}; config.json implies {tuple(expected[key].shape)}."
            )
    model.load_state_dict({key: tensor.float() for key, tensor in state.items()})
    return model


def check_tokenizer_present(folder: Path, release_tokenizer: str) -> None:
    """mamba_ssm releases ship no tokenizer: say which one they expect instead of failing in transformers."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConversionError(
            f"{folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)}). mamba_ssm releases are trained with "
            f"{release_tokenizer}'s tokenizer: copy its files into the folder, or pass `tokenizer=` (--tokenizer)."
        )


def source_config(source: str | Path) -> dict | None:
    """The source's config.json as a dict (a Hub id's is downloaded), or None where there is none to read."""
    path = Path(source)
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ConversionError(f"`source` {str(source)!r} holds no config.json: it is not a model folder.")
        try:
            config = json.loads(config_path.read_text())
        except json.JSONDecodeError as error:
            raise ConversionError(f"{config_path}: not valid JSON ({error}).") from None
    else:
        from huggingface_hub import hf_hub_download

        try:
            config = json.loads(Path(hf_hub_download(str(source), "config.json")).read_text())
        except Exception:  # unreachable or not a repository: the transformers path reports it
            return None
    return config if isinstance(config, dict) else None


def find_mamba_ssm_folder(source: str | Path) -> Path | None:
    """The local folder of a mamba_ssm-layout source (a Hub id is downloaded), or None for any other layout."""
    config = source_config(source)
    if config is None or not is_mamba_ssm_layout(config):
        return None
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    patterns = ["config.json", *MAMBA_SSM_WEIGHT_FILES, *TOKENIZER_FILES, "special_tokens_map.json", "merges.txt"]
    return Path(snapshot_download(str(source), allow_patterns=patterns))
