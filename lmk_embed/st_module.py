"""The sentence-transformers module of our checkpoints.

It holds the checkpoint's `PreTrainedModel` (LMKModel or RecurrentEmbedModel, loaded through
AutoModel with the checkpoint's own code), so `SentenceTransformer(...).add_adapter(...)` reaches
a transformers model, and it tokenizes and pools exactly as the model's own `encode()` does, so
both give the same vectors. modules.json names it as `st_module.EmbedderModule`.
"""

from __future__ import annotations

import json
import os

import torch
from sentence_transformers.base.modules import InputModule
from transformers import AutoModel, AutoTokenizer


class EmbedderModule(InputModule):
    """Wraps a family model: `preprocess` -> model inputs, `forward` -> `sentence_embedding` [B, D]."""

    config_file_name = "embedder_module_config.json"
    config_keys: list[str] = []
    save_in_root = True

    def __init__(self, model, tokenizer=None):
        super().__init__()
        self.model = model
        if tokenizer is not None:
            model.tokenizer = tokenizer

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def max_seq_length(self) -> int | None:
        return self.model.default_max_length()

    @max_seq_length.setter
    def max_seq_length(self, value: int | None) -> None:
        self.model.config.max_length = value

    def get_embedding_dimension(self) -> int:
        return int(self.model.config.embedding_dim)

    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor]:
        """Texts -> the model's input tensors; in training mode LMK draws its variable g here."""
        texts = list(inputs)
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"inputs[{index}] must be a string, got {type(text).__name__}.")
        max_length = kwargs.get("max_length")  # the trainer's per-column budget (queries vs passages)
        return self.model.prepare_features(texts, prompt=prompt or None, training=self.training, max_length=max_length)

    def forward(self, features: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        inputs = {name: features[name] for name in self.model.forward_input_names if name in features}
        output = self.model(**inputs)
        features["sentence_embedding"] = output.embeddings
        if output.last_hidden_state is not None:
            features["token_embeddings"] = output.last_hidden_state
        return features

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.model.save_pretrained(output_path, safe_serialization=True)
        self.tokenizer.save_pretrained(output_path)
        with open(os.path.join(output_path, self.config_file_name), "w", encoding="utf-8") as handle:
            json.dump({"family": self.model.config.model_type}, handle, indent=2)

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        trust_remote_code: bool = False,
        model_kwargs: dict | None = None,
        **kwargs,
    ) -> "EmbedderModule":
        hub_kwargs = {
            "subfolder": subfolder,
            "token": token,
            "cache_dir": cache_folder,
            "revision": revision,
            "local_files_only": local_files_only,
            "trust_remote_code": trust_remote_code,
        }
        model = AutoModel.from_pretrained(model_name_or_path, **hub_kwargs, **(model_kwargs or {}))
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, **hub_kwargs)
        return cls(model, tokenizer)
