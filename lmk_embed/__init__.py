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
# What a checkpoint of each family carries (auto_map, .py files): defined in the shipped encoding.py,
# whose save_pretrained writes it; tests/test_layout.py checks that each set holds every file its files import.
from .checkpoint import AUTO_MAPS, FAMILY_FILES, SHARED_FILES
from .modeling_lmk import LMKModel
from .modeling_recurrent import RecurrentEmbedModel
from .tokenization_lmk import LMKTokenizer
from .tokenization_recurrent import RecurrentEmbedTokenizer

PACKAGE_DIR = Path(__file__).resolve().parent

# peft's LoRA targets per backbone `model_type`: every linear layer by default; only in_proj for
# Mamba2 (peft refuses its out_proj).
LORA_TARGET_MODULES = {"mamba2": ["in_proj"]}
DEFAULT_LORA_TARGET_MODULES = "all-linear"


def lora_target_modules(backbone_type: str):
    """The `target_modules` to give `peft.LoraConfig` for a backbone of this `model_type`."""
    return LORA_TARGET_MODULES.get(backbone_type, DEFAULT_LORA_TARGET_MODULES)


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
