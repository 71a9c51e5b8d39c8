"""RecurrentEmbedModel: a recurrent LM (Mamba2, xLSTM, RWKV) as a text embedder.

"Linear-Time and Constant-Memory Text Embeddings Based on Recurrent Language Models"
(arXiv 2604.18199): EOS is appended to every input and the embedding is the final-layer state at
EOS, optionally L2-normalised. Queries carry an instruction, documents none.

Inference schedules:
    horizontal  the backbone's own forward over the whole sequence, layer by layer.
    vertical    blocks of V tokens pass through all layers before the next block starts; every
                layer carries its recurrent state (Mamba2: conv + SSM state) between blocks, so
                memory is O(layers + V), constant in the sequence length T.
    auto        Mamba2 off CUDA: vertical (our scan is the fast path, one block when the input
                fits). Otherwise horizontal when the longest input fits in one block, vertical beyond.

For Mamba2 the vertical schedule runs the SSD scan of `ssd`: a lean chunked scan (`ssd_chunked`)
written for inference in plain torch, beside the per-token recurrence it must equal (`ssd_reference`);
on CUDA, mamba_ssm's fused scan when the `cuda` extra is installed. RWKV-7 (flash-linear-attention's model,
whose own forward needs Triton on a GPU) runs through the plain-torch path of `modeling_rwkv7`.
Other backbones carry state through their own transformers cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModel, PreTrainedModel
from transformers.utils import ModelOutput

from .compat import (Mamba2MixerParts, Mamba2Parts, NormParts, cache_keyword, carried_cache, check_backbone_internals,
                     mamba2_parts, new_xlstm_cache, select_xlstm_cache_rows)
from .configuration_recurrent import (AUTO, DEFAULT_GPU_CHUNK_SIZE, RECURRENT_OPTIONS, RecurrentEmbedConfig,
                                     auto_block_size, check_block_size, check_schedule)
from .encoding import EncoderMixin, call_options, check_choice, check_prompt, max_length_default
from .modeling_rwkv7 import Rwkv7State, check_rwkv7_backbone, rwkv7_block_step
from .ssd import mamba_chunk_scan_combined  # noqa: F401 - read by benchmarks/gpu_recurrent.py
from .ssd import ssd_scan
from .tokenization_recurrent import RecurrentEmbedTokenizer, iter_text_file


# ---- the state carried from one vertical block to the next --------------------------------------
#
# Each backbone family keeps its state in one small typed structure with `select(rows)`, which keeps
# the rows (sequences) still running when shorter ones have finished; its `StateCarrier` (below)
# runs one block from it.


@dataclass
class Mamba2LayerState:
    """One Mamba2 layer's state after a block.

    conv_state [B, conv_dim, k - 1]: the last k - 1 inputs of the causal conv (all it needs next);
    ssm_state [B, heads, head_dim, state]: the SSM state, float32.
    """

    conv_state: torch.Tensor
    ssm_state: torch.Tensor

    def select(self, rows: torch.Tensor) -> "Mamba2LayerState":
        return Mamba2LayerState(self.conv_state[rows], self.ssm_state[rows])


@dataclass
class Mamba2State:
    """Every Mamba2 layer's state, in layer order. Our own structure rather than transformers'
    `DynamicCache`: its linear-attention layers copy new states in place into fixed buffers, which
    breaks gradients through the carried state, and our mixer step keeps k - 1 conv inputs, not k."""

    layers: list[Mamba2LayerState]

    def select(self, rows: torch.Tensor) -> "Mamba2State":
        return Mamba2State([layer.select(rows) for layer in self.layers])


@dataclass
class XlstmState:
    """transformers' own `xLSTMCache`; per layer `rnn_state[i]` = (C [B, heads, qk, v], n [B, heads, qk], m [B, heads, 1])."""

    cache: object  # xLSTMCache, imported lazily with the xLSTM model

    def select(self, rows: torch.Tensor) -> "XlstmState":
        self.cache = select_xlstm_cache_rows(self.cache, rows)
        return self


@dataclass
class RwkvState:
    """RWKV-4's state as transformers' `RwkvModel` takes and returns it: five [B, hidden, layers]
    tensors (feed-forward shift, attention shift, numerator, denominator, max), layers stacked last."""

    tensors: list[torch.Tensor]

    def select(self, rows: torch.Tensor) -> "RwkvState":
        return RwkvState([t[rows] for t in self.tensors])


