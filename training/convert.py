"""Conversion: backbones into checkpoints that satisfy the checkpoint contract.

A checkpoint folder holds config.json (with `auto_map`), model.safetensors, the tokenizer files,
the shipped package's flat .py files (copied from `lmk_embed/`, so they are never stale), and the
sentence-transformers files: modules.json, config_sentence_transformers.json and the
`st_module.EmbedderModule` config.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from lmk_embed import AUTO_MAPS, shipped_files
from lmk_embed.encoding import check_position_limit
from lmk_embed.st_module import EmbedderModule

# The tokenizer class each family's tokenizer_config.json names.
TOKENIZER_CLASSES = {"lmk_embedder": "LMKTokenizer", "recurrent_embedder": "RecurrentEmbedTokenizer"}
ST_MODULE_TYPE = "st_module.EmbedderModule"
ST_NORMALIZE_TYPE = "sentence_transformers.base.modules.normalize.Normalize"


def write_shipped_code(folder: str | Path) -> list[str]:
    """Copy the shipped package's .py files (less `__init__`) into `folder`; returns their names."""
    names = []
    for path in shipped_files():
        shutil.copyfile(path, Path(folder) / path.name)
        names.append(path.name)
    return names


def _update_json(path: Path, **updates) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(updates)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_sentence_transformers_files(folder: str | Path, model) -> None:
    """modules.json (our module, then Normalize when the model normalises) and their configs."""
    folder = Path(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": ST_MODULE_TYPE}]
    if model.config.normalize:
        modules.append({"idx": 1, "name": "1", "path": "1_Normalize", "type": ST_NORMALIZE_TYPE})
        (folder / "1_Normalize").mkdir(exist_ok=True)
        (folder / "1_Normalize" / "config.json").write_text("{}\n")
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    st_config = {
        "model_type": "SentenceTransformer",
        "prompts": model.sentence_transformers_prompts(),
        "default_prompt_name": None,
        "similarity_fn_name": "cosine",
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=2) + "\n")
    EmbedderModule(model).save_config(str(folder))  # the module writes (and later reads) its own config


def save_checkpoint(model, tokenizer, folder: str | Path) -> Path:
    """Write `model` + `tokenizer` as a complete checkpoint folder (see the module docstring)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    family = model.config.model_type
    auto_map = AUTO_MAPS[family]
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    write_shipped_code(folder)
    _update_json(folder / "config.json", auto_map=auto_map)
    _update_json(
        folder / "tokenizer_config.json",
        auto_map={"AutoTokenizer": auto_map["AutoTokenizer"]},
        tokenizer_class=TOKENIZER_CLASSES[family],
    )
    write_sentence_transformers_files(folder, model)
    return folder


def load_source_backbone(source: str | Path, **kwargs):
    """The base model (any task head dropped) of a local folder or a Hub id."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(source), **kwargs)


def hub_id_or_none(source: str | Path) -> str | None:
    """`source` if it names a Hub repository rather than a local folder."""
    return None if Path(source).exists() else str(source)


def backbone_config_dict(backbone) -> dict:
    """The backbone's config as a dict, without the local path it was loaded from."""
    config = backbone.config.to_dict()
    config.pop("_name_or_path", None)
    return config


def copy_backbone_weights(target: torch.nn.Module, source: torch.nn.Module, ignore_prefixes=("pooler.",)) -> None:
    """Load `source`'s weights into `target`, failing loudly on any missing weight."""
    result = target.load_state_dict(source.state_dict(), strict=False)
    unexpected = [key for key in result.unexpected_keys if not key.startswith(ignore_prefixes)]
    if result.missing_keys or unexpected:
        raise ValueError(f"Backbone weights do not match: missing={result.missing_keys}, unexpected={unexpected}.")


def convert_to_lmk(
    source: str | Path,
    output_dir: str | Path,
    *,
    pooling: str = "lmk",
    granularity: int = 128,
    splitter: str = "fixed",
    granularities=(32, 64, 128, 256),
    normalize: bool = True,
    landmark_token: str = "sep",
    max_length: int | None = None,
    seed: int = 0,
    base_model: str | None = None,
) -> Path:
    """Turn an encoder checkpoint (local folder, or a Hub id where the Hub is reachable) into an LMK checkpoint.

    `base_model` is the Hub id recorded for model cards; by default `source` when it is not a local folder.
    """
    from lmk_embed.configuration_lmk import LMKConfig
    from lmk_embed.modeling_lmk import LMKModel
    from lmk_embed.tokenization_lmk import LMKTokenizer

    backbone = load_source_backbone(source)
    config = LMKConfig(
        backbone_config=backbone_config_dict(backbone),
        base_model=base_model if base_model is not None else hub_id_or_none(source),
        pooling=pooling,
        granularity=granularity,
        splitter=splitter,
        granularities=list(granularities),
        splitter_seed=seed,
        landmark_token=landmark_token,
        normalize=normalize,
        max_length=max_length,
    )
    torch.manual_seed(seed)  # the latent-attention pooler is the only new weight
    model = LMKModel(config)
    check_position_limit("max_length", max_length, model.max_positions())
    copy_backbone_weights(model.backbone, backbone)
    tokenizer = LMKTokenizer.from_pretrained(str(source), **config.tokenizer_options())
    _ = tokenizer.landmark_token_id  # fails here, clearly, for a tokenizer with neither SEP nor EOS
    return save_checkpoint(model, tokenizer, output_dir)


def convert_to_recurrent(
    source: str | Path,
    output_dir: str | Path,
    *,
    schedule: str = "auto",
    block_size: int | str = "auto",
    ssd_chunk_size: int = 64,
    normalize: bool = True,
    add_bos_token: bool = False,
    max_length: int | None = None,
    default_task: str | None = None,
    base_model: str | None = None,
) -> Path:
    """Turn a recurrent causal LM (Mamba2, xLSTM, RWKV; folder or Hub id) into an embedder checkpoint.

    The LM head is dropped: `AutoModel` loads the base model only.
    """
    from lmk_embed.configuration_recurrent import DEFAULT_TASK, RecurrentEmbedConfig
    from lmk_embed.modeling_recurrent import RecurrentEmbedModel
    from lmk_embed.tokenization_recurrent import RecurrentEmbedTokenizer

    backbone = load_source_backbone(source)
    config = RecurrentEmbedConfig(
        backbone_config=backbone_config_dict(backbone),
        schedule=schedule,
        block_size=block_size,
        ssd_chunk_size=ssd_chunk_size,
        normalize=normalize,
        add_bos_token=add_bos_token,
        max_length=max_length,
        default_task=default_task or DEFAULT_TASK,
        base_model=base_model if base_model is not None else hub_id_or_none(source),
    )
    model = RecurrentEmbedModel(config)
    check_position_limit("max_length", max_length, model.max_positions())
    copy_backbone_weights(model.backbone, backbone, ignore_prefixes=())
    tokenizer = RecurrentEmbedTokenizer.from_pretrained(str(source), **config.tokenizer_options())
    _ = tokenizer.eos_id, tokenizer.prefix_ids  # fail here, clearly, without EOS (or BOS when asked for)
    return save_checkpoint(model, tokenizer, output_dir)
