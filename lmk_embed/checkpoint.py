"""What a checkpoint folder of each family holds beside its weights and tokenizer, and how
`save_pretrained` completes one: the `auto_map`s, the family's shipped .py files (found beside this
code, in the folder the model came from, or downloaded from the Hub), the sentence-transformers
files, and the tokenizer's options in tokenizer_config.json.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def write_tokenizer_options(folder, options: dict) -> None:
    """Set `options` in `folder`'s tokenizer_config.json, the standalone tokenizer's defaults."""
    path = Path(folder) / TOKENIZER_CONFIG_FILE
    saved = json.loads(path.read_text(encoding="utf-8"))
    saved.update(options)
    path.write_text(json.dumps(saved, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


# What a complete checkpoint folder of each family (its config's `model_type`) holds beside the
# weights and the tokenizer: config.json / tokenizer_config.json `auto_map`, the tokenizer class,
# the .py files (the auto-map modules, what they import, the sentence-transformers module and the
# one door into other libraries' internals) and the sentence-transformers files.
AUTO_MAPS = {
    "lmk_embedder": {
        "AutoConfig": "configuration_lmk.LMKConfig",
        "AutoModel": "modeling_lmk.LMKModel",
        "AutoTokenizer": [None, "tokenization_lmk.LMKTokenizer"],
    },
    "recurrent_embedder": {
        "AutoConfig": "configuration_recurrent.RecurrentEmbedConfig",
        "AutoModel": "modeling_recurrent.RecurrentEmbedModel",
        "AutoTokenizer": [None, "tokenization_recurrent.RecurrentEmbedTokenizer"],
    },
}
SHARED_FILES = ("checkpoint.py", "compat.py", "encoding.py", "st_module.py")
FAMILY_FILES = {
    "lmk_embedder": ("configuration_lmk.py", "modeling_lmk.py", "onnx_backend.py", "tokenization_lmk.py", *SHARED_FILES),
    "recurrent_embedder": (
        "configuration_recurrent.py", "modeling_recurrent.py", "modeling_rwkv7.py", "ssd.py", "tokenization_recurrent.py",
        *SHARED_FILES,
    ),
}
ST_MODULE_TYPE = "st_module.EmbedderModule"
ST_MODULE_CONFIG_FILE = "embedder_module_config.json"
ST_NORMALIZE_TYPE = "sentence_transformers.base.modules.normalize.Normalize"


def _update_json(path: Path, updates: dict) -> None:
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data.update(updates)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _find_code_file(name: str, source) -> Path | None:
    """`name` from this file's own folder (the package, or the copy transformers' remote-code
    loader made, which holds only the files that were imported), else from where the model was
    loaded: a local folder, or the Hub cache (downloaded when missing and the Hub is reachable)."""
    for folder in (Path(__file__).resolve().parent, Path(source) if source else None):
        if folder is not None and (folder / name).is_file():
            return folder / name
    if not source or Path(source).exists():
        return None
    try:  # a Hub id: huggingface_hub is a dependency of transformers
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(str(source), name))
    except Exception:  # noqa: BLE001 - offline, or not a repository: reported by the caller
        return None


def write_checkpoint_files(model, folder, with_tokenizer: bool, sentence_transformers_files: bool) -> None:
    """Complete `folder` (weights, config and tokenizer already saved) as a checkpoint of `model`'s
    family: its `FAMILY_FILES` (another family's shipped files there are removed), the `auto_map`s,
    and, when `sentence_transformers_files`, modules.json (our module, then Normalize when the model
    normalises), the module's config and config_sentence_transformers.json. A code file that cannot
    be found is a warning naming it: the folder then does not load with trust_remote_code. An
    adapter-only save (PEFT: no config.json) is left in PEFT's layout: the code stays with the base."""
    folder, family = Path(folder), model.config.model_type
    if not (folder / "config.json").is_file():
        return
    missing = []
    for name in FAMILY_FILES[family]:
        found = _find_code_file(name, model.name_or_path)
        if found is None:
            missing.append(name)
        elif found.resolve() != (folder / name).resolve():
            (folder / name).write_bytes(found.read_bytes())
    for other in {name for names in FAMILY_FILES.values() for name in names} - set(FAMILY_FILES[family]):
        (folder / other).unlink(missing_ok=True)
    if missing:
        warnings.warn(f"save_pretrained: {missing} could not be found beside this model's code or at "
                      f"{model.name_or_path!r}; the folder {folder} lacks them and will not load with "
                      "trust_remote_code until they are copied there.", stacklevel=3)
    auto_map = AUTO_MAPS[family]
    _update_json(folder / "config.json", {"auto_map": auto_map})
    if with_tokenizer:
        tokenizer_class = auto_map["AutoTokenizer"][1].split(".")[1]
        _update_json(folder / TOKENIZER_CONFIG_FILE,
                     {"auto_map": {"AutoTokenizer": auto_map["AutoTokenizer"]}, "tokenizer_class": tokenizer_class})
    if not sentence_transformers_files:
        return
    modules = [{"idx": 0, "name": "0", "path": "", "type": ST_MODULE_TYPE}]
    if model.config.normalize:
        modules.append({"idx": 1, "name": "1", "path": "1_Normalize", "type": ST_NORMALIZE_TYPE})
        (folder / "1_Normalize").mkdir(exist_ok=True)
        (folder / "1_Normalize" / "config.json").write_text("{}\n")
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / ST_MODULE_CONFIG_FILE).write_text(json.dumps({"family": family}, indent=4) + "\n")
    st_config = {"model_type": "SentenceTransformer", "prompts": model.sentence_transformers_prompts(),
                 "default_prompt_name": None, "similarity_fn_name": "cosine"}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=2) + "\n")


__all__ = ["AUTO_MAPS", "FAMILY_FILES", "SHARED_FILES", "ST_MODULE_CONFIG_FILE", "write_checkpoint_files",
           "write_tokenizer_options"]