CarriedState = Mamba2State | XlstmState | RwkvState | Rwkv7State


# ---- the Mamba2 mixer, block by block (its scan: `ssd`) -----------------------------------------


def causal_conv_with_state(inputs, weight, bias, state):
    """Depthwise causal conv1d that starts from the previous block's last inputs.

    inputs [b, t, channels], weight [channels, k], state [b, channels, k - 1] or None (zeros)
    -> (pre-activation output [b, t, channels], new state [b, channels, k - 1]).

    Written as k shifted multiply-adds in the [b, t, channels] layout: on CPU, conv1d with one group
    per channel is several times slower than this, and needs two transposed copies besides.
    out[l] = bias + sum_j weight[:, j] * padded[l + j], padded = (state, inputs) along time.
    Float32 at least, whatever the weights' dtype: for a bfloat16 model, one rounding fewer than its
    own bf16 conv, float32 passes run faster than bf16 ones on CPU, and the scan reads float32 anyway.
    """
    b, t, channels = inputs.shape
    k = weight.shape[-1]
    dtype = torch.promote_types(weight.dtype, torch.float32)
    previous = inputs.new_zeros(b, k - 1, channels, dtype=dtype) if state is None else state.transpose(1, 2).to(dtype)
    padded = torch.cat([previous, inputs], dim=1)  # [b, t + k - 1, channels], in `dtype` (cat promotes)
    taps = weight.t().to(dtype).contiguous()  # [k, channels]; a strided tap makes each pass several times slower
    out = padded[:, k - 1 :] * taps[k - 1] if bias is None else torch.addcmul(bias.to(dtype), padded[:, k - 1 :], taps[k - 1])
    for j in range(k - 1):
        out = torch.addcmul(out, padded[:, j : j + t], taps[j])
    return out, padded[:, t:].transpose(1, 2).clone()  # a copy: a view would keep `padded` alive


