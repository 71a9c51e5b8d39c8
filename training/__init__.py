"""Conversion into checkpoints, training data, and contrastive fine-tuning for both families.

`train` is imported on first use: it pulls in sentence-transformers, peft and bitsandbytes, which
commands that only need `TrainConfig` (the CLI's parser) should not pay for.
"""

from .config import TrainConfig

__all__ = ["TrainConfig", "train"]


def __getattr__(name: str):
    if name == "train":
        from .finetune import train

        return train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
