"""Contrastive fine-tuning for both families (sentence-transformers trainer, peft, bitsandbytes)."""

from .config import TrainConfig
from .finetune import train

__all__ = ["TrainConfig", "train"]