def rms_norm(norm: NormParts, hidden, gate=None):
    """transformers' Mamba2 RMSNorm (gate None) or gated RMSNorm (`norm(hidden, gate)`, normalised per
    group of `norm.group_size`), with torch's fused `rms_norm` (one pass instead of five).

    hidden [b, t, width], gate [b, t, width] or None -> [b, t, width]. As transformers does: float32
    inside, then cast back to hidden's dtype and times the weight (float32 throughout: the fused
    weighted form).
    """
    dtype = hidden.dtype
    hidden = hidden.float()
    width = hidden.shape[-1]
    group = width
    if gate is not None:
        hidden = hidden * F.silu(gate.float())
        group = norm.group_size  # only the gated norm has groups
    if group == width and dtype == norm.weight.dtype == torch.float32:
        return F.rms_norm(hidden, (width,), norm.weight, norm.eps)
    normed = F.rms_norm(hidden.unflatten(-1, (width // group, group)), (group,), None, norm.eps)
    return norm.weight * normed.flatten(-2).to(dtype)


def mamba2_mixer_step(mixer: Mamba2MixerParts, hidden_states, state: Mamba2LayerState | None, chunk_size: int):
    """One Mamba2 mixer over a block hidden_states [b, t, d] from `state` (None: zeros)
    -> (output [b, t, d], Mamba2LayerState after the block).

    Same math as transformers' `Mamba2Mixer` torch path (for a bfloat16 model, the conv in float32:
    one rounding fewer). Projections are called as modules, so LoRA applies.
    """
    conv_state, ssm_state = (None, None) if state is None else (state.conv_state, state.ssm_state)
    b, t, _ = hidden_states.shape
    dtype = hidden_states.dtype
    projected = mixer.in_proj(hidden_states)
    gate, xBC, dt = projected.split([mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1)
    xBC, conv_state = causal_conv_with_state(xBC, mixer.conv_weight, mixer.conv_bias, conv_state)
    xBC = mixer.act(xBC)
    groups_state = mixer.n_groups * mixer.ssm_state_size
    x, B, C = xBC.split([mixer.intermediate_size, groups_state, groups_state], dim=-1)
    x = x.reshape(b, t, mixer.num_heads, mixer.head_dim)
    B = B.reshape(b, t, mixer.n_groups, mixer.ssm_state_size)
    C = C.reshape(b, t, mixer.n_groups, mixer.ssm_state_size)
    A = -torch.exp(mixer.A_log.float())
    y, ssm_state = ssd_scan(x, dt, A, B, C, mixer.D, mixer.dt_bias, mixer.time_step_limit, chunk_size,
                            kernel_chunk_size=mixer.chunk_size, initial_state=ssm_state)
    y = rms_norm(mixer.norm, y.reshape(b, t, -1), gate)
    return mixer.out_proj(y.to(dtype)), Mamba2LayerState(conv_state, ssm_state)


# ---- one interface for every backbone whose state is carried ----------------------------------


class StateCarrier:
    """How one backbone family carries its recurrent state from one vertical block to the next.

    The model calls only these methods (on the class: carriers hold nothing), looked up once by the
    backbone's `model_type` in `STATE_CARRIERS`; a family added there needs no other change.
    """

    @staticmethod
    def check_backbone(parts) -> None:
        """At load: refuse a backbone this family's block step cannot run, from its adapter's `parts` (read
        once at load; None for a backbone without an adapter). Nothing to refuse by default."""

    @staticmethod
    def gpu_chunk_size(parts) -> int:
        """Q, the GPU chunk of the backbone's chunked scan, from its adapter's `parts` (read at load;
        None for a backbone without an adapter): the "auto" V of a batch is 2Q. Backbones without a
        chunked scan take `DEFAULT_GPU_CHUNK_SIZE`."""
        return DEFAULT_GPU_CHUNK_SIZE

    @staticmethod
    def block_step(model: "RecurrentEmbedModel", input_ids: torch.Tensor, state: CarriedState | None):
        """One block input_ids [b, t] through every layer of `model.backbone` from `state` (None: the
        start of the sequences) -> (final hidden [b, t, D], the state after the block, for the next one)."""
        raise NotImplementedError

    @staticmethod
    def prefers_own_step(device: torch.device) -> bool:
        """Whether `schedule="auto"` takes the vertical schedule (our block step) on `device` even when
        the input fits one block, because our step is the faster path there. No by default."""
        return False

    @staticmethod
    def backbone_forward_runs_on(device: torch.device) -> bool:
        """Whether the backbone's own forward (the horizontal schedule) runs on `device`. Where it does
        not, `forward` runs the whole input as one vertical block instead. Yes by default."""
        return True


class Mamba2Carrier(StateCarrier):
    """Mamba2 through our own mixer step (its scan: `ssd`), state `Mamba2State`."""

    @staticmethod
    def block_step(model, input_ids, state: Mamba2State | None):
        backbone = mamba2_parts(model.backbone)
        hidden = backbone.embeddings(input_ids)
        layer_states = [None] * len(backbone.layers) if state is None else state.layers
        new_states = []
        for layer, layer_state in zip(backbone.layers, layer_states):
            residual = hidden
            hidden = rms_norm(layer.norm, hidden.to(dtype=layer.norm.weight.dtype))
            if layer.residual_in_fp32:
                residual = residual.to(torch.float32)
            hidden, layer_state = mamba2_mixer_step(layer.mixer, hidden, layer_state, model.config.ssd_chunk_size)
            hidden = residual + hidden
            new_states.append(layer_state)
        return rms_norm(backbone.norm_f, hidden), Mamba2State(new_states)

    @staticmethod
    def gpu_chunk_size(parts: Mamba2Parts) -> int:
        return int(parts.layers[0].mixer.chunk_size) if parts.layers else DEFAULT_GPU_CHUNK_SIZE

    @staticmethod
    def prefers_own_step(device):
        # Off CUDA our Mamba2 scan is the fast path even for one block: 1.4x transformers' torch
        # forward, in training too (docs/recurrent-student.md). On CUDA the backbone's fused kernels are.
        return device.type != "cuda"


class XlstmCarrier(StateCarrier):
    """xLSTM through transformers' own forward and cache, state `XlstmState`."""

    @staticmethod
    def block_step(model, input_ids, state: XlstmState | None):
        backbone = model.backbone
        cache = new_xlstm_cache(backbone, input_ids.shape[0], input_ids.device) if state is None else state.cache
        output = backbone(input_ids=input_ids, use_cache=True, **{cache_keyword(backbone.forward): cache})
        return output.last_hidden_state, XlstmState(carried_cache(output, type(cache)))


class RwkvCarrier(StateCarrier):
    """RWKV-4 through transformers' own forward and its `state` tensors, state `RwkvState`."""

    @staticmethod
    def block_step(model, input_ids, state: RwkvState | None):
        output = model.backbone(input_ids=input_ids, state=None if state is None else state.tensors, use_cache=True)
        return output.last_hidden_state, RwkvState(list(output.state))


class Rwkv7Carrier(StateCarrier):
    """RWKV-7 (fla's model) through the plain-torch path of `modeling_rwkv7`, state `Rwkv7State`."""

    @staticmethod
    def check_backbone(parts):
        check_rwkv7_backbone(parts)

    @staticmethod
    def block_step(model, input_ids, state: Rwkv7State | None):
        return rwkv7_block_step(model.backbone, input_ids, state)

    @staticmethod
    def backbone_forward_runs_on(device):
        return device.type == "cuda"  # fla's own RWKV-7 forward is Triton-only


# Backbones whose recurrent state we can carry between blocks (by `model_type`), and how.
STATE_CARRIERS: dict[str, type[StateCarrier]] = {
    "mamba2": Mamba2Carrier, "xlstm": XlstmCarrier, "rwkv": RwkvCarrier, "rwkv7": Rwkv7Carrier,
}


def _real_tokens_first(input_ids: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """input_ids [B, T] with each row's real tokens (mask [B, T] True) moved, in order, to its
    front: a left-padded batch becomes right-padded, so a causal backbone never reads a pad before
    the text and row i's EOS sits at lengths[i] - 1. A right-padded batch is returned as it is."""
    right_padded = torch.arange(mask.shape[1], device=mask.device)[None] < lengths[:, None]
    if bool((mask == right_padded).all()):
        return input_ids
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # real positions first, in order
    return input_ids.gather(1, order)


# ---- the model --------------------------------------------------------------------------------


@dataclass
class RecurrentOutput(ModelOutput):
    """embeddings: [B, D] float32 final-layer states at EOS (not normalised)."""

    embeddings: torch.Tensor | None = None


@dataclass(frozen=True)
class Schedule:
    """A call's schedule, defaulted from the config and checked once (`RecurrentEmbedModel.resolve_schedule`).

    `name` is "horizontal", "vertical" or "auto", and `block_size` (V) an int or "auto": an "auto" is
    what each batch decides (`for_batch`), from its longest input and its size. `asked` is the name
    the call gave itself (None: the config's), since only an asked "horizontal" refuses to stream."""

    name: str
    block_size: int | str
    asked: str | None = None

    def for_batch(self, model: "RecurrentEmbedModel", longest: int, batch_size: int) -> tuple[str, int]:
        """(schedule, V) for one batch of `batch_size` inputs whose longest has `longest` tokens."""
        block_size = self.block_size if self.block_size != AUTO else model.auto_block_size(batch_size)
        name, carrier = self.name, model.state_carrier
        if name == "auto":
            fits = longest <= block_size and not (carrier is not None and carrier.prefers_own_step(model.device))
            name = "horizontal" if fits or carrier is None else "vertical"
        return name, block_size


@dataclass(frozen=True)
class RecurrentRequest:
    """One call's options, resolved once by `RecurrentEmbedModel.resolve`."""

    prompt: str | None
    output_value: str
    max_length: int | None
    schedule: Schedule


class RecurrentEmbedPreTrainedModel(PreTrainedModel):
    config_class = RecurrentEmbedConfig
    base_model_prefix = "recurrent"
    supports_gradient_checkpointing = True

    def _init_weights(self, module):
        pass  # the backbone initialises itself; nothing else has weights


class RecurrentEmbedModel(EncoderMixin, RecurrentEmbedPreTrainedModel):
    """A recurrent LM backbone pooled at EOS, with a constant-memory vertical `encode()`.

    Inputs: input_ids, attention_mask [B, T], padded on either side; each row ends with its EOS.
    """

    supports_streaming = True
    forward_options = call_options(RECURRENT_OPTIONS)  # they pick the forward
    tokenizer_class = RecurrentEmbedTokenizer
    forward_input_names = ("input_ids", "attention_mask")

    def __init__(self, config: RecurrentEmbedConfig):
        super().__init__(config)
        config.check()
        self.backbone = AutoModel.from_config(config.backbone_config)
        parts = check_backbone_internals(config.backbone_config.model_type, self.backbone)  # once per load, named
        carrier = self.state_carrier if self.state_carrier is not None else StateCarrier
        carrier.check_backbone(parts)
        self._gpu_chunk_size = carrier.gpu_chunk_size(parts)
        self._tokenizer = None
        self.post_init()

    @property
    def state_carrier(self) -> type[StateCarrier] | None:
        """The backbone family's `StateCarrier`; None for a backbone whose state cannot be carried."""
        return STATE_CARRIERS.get(self.config.backbone_config.model_type)

    # ---- schedules ----------------------------------------------------------------------------

    def auto_block_size(self, batch_size: int = 1) -> int:
        """The "auto" V: `auto_block_size` for this device, the backbone's width and `batch_size`."""
        return auto_block_size(self.device.type, int(self.config.backbone_config.hidden_size), batch_size,
                               self._gpu_chunk_size)

    def resolve_block_size(self, block_size: int | str | None, batch_size: int = 1) -> int:
        """V for a batch of `batch_size`: an explicit integer wins; "auto" (the config default) asks
        `auto_block_size`."""
        block_size = self._checked_block_size(block_size)
        return self.auto_block_size(batch_size) if block_size == AUTO else block_size

    def _checked_block_size(self, block_size: int | str | None) -> int | str:
        """V defaulted from the config and checked: a positive int, or "auto"."""
        return check_block_size(self.config.block_size if block_size is None else block_size)

    def resolve_schedule(self, schedule: str | None, block_size: int | str | None) -> Schedule:
        """The one place the schedule and V are defaulted (from the config) and checked (see the module
        docstring); an "auto" stays for each batch to decide (`Schedule.for_batch`)."""
        name = check_schedule(self.config.schedule if schedule is None else schedule)
        block_size = self._checked_block_size(block_size)
        if name == "vertical":
            self._require_state_carrier("schedule='vertical'")
        return Schedule(name, block_size, schedule)

    def _require_state_carrier(self, what: str) -> type[StateCarrier]:
        if self.state_carrier is None:
            raise ValueError(
                f"{what} needs a backbone that carries recurrent state between blocks "
                f"({sorted(STATE_CARRIERS)}); {self.config.backbone_config.model_type!r} cannot. Use 'horizontal'."
            )
        return self.state_carrier

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        schedule: str | Schedule | None = None,
        block_size: int | str | None = None,
    ) -> RecurrentOutput:
        """input_ids / attention_mask [B, T] -> RecurrentOutput(embeddings [B, D]).

        Padding may be on either side: positions where `attention_mask` is 0 are left out, and each
        row is pooled at its last real token (its EOS). `schedule` and `block_size` as in `encode()`,
        or `schedule` a `Schedule` that `resolve` made (then no `block_size`). Unknown arguments
        raise a TypeError.
        """
        if isinstance(schedule, Schedule):
            if block_size is not None:
                raise ValueError("`block_size` is part of a resolved `Schedule`: pass one or the other.")
        else:
            schedule = self.resolve_schedule(schedule, block_size)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"`attention_mask` has shape {tuple(attention_mask.shape)}; `input_ids` has {tuple(input_ids.shape)}."
            )
        lengths = attention_mask.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("Every input needs at least one token (its EOS); found an empty row.")
        input_ids = _real_tokens_first(input_ids, attention_mask.bool(), lengths)
        longest = int(lengths.max())
        schedule, block_size = schedule.for_batch(self, longest, input_ids.shape[0])
        input_ids = input_ids[:, :longest]
        carrier = self.state_carrier
        if schedule == "horizontal" and carrier is not None and not carrier.backbone_forward_runs_on(input_ids.device):
            # e.g. RWKV-7 off CUDA: the whole sequence is one block of our own step.
            schedule, block_size = "vertical", longest
        if schedule == "horizontal":
            # No cache: xLSTM would size one from its config and crash for qk_dim_factor=0.5.
            hidden = self.backbone(input_ids=input_ids, use_cache=False).last_hidden_state
            rows = torch.arange(input_ids.shape[0], device=input_ids.device)
            return RecurrentOutput(embeddings=hidden[rows, lengths - 1].float())
        return RecurrentOutput(embeddings=self._vertical(input_ids, lengths, block_size))

    def _vertical(self, input_ids: torch.Tensor, lengths: torch.Tensor, block_size: int) -> torch.Tensor:
        """Blocks of `block_size` through all layers; finished sequences leave the batch.

        input_ids [B, T] right-padded, lengths [B] -> embeddings [B, D] float32.
        """
        batch = input_ids.shape[0]
        embeddings = [None] * batch
        active = torch.arange(batch, device=input_ids.device)
        state = None
        for start in range(0, int(lengths.max()), block_size):
            alive = lengths[active] > start
            if not bool(alive.all()):
                rows = alive.nonzero().squeeze(1)
                active, state = active[rows], state.select(rows)
            end = min(start + block_size, int(lengths[active].max()))
            hidden, state = self.block_step(input_ids[active, start:end], state)
            eos = lengths[active] - 1
            for row in torch.nonzero((eos >= start) & (eos < end)).squeeze(1).tolist():
                embeddings[int(active[row])] = hidden[row, int(eos[row]) - start].float().clone()
        return torch.stack(embeddings)

    def block_step(self, input_ids: torch.Tensor, state: CarriedState | None):
        """One block [b, t] through every layer from `state` (None: the start of the sequences)
        -> (final hidden [b, t, D], the state after the block, for the next one): the carrier's step."""
        return self.state_carrier.block_step(self, input_ids, state)

    # ---- inputs -------------------------------------------------------------------------------

    def default_max_length(self) -> int | None:
        """`max_length_default` of `config.max_length` and the position limit (none for a recurrent
        backbone: None, no budget, which the vertical schedule allows)."""
        return max_length_default(self.config.max_length, self.max_positions())

    def prepare_features(self, texts: list[str], prompt: str | None = None, max_length=None, **forward_options):
        """Tokenize a batch into model inputs: dict of [B, T] tensors (used by the ST module).
        `forward_options` (schedule, block_size) are checked here, with the rest of the call's."""
        request = self.resolve(prompt=prompt, max_length=max_length, **forward_options)
        return self.tokenizer.build_batch(texts, prompt=request.prompt, max_length=request.max_length).tensors()

    def sentence_transformers_prompts(self) -> dict[str, str]:
        return {"query": self.config.query_prompt(), "document": self.config.document_prompt}

    # ---- encode -------------------------------------------------------------------------------

    def encode(
        self,
        texts,
        batch_size: int = 32,
        max_length: int | None = None,
        schedule: str | None = None,
        block_size: int | None = None,
        normalize: bool | None = None,
        prompt: str | None = None,
        show_progress_bar: bool | None = None,
        convert_to_tensor: bool = False,
        device: str | torch.device | None = None,
        output_value: str = "embedding",
    ):
        """Embed texts: a string, or a list (or any iterator, e.g. a generator) of strings.

        As in sentence-transformers, an iterable of texts is many texts: `encode(t for t in texts)`
        equals `encode(list(texts))`. A `pathlib.Path` (alone or as an item of the list) is one
        UTF-8 text file, streamed; to stream one document given in pieces, use `encode_stream`.
        Returns float32 `[N, D]` (numpy, or a tensor), `[D]` for a single string or path.
        `schedule` ("auto", "horizontal", "vertical") and `block_size` (V, or "auto") override the config.
        """
        if isinstance(texts, Iterator) and not isinstance(texts, (str, os.PathLike)):
            texts = list(texts)
        if isinstance(texts, (list, tuple)):
            for index, item in enumerate(texts):
                if isinstance(item, Iterator):
                    raise TypeError(
                        f"`texts[{index}]` is an iterator ({type(item).__name__}); `texts` holds whole texts. "
                        "To embed one document given in pieces, use `encode_stream(pieces)`."
                    )
        request = self.resolve(prompt=prompt, output_value=output_value, max_length=max_length, schedule=schedule,
                               block_size=block_size)
        return self._run_encode(texts, request, batch_size=batch_size, normalize=normalize,
                                show_progress_bar=show_progress_bar, convert_to_tensor=convert_to_tensor, device=device)

    def encode_stream(
        self,
        pieces,
        max_length: int | None = None,
        block_size: int | None = None,
        normalize: bool | None = None,
        prompt: str | None = None,
        convert_to_tensor: bool = False,
        device: str | torch.device | None = None,
    ):
        """Embed ONE document given in pieces -> float32 `[D]` (numpy, or a tensor).

        `pieces`: an iterable of strings (a generator, a list, a text file object), or a
        `pathlib.Path` to a UTF-8 text file. The result equals `encode("".join(pieces))`. The
        pieces are tokenized incrementally and fed to the vertical schedule in blocks of V as
        tokens arrive, so peak memory is bounded whatever the document's length.
        """
        if isinstance(pieces, str):
            pieces = [pieces]
        elif pieces is None or isinstance(pieces, (bytes, dict)) or not isinstance(pieces, (Iterable, os.PathLike)):
            raise TypeError(
                f"`pieces` must be an iterable of strings or a pathlib.Path, got {type(pieces).__name__}."
            )
        source = pieces if isinstance(pieces, os.PathLike) else iter(pieces)
        request = self.resolve(prompt=prompt, max_length=max_length, schedule="vertical", block_size=block_size)
        return self._run_encode(source, request, batch_size=1, normalize=normalize,
                                show_progress_bar=False, convert_to_tensor=convert_to_tensor, device=device)

    def encode_query(self, queries, task: str | None = None, **kwargs):
        """`encode` with the instruction `Instruct: {task}\\nQuery: ` (task: `config.default_task`)."""
        return self.encode(queries, prompt=self.config.query_prompt(task), **kwargs)

    def resolve(self, *, prompt: str | None = None, output_value: str = "embedding", max_length: int | None = None,
                schedule: str | None = None, block_size: int | str | None = None) -> "RecurrentRequest":
        """The one place a call's options are defaulted (from the config) and checked. `auto` schedules
        are turned into horizontal or vertical per batch, in `forward`, where the batch's length is known."""
        check_prompt(prompt)
        check_choice("output_value", output_value, self.output_values)
        schedule = self.resolve_schedule(schedule, block_size)
        _ = self.tokenizer.eos_id  # a tokenizer without EOS fails here, clearly
        name = "max_length" if max_length is not None else "config.max_length"
        max_length = self.default_max_length() if max_length is None else max_length
        # defaulted first: a default meets the argument's rule
        max_length = self.tokenizer.check_max_length(max_length, self.max_positions(), name)
        return RecurrentRequest(prompt, output_value, max_length, schedule)

    def _embed_texts(self, texts: list[str], request: "RecurrentRequest") -> tuple[torch.Tensor, int]:
        batch = self.tokenizer.build_batch(texts, prompt=request.prompt, max_length=request.max_length)
        features = batch.tensors(self.device)
        output = self(**features, schedule=request.schedule)
        return output.embeddings, int(batch.truncated.sum())

    def _embed_stream(self, source, request: "RecurrentRequest") -> tuple[torch.Tensor, int]:
        """One streamed document (an iterator of text pieces, or a path) -> ([D], truncated 0 or 1): fed
        to the vertical schedule in blocks of V as tokens arrive."""
        if request.schedule.asked == "horizontal":
            raise ValueError("Streamed documents use the vertical schedule; `schedule='horizontal'` cannot stream.")
        self._require_state_carrier("Streaming (the vertical schedule)")
        block_size = request.schedule.for_batch(self, 0, 1)[1]
        if isinstance(source, os.PathLike):
            if not os.path.isfile(source):
                raise FileNotFoundError(f"No such text file: {source}")
            source = iter_text_file(source)
        tokenizer, max_length = self.tokenizer, request.max_length
        pending = np.asarray(tokenizer.prefix_ids, dtype=np.int64)
        budget = None if max_length is None else max_length - len(pending) - 1
        state, consumed, truncated = None, 0, False
        for ids in tokenizer.stream_content_ids(source, prompt=request.prompt):
            if budget is not None and consumed + len(ids) > budget:
                ids, truncated = ids[: budget - consumed], True
            consumed += len(ids)
            pending = np.concatenate([pending, ids])
            while len(pending) >= block_size:
                block, pending = pending[:block_size], pending[block_size:]
                _, state = self.block_step(torch.from_numpy(block)[None].to(self.device), state)
            if truncated:  # stop reading: the rest is over the budget
                break
        pending = np.concatenate([pending, [tokenizer.eos_id]])
        hidden, _ = self.block_step(torch.from_numpy(pending)[None].to(self.device), state)
        return hidden[0, -1].float(), int(truncated)


__all__ = ["STATE_CARRIERS", "RecurrentEmbedModel", "RecurrentEmbedPreTrainedModel", "RecurrentOutput", "Schedule",
           "StateCarrier"]
