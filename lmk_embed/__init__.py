"""Long-context text embedders packaged as Hugging Face Hub models.

The flat files beside this one are what a checkpoint ships; `checkpoint` writes checkpoints.
"""

from .configuration_lmk import LMKConfig
from .configuration_recurrent import RecurrentEmbedConfig
from .modeling_lmk import LMKModel
from .modeling_recurrent import RecurrentEmbedModel
from .tokenization_lmk import LMKTokenizer
from .tokenization_recurrent import RecurrentEmbedTokenizer

__all__ = ["LMKConfig", "LMKModel", "LMKTokenizer", "RecurrentEmbedConfig", "RecurrentEmbedModel", "RecurrentEmbedTokenizer"]
__version__ = "0.1.0"
