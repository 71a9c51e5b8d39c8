"""The sentence-transformers module of our checkpoints.

It holds the checkpoint's `PreTrainedModel` (LMKModel or RecurrentEmbedModel, loaded through
AutoModel with the checkpoint's own code), so `SentenceTransformer(...).add_adapter(...)` reaches
a transformers model, and it tokenizes and pools exactly as the model's own `encode()` does, so
both give the same vectors. modules.json names it as `st_module.EmbedderModule`.
"""

from __future__ import annotations

import torch
from sentence_transformers.base.modules import InputModule
from transformers import AutoModel, AutoTokenizer

from .checkpoint import ST_MODULE_CONFIG_FILE
from .encoding import warn_truncated


def in_sentence_transformers_terms(error: Exception) -> Exception:
    """The same error, naming `max_seq_length` (what a sentence-transformers user sets) for the
    model's `config.max_length` (where the module keeps it)."""
    return type(error)(str(error).replace("config.max_length", "max_seq_length"))


class EmbedderModule(InputModule):
    """Wraps a family model: `preprocess` -> model inputs, `forward` -> `sentence_embedding` [B, D].

    Its one option, `family` (the model's `model_type`), is saved to and read from
    `embedder_module_config.json` with the Module's `save_config` / `load_config`; loading checks
    that the checkpoint's model is of that family.
    """

    config_file_name = ST_MODULE_CONFIG_FILE
    config_keys: list[str] = ["family"]
    save_in_root = True

    def __init__(self, model, tokenizer=None, family: str | None = None):
        super().__init__()
        if family is not None and family != model.config.model_type:
            raise ValueError(
                f"{self.config_file_name} names the family {family!r}, but the checkpoint's model is "
                f"{model.config.model_type!r}."
            )
        self.model = model
        if tokenizer is not None:
            model.tokenizer = tokenizer
        self._truncation_reported = False
        # The model's per-call options: SentenceTransformer.encode passes these on to preprocess and forward.
        self.forward_kwargs = {*model.preprocess_options, *model.forward_options}

    @property
    def family(self) -> str:
        return self.model.config.model_type

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def max_seq_length(self) -> int | None:
        """`max_length` as `encode()` resolves it with no options (None: no budget; an LMK checkpoint
        that reads long texts in windows reads the whole text)."""
        return self.model.resolve().max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int | None) -> None:
        previous = self.model.config.max_length
        self.model.config.max_length = value
        try:  # the config's check (the minimum, under either schedule), then `resolve`'s (the position limit)
            self.model.config.check()
            self.model.resolve()
        except (TypeError, ValueError) as error:
            self.model.config.max_length = previous
            message = str(in_sentence_transformers_terms(error)).replace("`max_length`", "`max_seq_length`")
            raise type(error)(message) from None

    def get_embedding_dimension(self) -> int:
        return int(self.model.config.embedding_dim)

    def train(self, mode: bool = True):
        # SentenceTransformer.encode switches the model to eval mode (torch's Module.train, which
        # reaches every submodule) at the start of each call: re-arm the call's truncation warning.
        self._truncation_reported = False
        return super().train(mode)

    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor]:
        """Texts -> the model's input tensors ([B, T] each). `max_length` and (LMK) `granularity` come
        per call from the trainer's collator; an LMK model in training mode with the `variable`
        splitter and no `granularity` draws one. The model's other per-call options
        (`preprocess_options`, `forward_options`) come from SentenceTransformer.encode.

        At inference, the first batch of an encode call that truncates a text warns, as the
        model's own `encode()` does (once per call).
        """
        texts = list(inputs)
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"inputs[{index}] must be a string, got {type(text).__name__}.")
        # The trainer's per-column budget (queries vs passages) and the batch's drawn g; the model's
        # `resolve` defaults and checks them, as for its own `encode()`.
        options = {name: kwargs[name] for name in self.forward_kwargs if kwargs.get(name) is not None}
        try:
            features = self.model.prepare_features(texts, prompt=prompt or None, max_length=kwargs.get("max_length"),
                                                   **options)
        except (TypeError, ValueError) as error:
            raise in_sentence_transformers_terms(error) from None
        truncated = getattr(features, "truncated", None)
        # Training batches are truncated on purpose (the trainer's per-column budgets): no warning.
        if not self.training and not self._truncation_reported and truncated is not None and truncated.any():
            self._truncation_reported = True
            warn_truncated(int(truncated.sum()), len(texts), features.max_length, stacklevel=2,
                           detail=" (counted in the first batch that truncated; this call reports no more)")
        return features

    def forward(self, features: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        inputs = {name: features[name] for name in self.model.forward_input_names if name in features}
        options = {name: kwargs[name] for name in self.model.forward_options if kwargs.get(name) is not None}
        output = self.model(**inputs, **options)
        features["sentence_embedding"] = output.embeddings
        # LMK gives token states, except in windows (per row, not per text); recurrent models give none
        # (the vertical schedule keeps only each layer's state, never every token's).
        states = getattr(output, "last_hidden_state", None)
        if states is not None and "window_document" not in inputs:
            features["token_embeddings"] = states
        return features

    def save(self, output_path: str, *args, **kwargs) -> None:
        """Write the model (safetensors, always), its tokenizer and this module's config. The model's
        save_pretrained saves the tokenizer too, with its options mirrored from the config."""
        self.model.save_pretrained(output_path, safe_serialization=True, sentence_transformers_files=False)
        self.save_config(output_path)

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
        backend: str = "torch",
        **kwargs,
    ) -> "EmbedderModule":
        """Load the checkpoint's model and tokenizer. sentence-transformers passes its `backend` here:
        "onnx" (LMK checkpoints) runs the checkpoint's exported graph on ONNX Runtime, with the
        options in `model_kwargs` (`file_name`, `provider`, `num_threads`)."""
        hub_kwargs = {
            "subfolder": subfolder,
            "token": token,
            "cache_dir": cache_folder,
            "revision": revision,
            "local_files_only": local_files_only,
        }
        config = cls.load_config(
            model_name_or_path,
            subfolder=subfolder,
            token=token,
            cache_folder=cache_folder,
            revision=revision,
            local_files_only=local_files_only,
        )
        model_kwargs = dict(model_kwargs or {})
        if backend != "torch":
            if config.get("family") != "lmk_embedder":
                raise ValueError(f"backend={backend!r} is for LMK checkpoints; this one is {config.get('family')!r} "
                                 "(recurrent checkpoints run on torch: leave `backend` out).")
            model_kwargs["backend"] = backend
        model = AutoModel.from_pretrained(
            model_name_or_path, trust_remote_code=trust_remote_code, **hub_kwargs, **model_kwargs
        )
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code, **hub_kwargs)
        return cls(model, tokenizer, **config)
