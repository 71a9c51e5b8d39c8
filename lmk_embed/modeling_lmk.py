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

from .configuration_lmk import (LMK_OPTIONS, OPTION, SPLITTERS, LMKConfig, check_lmk_max_length, check_long_input,
                                check_window_length)
from .encoding import EncoderMixin, call_options, check_choice, check_prompt, max_length_default
# onnx_backend.py imports no model file, so nothing circles back; this import also ships it in every checkpoint.
from .onnx_backend import OnnxGraph, load_onnx_model
from .tokenization_lmk import LayoutOptions, LMKTokenizer, cut_windows


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


def late_chunk_states(hidden_states: torch.Tensor, chunk_of: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """Late chunking (Günther et al., arXiv 2409.04701): per row, the mean of the final states of each
    chunk's content tokens, read in the row's context.

    hidden_states [R, T, D], chunk_of [R, T] (each content token's chunk within its text, -1 elsewhere;
    a row holds consecutive chunks), attention_mask [R, T] -> per row [n_r, D] float32, its chunks in
    order. A row without content tokens (an empty text) gives one vector, the mean of its attended states.
    """
    states = []
    for row in range(hidden_states.shape[0]):
        content = chunk_of[row] >= 0
        if not bool(content.any()):
            states.append(masked_mean(hidden_states[row : row + 1], attention_mask[row : row + 1]))
            continue
        chunks = chunk_of[row][content]
        local = chunks - chunks.min()
        count = int(local.max()) + 1
        totals = hidden_states.new_zeros(count, hidden_states.shape[-1], dtype=torch.float32)
        totals.index_add_(0, local, hidden_states[row][content].float())
        sizes = torch.bincount(local, minlength=count).clamp(min=1).to(torch.float32)
        states.append(totals / sizes[:, None])
    return states


# The `windows` schedule's rows per forward, at least (more when the batch holds more texts).
WINDOWS_PER_FORWARD = 16


def combine_windows(row_embeddings: torch.Tensor, landmark_mask: torch.Tensor, window_document: torch.Tensor) -> torch.Tensor:
    """The `windows` schedule's pooling: the mean of every landmark state of a document's windows.

    row_embeddings [R, D] (each window's landmark mean), landmark_mask [R, T], window_document [R]
    (the document of each row, 0..B-1) -> [B, D]: the rows' means weighted by their landmark counts.
    """
    counts = landmark_mask.sum(-1).to(row_embeddings.dtype)
    num_documents = int(window_document.max()) + 1 if len(window_document) else 0
    totals = row_embeddings.new_zeros(num_documents, row_embeddings.shape[-1])
    totals.index_add_(0, window_document, row_embeddings * counts[:, None])
    weights = counts.new_zeros(num_documents).index_add_(0, window_document, counts)
    return totals / weights.clamp(min=1)[:, None]


@dataclass(frozen=True)
class LMKRequest:
    """One call's options, resolved once by `LMKModel.resolve`: `layout` (what the tokenizer builds, its
    `max_length` the whole text's budget), `long_input` ("one-pass" or "windows"), `window_length`
    (W, for windows; else None) and `output_value`."""

    layout: LayoutOptions
    long_input: str
    window_length: int | None
    output_value: str = "embedding"

    @property
    def max_length(self) -> int | None:
        return self.layout.max_length


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
            attention = module.attention  # what MultiheadAttention's own (private) reset does, in public calls
            nn.init.xavier_uniform_(attention.in_proj_weight)
            nn.init.zeros_(attention.in_proj_bias)
            for layer in (attention.out_proj, *module.mlp):
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()
            nn.init.zeros_(attention.out_proj.bias)


class LMKModel(EncoderMixin, LMKPreTrainedModel):
    """Encoder backbone + landmark pooling, with a generate-free `encode()`.

    Inputs: input_ids, attention_mask, landmark_mask, all [B, T] (from `LMKTokenizer`).

    Two steps make and run the torch weights: `build_torch_weights` (in `__init__`) and `embed_rows` (in
    `forward`). A subclass that computes the rows elsewhere (`LMKOnnxModel`, on ONNX Runtime) passes
    `build_weights=False` and overrides `embed_rows` (and what reads the backbone: `max_positions`,
    `device`); the rest (config, tokenizer, `forward`, `encode()`) is this class's.
    """

    # landmarks: the landmark states; late_chunks: each chunk's content-token mean, from the same pass
    output_values = ("embedding", "landmarks", "late_chunks")
    preprocess_options = call_options(LMK_OPTIONS)  # they shape the inputs
    tokenizer_class = LMKTokenizer
    # position_ids and window_document are optional
    forward_input_names = ("input_ids", "attention_mask", "landmark_mask", "position_ids", "window_document")

    def __init__(self, config: LMKConfig, build_weights: bool = True):
        """`build_weights=False`: no torch weights (`build_torch_weights` is skipped), for a subclass
        whose `embed_rows` needs none."""
        super().__init__(config)
        config.check()
        self._tokenizer = None
        self._granularity_draws = random.Random(config.splitter_seed)  # the `variable` splitter's g per batch
        if build_weights:
            self.build_torch_weights()
        self.post_init()

    def build_torch_weights(self) -> None:
        """The backbone (from `config.backbone_config`) and the pooler (`config.pooling`)."""
        try:  # BERT-style poolers are never used: leave them out (DDP needs every parameter used)
            self.backbone = AutoModel.from_config(self.config.backbone_config, add_pooling_layer=False)
        except TypeError:
            self.backbone = AutoModel.from_config(self.config.backbone_config)
        self.pooler = POOLERS[self.config.pooling](self.config)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, backend: str = "torch", **kwargs):
        """`PreTrainedModel.from_pretrained` (`backend="torch"`), or with `backend="onnx"` the checkpoint's
        exported graph on ONNX Runtime: an `LMKOnnxModel` with the same tokenizer and `encode()`, and
        `file_name` / `provider` / `num_threads` options (see onnx_backend.py)."""
        if backend == "torch":
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        return load_onnx_model(LMKOnnxModel, pretrained_model_name_or_path, *model_args, backend=backend, **kwargs)

    # ---- forward ------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        landmark_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        window_document: torch.Tensor | None = None,
        **kwargs,
    ) -> LMKOutput:
        """input_ids / attention_mask / landmark_mask: [B, T] -> LMKOutput(embeddings [B, D]).

        With `window_document` [R] (rows are windows of documents, `long_input="windows"`), the rows
        run in bounded groups (`embed_windows`, as in `encode()`), the embeddings are per document,
        [documents, D], and there is no `last_hidden_state` (every window's states at once is what
        the groups avoid holding)."""
        if window_document is not None:
            if inputs_embeds is not None:
                raise ValueError("`window_document` takes `input_ids` (windows are cut from token ids), not `inputs_embeds`.")
            features = {"input_ids": input_ids, "attention_mask": attention_mask, "landmark_mask": landmark_mask,
                        "window_document": window_document, **kwargs}
            embeddings, _ = self.embed_windows(features, int(window_document.max()) + 1 if len(window_document) else 0)
            return LMKOutput(embeddings=embeddings)
        embeddings, hidden_states = self.embed_rows(input_ids, attention_mask, landmark_mask, inputs_embeds, **kwargs)
        return LMKOutput(embeddings=embeddings, last_hidden_state=hidden_states)

    def embed_windows(self, features: dict, num_texts: int, with_states: bool = False,
                      chunk_of: torch.Tensor | None = None):
        """The `windows` schedule's one loop, for `encode()` and `forward(window_document=...)` (the
        sentence-transformers module) alike: the rows of `features` ([R, T] tensors and
        `window_document` [R]) run in groups of `max(num_texts, WINDOWS_PER_FORWARD)`, each trimmed to
        its longest row, so a forward holds one group's activations however long the document.

        -> (per text [num_texts, D], the mean of its windows' landmark states; with `with_states`, per
        row its landmark states [n_r, D], or with `chunk_of` [R, T] its late chunks (`late_chunk_states`),
        else None)."""
        rows = features["input_ids"].shape[0]
        step = max(num_texts, WINDOWS_PER_FORWARD)
        names = [name for name in ("input_ids", "attention_mask", "landmark_mask", "position_ids") if name in features]
        pooled, states = [], [] if with_states or chunk_of is not None else None
        for start in range(0, rows, step):
            part = slice(start, start + step)
            width = int(features["attention_mask"][part].sum(-1).max())
            inputs = {name: features[name][part, :width] for name in names}
            embeddings, hidden_states = self.embed_rows(**inputs)
            pooled.append(embeddings)
            if chunk_of is not None:
                states += late_chunk_states(hidden_states, chunk_of[part, :width], inputs["attention_mask"])
            elif with_states:
                mask = inputs["landmark_mask"].bool()
                states += [hidden_states[row][mask[row]] for row in range(mask.shape[0])]
            del hidden_states  # the next group reuses its memory
        return combine_windows(torch.cat(pooled), features["landmark_mask"], features["window_document"]), states

    def embed_rows(self, input_ids=None, attention_mask=None, landmark_mask=None, inputs_embeds=None,
                   **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """What the weights compute, row by row: -> (pooled embeddings [B, D], last_hidden_state [B, T, D])."""
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
        return self.pooler(hidden_states, attention_mask, landmark_mask), hidden_states

    # ---- inputs -------------------------------------------------------------------------------

    def max_positions(self) -> int | None:
        """The one position limit: `position_extension.max_positions` when the backbone was
        extended, else the backbone's own table (less a padding offset); None for no hard limit."""
        if self.config.position_extension is not None:
            return int(self.config.position_extension["max_positions"])
        return super().max_positions()

    def default_max_length(self, long_input: str = "one-pass") -> int | None:
        """`max_length`'s default (`max_length_default`): `config.max_length`, else, for one pass, the
        smaller of the tokenizer's limit and `max_positions()` (None: neither has one); read by windows,
        a text has no position limit, so None (the whole text)."""
        if long_input == "windows":
            return max_length_default(self.config.max_length)
        return max_length_default(self.config.max_length, self.tokenizer.max_length_limit(), self.max_positions())

    def original_positions(self) -> int | None:
        """The positions the backbone was pretrained with: the original rows of an extended table, else
        the smaller of the tokenizer's limit and `max_positions()` (None: no limit known). The default
        window length."""
        if self.config.position_extension is not None:
            return int(self.config.position_extension["original_positions"])
        return max_length_default(None, self.tokenizer.max_length_limit(), self.max_positions())

    def resolve(self, *, max_length: int | None = None, granularity: int | None = None, splitter: str | None = None,
                long_input: str | None = None, window_length: int | None = None, prompt: str | None = None,
                output_value: str = "embedding", training: bool = False) -> LMKRequest:
        """The one place a call's options are defaulted (from the config) and checked.

        Inference: `variable` reads the configured g. Training (`training=True`): MultiCLS takes the CLS
        layout, `variable` draws g unless the caller passes the batch's draw, and texts are read in one
        pass at the trainer's budget. `one-pass`: `max_length` defaults to `default_max_length()` and must
        fit the position table. `windows`: `max_length` (default `config.max_length`, None: the whole
        text) is the document's budget and W (`window_length`, default `config.window_length`, else
        `original_positions()`) must fit the table (and hold a chunk, for the texts cut into windows);
        one pass refuses a `window_length`.
        """
        config = self.config
        check_prompt(prompt)
        check_choice("output_value", output_value, self.output_values)
        splitter = check_choice("splitter", config.splitter if splitter is None else splitter, SPLITTERS)
        # Training reads one pass unless the call asks for windows (a long-page recipe trains in its schedule).
        default_long_input = "one-pass" if training else config.long_input
        long_input = check_long_input(default_long_input if long_input is None else long_input, config.pooling)
        if granularity is not None:
            granularity = OPTION["granularity"].check(granularity, config)
        elif training and splitter == "variable":
            granularity = self.draw_granularity()
        else:
            granularity = config.granularity
        pooling = "cls" if training and config.pooling == "multi_cls" else config.pooling  # MultiCLS: inference only
        # defaulted first, then checked: a default meets the argument's rule
        name = "max_length" if max_length is not None else "config.max_length"
        max_length = self.default_max_length(long_input) if max_length is None else max_length
        if long_input == "windows":
            window_name = "window_length" if window_length is not None else "config.window_length"
            if window_length is None and output_value != "embedding" and config.index_window_length is not None:
                window_length, window_name = config.index_window_length, "config.index_window_length"  # chosen for search
            window_length = config.window_length if window_length is None else window_length
            if window_length is None:
                window_length = self.original_positions()
                window_name = "the default window length"
            if window_length is None:
                raise ValueError("`long_input='windows'` needs `window_length`: the backbone reports no position limit.")
            # A W that cannot hold one chunk of g is refused by `cut_windows` for the texts it must cut:
            # a text that fits one window is read whatever g.
            window_length = check_window_length(window_length, window_name, self.max_positions())
            max_length = check_lmk_max_length(max_length, name=name)  # the document's budget: no position limit
        else:
            if window_length is not None:  # read by windows only: refused rather than silently ignored
                raise ValueError(f"`window_length` is the window of long_input='windows', but this call reads in one "
                                 f"pass (long_input='one-pass'): pass long_input='windows' or leave window_length out.")
            max_length = check_lmk_max_length(max_length, self.max_positions(), name)
        layout = LayoutOptions(pooling, granularity, "sentence" if splitter == "sentence" else "fixed", max_length,
                               config.landmark_token, prompt, output_value == "landmarks",
                               output_value == "late_chunks")
        return LMKRequest(layout.checked(self.tokenizer), long_input, window_length, output_value)

    def tokenize(self, texts: list[str], request: LMKRequest):
        """`texts` in the landmark layout of `request` (a `LandmarkBatch`); with `windows`, texts longer
        than W are cut into windows (rows) of whole chunks (`cut_windows`)."""
        batch = self.tokenizer.layout(texts, request.layout)
        if request.long_input == "windows":
            tokenizer = self.tokenizer
            batch = cut_windows(batch, request.window_length, tokenizer.start_token_id is not None,
                                tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        return batch

    def draw_granularity(self) -> int | None:
        """The `variable` splitter's g for one training batch, drawn from `config.granularities` with a
        generator seeded by `config.splitter_seed`; None for the other splitters. The trainer passes
        it to every column of the batch (`prepare_features(..., granularity=g)`); `resolve(training=True)`
        draws one itself when no g is given."""
        if self.config.splitter != "variable":
            return None
        return self._granularity_draws.choice(self.config.granularities)

    def prepare_features(self, texts: list[str], prompt: str | None = None, training: bool | None = None, **options):
        """Tokenize a batch into model inputs: dict of [rows, T] tensors (used by the ST module).

        `options` are `resolve`'s. `training` picks the training layout (MultiCLS without its extra
        CLS tokens, a drawn g); None follows the model's mode, `self.training`, which the ST module's
        train()/eval() sets.
        """
        training = self.training if training is None else training
        return self.tokenize(texts, self.resolve(prompt=prompt, training=training, **options)).tensors()

    # ---- encode -------------------------------------------------------------------------------

    def encode(
        self,
        texts,
        batch_size: int = 32,
        max_length: int | None = None,
        granularity: int | None = None,
        splitter: str | None = None,
        long_input: str | None = None,
        window_length: int | None = None,
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
        `output_value="late_chunks"` returns the same per text, with each chunk's vector the mean of its
        content tokens' final states, read in context (late chunking; any pooling, no training needed).
        `long_input` ("one-pass" or "windows") and `window_length` override the config (see `resolve`).
        """
        request = self.resolve(max_length=max_length, granularity=granularity, splitter=splitter, long_input=long_input,
                               window_length=window_length, prompt=prompt, output_value=output_value)
        return self._run_encode(texts, request, batch_size=batch_size, normalize=normalize,
                                show_progress_bar=show_progress_bar, convert_to_tensor=convert_to_tensor, device=device)

    def sentence_transformers_prompts(self) -> dict[str, str]:
        """The prompts written to config_sentence_transformers.json."""
        return {"query": self.config.query_prompt, "document": self.config.document_prompt}

    def encode_query(self, queries, **kwargs):
        """`encode` with `config.query_prompt` prepended."""
        return self.encode(queries, prompt=self.config.query_prompt or None, **kwargs)

    def _embed_texts(self, texts: list[str], request: LMKRequest):
        """One batch -> (embeddings [b, D], or per text (landmark states [n_i, D], spans); truncated count).
        Texts cut into windows run through `embed_windows`; a batch without windows is one forward."""
        batch = self.tokenize(texts, request)
        features = batch.tensors(self.device)
        with_spans = request.output_value != "embedding"
        chunk_of = torch.from_numpy(batch.chunk_of).to(self.device) if batch.chunk_of is not None else None
        truncated = int(batch.truncated.sum())
        if batch.window_document is not None:
            embeddings, states = self.embed_windows(features, len(texts), with_states=with_spans, chunk_of=chunk_of)
            if not with_spans:
                return embeddings, truncated
            per_text = [[] for _ in texts]
            for row, text in enumerate(batch.window_document.tolist()):
                per_text[text].append(states[row])
            return [(torch.cat(parts), spans) for parts, spans in zip(per_text, batch.spans)], truncated
        output = self(input_ids=features["input_ids"], attention_mask=features["attention_mask"],
                      landmark_mask=features["landmark_mask"])
        if not with_spans:
            return output.embeddings, truncated
        if chunk_of is not None:
            return list(zip(late_chunk_states(output.last_hidden_state, chunk_of, features["attention_mask"]),
                            batch.spans)), truncated
        mask = features["landmark_mask"].bool()
        states = [output.last_hidden_state[row][mask[row]] for row in range(mask.shape[0])]
        return list(zip(states, batch.spans)), truncated


class LMKOnnxModel(LMKModel):
    """`LMKModel` whose rows run an exported graph on ONNX Runtime (`OnnxGraph`, onnx_backend.py):
    inference only, CPU tensors in and out. `LMKModel.from_pretrained(..., backend="onnx")` builds it.

    Everything else is LMKModel's: the config, the tokenizer (loaded from the checkpoint on first use),
    `encode()` with its options and batching, `prepare_features`, the sentence-transformers module's
    calls, `forward` (windows included). It holds no torch weights (`build_weights=False`); training,
    saving and moving it to another device are refused.
    """

    def __init__(self, config: LMKConfig, graph: OnnxGraph):
        super().__init__(config, build_weights=False)  # the graph stands for the weights
        self.graph = graph
        self.eval()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`load_onnx_model` (this class is never loaded from torch weights)."""
        return load_onnx_model(cls, pretrained_model_name_or_path, *model_args, **kwargs)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def max_positions(self) -> int | None:
        return self.graph.max_positions()

    def to(self, *args, **kwargs):
        """Only the CPU (where the session's tensors live); the execution provider is `provider=` at load."""
        for value in (*args, kwargs.get("device")):
            if value is None or isinstance(value, torch.dtype):
                if value not in (None, torch.float32):
                    raise ValueError(f"backend='onnx' runs the graph's own dtype (float32 in and out), not {value}.")
                continue
            if torch.device(value).type != "cpu":
                raise ValueError(f"backend='onnx' takes CPU tensors, not device {value!r}; the execution provider is "
                                 "chosen at load (`provider=`).")
        return self

    def train(self, mode: bool = True):
        if mode:
            raise RuntimeError("backend='onnx' is for inference only: load the checkpoint without `backend` to train it.")
        return super().train(False)

    def save_pretrained(self, *args, **kwargs):
        raise NotImplementedError("backend='onnx' holds no torch weights to save: load the checkpoint without `backend` "
                                  "to save it, and write its graphs with `lmk-embed export-onnx`.")

    def embed_rows(self, input_ids=None, attention_mask=None, landmark_mask=None, inputs_embeds=None,
                   **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T] -> (pooled [B, D], last_hidden_state [B, T, D]), from the graph."""
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("backend='onnx' takes `input_ids` (the graph embeds them itself), not `inputs_embeds`.")
        if kwargs.get("position_ids") is not None:
            raise ValueError("backend='onnx' computes position ids inside the graph: do not pass `position_ids`.")
        return self.graph.embed_rows(input_ids, attention_mask, landmark_mask)


__all__ = ["LMKModel", "LMKOnnxModel", "LMKPreTrainedModel", "LMKOutput", "LMKRequest", "POOLERS", "combine_windows",
           "late_chunk_states"]
