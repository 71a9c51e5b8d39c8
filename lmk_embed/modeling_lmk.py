"""LMKModel: an encoder backbone with landmark pooling ("LMK > CLS", arXiv 2601.21525) and its baselines.

The embedding is the mean of the final hidden states at the landmark positions (Algorithm 2),
then optionally L2-normalised. The baselines share the same code path and differ only in the
token layout the tokenizer builds and in the pooler module:

    lmk, mean@k, multi_cls   mean over `landmark_mask`     (layouts: see tokenization_lmk.py)
    cls                      the [CLS] state
    mean                     mean over `attention_mask`
    latent_attention         NV-Embed: tokens cross-attend to trainable latents, MLP, then mean

Past the backbone's positions (`config.position_extension`): an absolute table gains N extended rows
after its original ones (`extended_position_table`), and `extended_position_ids` sends each input to
the original rows when it fits them, else to the extended rows. Rotary backbones use their own
dynamic NTK rope scaling, which leaves inputs within the original length untouched.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModel, PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_lmk import CHUNK_ALIGNED_POOLINGS, SPLITTERS, LMKConfig
from .encoding import EncoderMixin, check_choice, check_positive_int
from .tokenization_lmk import LMKTokenizer



def extended_position_table(original: torch.Tensor, method: str, max_positions: int) -> torch.Tensor:
    """The N = `max_positions` extended rows [N, D], made from the Lo usable original rows `original` [Lo, D]:

        interpolate   row j = the original table read at j * (Lo - 1) / (N - 1), linearly interpolated
        group         row j = original[j * Lo // N]
        recurrent     row j = original[j % Lo]
    """
    num_original, rows = original.shape[0], torch.arange(max_positions)
    if method == "recurrent":
        return original[rows % num_original].clone()
    if method == "group":
        return original[rows * num_original // max_positions].clone()
    if method != "interpolate":
        raise ValueError(f"Unknown position extension {method!r} for an absolute position table.")
    where = rows.double() * (num_original - 1) / (max_positions - 1)
    left = where.floor().long().clamp(max=num_original - 1)
    right = (left + 1).clamp(max=num_original - 1)
    weight = (where - left).to(original.dtype).unsqueeze(-1)
    return original[left] * (1 - weight) + original[right] * weight


def extended_position_ids(attention_mask: torch.Tensor, extension: dict, positions: torch.Tensor | None = None,
                          lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Position ids [B, T] for right-padded rows (`attention_mask` [B, T]) on an extended table.

    A row of L <= Lo tokens reads the original rows (`position_offset + p`): it is the base model,
    exactly. A longer row reads the extended rows, which start at `first_row`:

        recurrent            first_row + p: one row per position
        interpolate, group   first_row + round(p (N - 1) / (L - 1)): the input spans the whole table,
                             so the scale follows its length (PI / GP with s = L / Lo), and a
                             513-token input reads almost the same vectors as a 512-token one

    `positions` [B, T] and `lengths` [B, 1] default to 0..T-1 and each row's token count. Training
    with skipped positions (PoSE) passes a short row's virtual positions and length instead.
    """
    if lengths is None:
        lengths = attention_mask.sum(-1, keepdim=True)
    if positions is None:
        positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device).unsqueeze(0)
    first, original, maximum = extension["first_row"], extension["original_positions"], extension["max_positions"]
    if extension["method"] == "recurrent":
        extended = first + positions
    else:
        scale = (maximum - 1) / (lengths - 1).clamp(min=1).double()
        extended = first + torch.round(positions * scale).long()
    ids = torch.where(lengths <= original, extension["position_offset"] + positions, extended)
    return ids.clamp(max=first + maximum - 1)  # padding columns past a row's end


