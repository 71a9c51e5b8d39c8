"""Conversion into checkpoints, training data, and contrastive fine-tuning for both families.

`train` is imported on first use: it pulls in sentence-transformers, peft and bitsandbytes, which
commands that only need `TrainConfig` (the CLI's parser) should not pay for.
"""

from .config import TrainConfig

__all__ = ["TrainConfig", "train", "train_side_by_side"]


def __getattr__(name: str):
    if name in ("train", "train_side_by_side"):
        from . import finetune

        return getattr(finetune, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
