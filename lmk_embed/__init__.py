"""Long-context text embedders packaged as Hugging Face Hub models.

Every other file in this folder is shipped inside checkpoints, as is: a checkpoint's code is its
family's files plus the shared ones (`shipped_files(family)`), copied from this folder. The files
import each other only by relative import, because transformers' remote-code loader copies a
module's same-folder relative imports and nothing else; each family's set holds everything its
files import. Tooling (conversion, training, evaluation, cards, publishing) lives outside.
"""

from pathlib import Path

from .configuration_lmk import LMKConfig
from .configuration_recurrent import RecurrentEmbedConfig
from .modeling_lmk import LMKModel
from .modeling_recurrent import RecurrentEmbedModel
from .tokenization_lmk import LMKTokenizer
from .tokenization_recurrent import RecurrentEmbedTokenizer

PACKAGE_DIR = Path(__file__).resolve().parent

# config.json / tokenizer_config.json `auto_map` of each family (`model_type`).
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


# peft's LoRA targets per backbone `model_type`: every linear layer by default; only in_proj for
# Mamba2 (peft refuses its out_proj).
LORA_TARGET_MODULES = {"mamba2": ["in_proj"]}
DEFAULT_LORA_TARGET_MODULES = "all-linear"


def lora_target_modules(backbone_type: str):
    """The `target_modules` to give `peft.LoraConfig` for a backbone of this `model_type`."""
    return LORA_TARGET_MODULES.get(backbone_type, DEFAULT_LORA_TARGET_MODULES)


# The .py files a checkpoint of each family ships: its own (the `AUTO_MAPS` modules and what they
# import), then the shared ones: the encode engine, the sentence-transformers module (modules.json
# names it) and the one door into other libraries' internals. tests/test_layout.py checks that each
# set holds every file its files import.
SHARED_FILES = ("compat.py", "encoding.py", "st_module.py")
FAMILY_FILES = {
    "lmk_embedder": ("configuration_lmk.py", "modeling_lmk.py", "onnx_backend.py", "tokenization_lmk.py", *SHARED_FILES),
    "recurrent_embedder": (
        "configuration_recurrent.py", "modeling_recurrent.py", "modeling_rwkv7.py", "tokenization_recurrent.py",
        *SHARED_FILES,
    ),
}


def shipped_files(family: str | None = None) -> list[Path]:
    """The .py files a checkpoint of `family` (its `model_type`) ships; None: every shipped file
    (this folder's files, less `__init__.py`)."""
    if family is None:
        return sorted(p for p in PACKAGE_DIR.glob("*.py") if p.name != "__init__.py")
    if family not in FAMILY_FILES:
        raise ValueError(f"Unknown family {family!r}; expected one of {sorted(FAMILY_FILES)}.")
    return sorted(PACKAGE_DIR / name for name in FAMILY_FILES[family])


def _register_auto_classes() -> None:
    """Make AutoConfig / AutoModel / AutoTokenizer know our model types when this package is imported."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    for config_class, model_class, tokenizer_class in (
        (LMKConfig, LMKModel, LMKTokenizer),
        (RecurrentEmbedConfig, RecurrentEmbedModel, RecurrentEmbedTokenizer),
    ):
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        AutoModel.register(config_class, model_class, exist_ok=True)
        AutoTokenizer.register(config_class, fast_tokenizer_class=tokenizer_class, exist_ok=True)


_register_auto_classes()

__all__ = [
    "AUTO_MAPS", "FAMILY_FILES", "lora_target_modules", "LMKConfig", "LMKModel", "LMKTokenizer", "RecurrentEmbedConfig", "RecurrentEmbedModel",
    "RecurrentEmbedTokenizer", "SHARED_FILES", "shipped_files",
]
__version__ = "0.1.0"