def masked_mean(hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `hidden_states` [B, T, D] over the positions where `mask` [B, T] is 1, in float32 -> [B, D]."""
    weights = mask.to(torch.float32).unsqueeze(-1)
    return (hidden_states.float() * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class Pooling(nn.Module):
    """Base of the poolers: forward(hidden_states [B, T, D], attention_mask [B, T], landmark_mask [B, T]) -> [B, D]."""

    def __init__(self, config: LMKConfig):
        super().__init__()


class LandmarkPooling(Pooling):
    """LMK (Algorithm 2): the mean of the landmark states."""

    def forward(self, hidden_states, attention_mask, landmark_mask):
        return masked_mean(hidden_states, landmark_mask)


class MeanAtKPooling(LandmarkPooling):
    """Mean@k: the mean of every k-th content token's state; no landmark tokens are inserted."""


class MultiCLSPooling(LandmarkPooling):
    """MultiCLS: a CLS opens every chunk at inference (a CLS-trained model); the mean of the CLS states."""


class CLSPooling(Pooling):
    """The first ([CLS]) state."""

    def forward(self, hidden_states, attention_mask, landmark_mask):
        return hidden_states[:, 0].float()


class MeanPooling(Pooling):
    """The mean over all non-padding tokens."""

    def forward(self, hidden_states, attention_mask, landmark_mask):
        return masked_mean(hidden_states, attention_mask)


class LatentAttentionPooling(Pooling):
    """NV-Embed's latent attention: each token attends to `num_latents` trainable latents
    (keys and values), then a GELU MLP, both residual, then the mean over tokens."""

    def __init__(self, config: LMKConfig):
        super().__init__(config)
        hidden = config.embedding_dim
        if hidden % config.latent_heads:
            raise ValueError(
                f"`latent_heads`={config.latent_heads} must divide the backbone hidden size {hidden}."
            )
        self.latents = nn.Parameter(torch.empty(config.num_latents, hidden))  # set in `_init_weights`
        self.attention = nn.MultiheadAttention(hidden, config.latent_heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, hidden_states, attention_mask, landmark_mask):
        latents = self.latents.to(hidden_states.dtype).unsqueeze(0).expand(hidden_states.shape[0], -1, -1)
        attended, _ = self.attention(hidden_states, latents, latents, need_weights=False)
        hidden_states = hidden_states + attended
        hidden_states = hidden_states + self.mlp(hidden_states)
        return masked_mean(hidden_states, attention_mask)


POOLERS = {
    "lmk": LandmarkPooling,
    "mean@k": MeanAtKPooling,
    "multi_cls": MultiCLSPooling,
    "cls": CLSPooling,
    "mean": MeanPooling,
    "latent_attention": LatentAttentionPooling,
}


@dataclass
class LMKOutput(ModelOutput):
    """embeddings: [B, D] float32 pooled (not normalised); last_hidden_state: [B, T, D]."""

    embeddings: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None


class LMKPreTrainedModel(PreTrainedModel):
    config_class = LMKConfig
    base_model_prefix = "lmk"
    supports_gradient_checkpointing = True
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module):
        # The backbone initialises itself; only the latent-attention pooler is ours. Its children
        # are handled here because `apply` reaches the parent after them.
        if isinstance(module, LatentAttentionPooling):
            nn.init.normal_(module.latents, std=0.02)
            # Private, but MultiheadAttention has no public re-init of in_proj and the biases.
            module.attention._reset_parameters()
            for layer in (module.attention.out_proj, *module.mlp):
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()


