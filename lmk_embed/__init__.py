"""Long-context text embedders packaged as Hugging Face Hub models.

The flat files beside this one are what a checkpoint ships; `checkpoint` writes checkpoints.
"""

from .configuration_lmk import LMKConfig
from .modeling_lmk import LMKModel
from .tokenization_lmk import LMKTokenizer

__all__ = ["LMKConfig", "LMKModel", "LMKTokenizer"]
__version__ = "0.1.0"