class LMKModel(EncoderMixin, LMKPreTrainedModel):
    """Encoder backbone + landmark pooling, with a generate-free `encode()`.

    Inputs: input_ids, attention_mask, landmark_mask, all [B, T] (from `LMKTokenizer`).
    """

    output_values = ("embedding", "landmarks")
    tokenizer_class = LMKTokenizer
    forward_input_names = ("input_ids", "attention_mask", "landmark_mask", "position_ids")  # position_ids: optional

    def __init__(self, config: LMKConfig):
        super().__init__(config)
        config.check()
        try:  # BERT-style poolers are never used: leave them out (DDP needs every parameter used)
            self.backbone = AutoModel.from_config(config.backbone_config, add_pooling_layer=False)
        except TypeError:
            self.backbone = AutoModel.from_config(config.backbone_config)
        self.pooler = POOLERS[config.pooling](config)
        self._tokenizer = None
        self._granularity_draws = random.Random(config.splitter_seed)  # the `variable` splitter's g per batch
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, backend: str = "torch", **kwargs):
        """`PreTrainedModel.from_pretrained` (`backend="torch"`), or with `backend="onnx"` the checkpoint's
        exported graph on ONNX Runtime: an `LMKOnnxModel` with the same tokenizer and `encode()`, and
        `file_name` / `provider` / `num_threads` options (see onnx_backend.py)."""
        if backend == "torch":
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        from .onnx_backend import load_onnx_model

        return load_onnx_model(pretrained_model_name_or_path, *model_args, backend=backend, **kwargs)

    # ---- forward ------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        landmark_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> LMKOutput:
        """input_ids / attention_mask / landmark_mask: [B, T] -> LMKOutput(embeddings [B, D])."""
        if attention_mask is None:
            reference = input_ids if input_ids is not None else inputs_embeds[..., 0]
            attention_mask = torch.ones(reference.shape[:2], dtype=torch.long, device=reference.device)
        if landmark_mask is None and isinstance(self.pooler, LandmarkPooling):
            raise ValueError(f"`landmark_mask` is required for pooling={self.config.pooling!r}; use LMKTokenizer.")
        extension = self.config.position_extension
        if extension is not None and "first_row" in extension and kwargs.get("position_ids") is None:
            kwargs["position_ids"] = extended_position_ids(attention_mask, extension)
        hidden_states = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
        ).last_hidden_state
        embeddings = self.pooler(hidden_states, attention_mask, landmark_mask)
        return LMKOutput(embeddings=embeddings, last_hidden_state=hidden_states)

    # ---- inputs -------------------------------------------------------------------------------

    def max_positions(self) -> int | None:
        """The one position limit: `position_extension.max_positions` when the backbone was
        extended, else the backbone's own table (less a padding offset); None for no hard limit."""
        if self.config.position_extension is not None:
            return int(self.config.position_extension["max_positions"])
        return super().max_positions()

    def default_max_length(self) -> int | None:
        """config.max_length, else the smaller of the tokenizer's limit and `max_positions()`."""
        if self.config.max_length is not None:
            return int(self.config.max_length)
        limits = [limit for limit in (self.tokenizer.default_max_length(), self.max_positions()) if limit is not None]
        return min(limits) if limits else None

    def _tokenize(self, texts, *, prompt=None, granularity=None, splitter=None, max_length=None, training=False,
                  with_spans=False):
        pooling = self.config.pooling
        splitter = self.config.splitter if splitter is None else splitter
        if training:
            if pooling == "multi_cls":  # MultiCLS adds its extra CLS tokens at inference only
                pooling = "cls"
        elif splitter == "variable":  # drawing g is for training; inference uses the configured g
            splitter = "fixed"
        if granularity is None:
            # Training with `variable` and no g given (the trainer passes one per batch): draw one now.
            granularity = self.config.granularity if splitter != "variable" else self.draw_granularity()
        # Every option comes from the config (or the call): the tokenizer's own defaults are not read.
        return self.tokenizer.build_layout(
            texts,
            pooling=pooling,
            granularity=granularity,
            splitter=splitter,
            max_length=self.default_max_length() if max_length is None else max_length,
            prompt=prompt,
            with_spans=with_spans,
            landmark=self.config.landmark_token,
        )

    def draw_granularity(self) -> int | None:
        """The `variable` splitter's g for one training batch, drawn from `config.granularities` with a
        generator seeded by `config.splitter_seed`; None for the other splitters. The trainer passes
        it to every column of the batch (`prepare_features(..., granularity=g)`)."""
        if self.config.splitter != "variable":
            return None
        return self._granularity_draws.choice(self.config.granularities)

    def prepare_features(self, texts: list[str], prompt: str | None = None, training: bool | None = None, **options):
        """Tokenize a batch into model inputs: dict of [B, T] tensors (used by the ST module).

        `training` picks the training layout (MultiCLS without its extra CLS tokens, a drawn g);
        None follows the model's mode, `self.training`, which the ST module's train()/eval() sets.
        """
        training = self.training if training is None else training
        return self._tokenize(texts, prompt=prompt, training=training, **options).tensors()

    # ---- encode -------------------------------------------------------------------------------

    def encode(
        self,
        texts,
        batch_size: int = 32,
        max_length: int | None = None,
        granularity: int | None = None,
        splitter: str | None = None,
        normalize: bool | None = None,
        prompt: str | None = None,
        show_progress_bar: bool | None = None,
        convert_to_tensor: bool = False,
        device: str | torch.device | None = None,
        output_value: str = "embedding",
    ):
        """Embed `texts` (a string or a list of strings).

        Returns float32 `[N, D]` (numpy, or a tensor with `convert_to_tensor=True`), `[D]` for one
        string. `granularity` / `splitter` override the config for this call; `normalize=None`
        follows `config.normalize`. `output_value="landmarks"` returns, per text,
        `{"embeddings": [n_landmarks, D], "spans": [(start, end), ...]}`: the vector of each
        landmark and the character span of the chunk it closes (chunk vectors from one pass).
        """
        return self._run_encode(
            texts,
            batch_size=batch_size,
            normalize=normalize,
            prompt=prompt,
            show_progress_bar=show_progress_bar,
            convert_to_tensor=convert_to_tensor,
            device=device,
            output_value=output_value,
            options={"max_length": max_length, "granularity": granularity, "splitter": splitter},
        )

    def sentence_transformers_prompts(self) -> dict[str, str]:
        """The prompts written to config_sentence_transformers.json."""
        return {"query": self.config.query_prompt, "document": self.config.document_prompt}

    def encode_query(self, queries, **kwargs):
        """`encode` with `config.query_prompt` prepended."""
        return self.encode(queries, prompt=self.config.query_prompt or None, **kwargs)

    def encode_document(self, documents, **kwargs):
        """`encode` with `config.document_prompt` prepended."""
        return self.encode(documents, prompt=self.config.document_prompt or None, **kwargs)

    def _prepare_encode(self, *, prompt, output_value, max_length, granularity, splitter) -> dict:
        if granularity is not None:
            check_positive_int("granularity", granularity)
        if splitter is not None:
            check_choice("splitter", splitter, SPLITTERS)
        self.tokenizer.check_max_length(max_length)
        if output_value == "landmarks" and self.config.pooling not in CHUNK_ALIGNED_POOLINGS:
            raise ValueError(
                f"`output_value='landmarks'` needs chunk-aligned pooling (lmk, mean@k), not {self.config.pooling!r}."
            )
        if self.config.pooling == "lmk":
            _ = self.tokenizer.landmark_id(self.config.landmark_token)  # a clear error without SEP/EOS
        return {
            "prompt": prompt,
            "output_value": output_value,
            "max_length": self.default_max_length() if max_length is None else max_length,
            "granularity": granularity,
            "splitter": splitter,
        }

    def _embed_texts(self, texts: list[str], plan: dict):
        with_spans = plan["output_value"] == "landmarks"
        batch = self._tokenize(
            texts,
            prompt=plan["prompt"],
            granularity=plan["granularity"],
            splitter=plan["splitter"],
            max_length=plan["max_length"],
            with_spans=with_spans,
        )
        plan["num_truncated"] += int(batch.truncated.sum())
        features = batch.tensors(self.device)
        output = self(**features)
        if not with_spans:
            return output.embeddings
        hidden, mask = output.last_hidden_state, features["landmark_mask"].bool()
        return [(hidden[row][mask[row]], batch.spans[row]) for row in range(len(texts))]


__all__ = ["LMKModel", "LMKPreTrainedModel", "LMKOutput", "POOLERS"]
