"""RWKV-7 in plain torch, over flash-linear-attention's `RWKV7Model` weights.

flash-linear-attention (`fla`) holds the RWKV-7 model the recurrent-embedding paper used, but its
forward is Triton kernels only, which need a GPU. This module runs the same model with torch ops,
on any device, one block of tokens at a time from a carried per-layer state, which is what the
vertical schedule and streaming need. It reads the parameters of fla's modules, through
`compat.rwkv7_parts`, and never calls their forward. The recurrence (`wkv7_recurrence`) is written once, per token.

Per layer (fla's `RWKV7Block`):
    x = pre_norm(x)                       (layer 0, when `norm_first`)
    x = x + time_mix(attn_norm(x))        (the WKV-7 recurrence)
    x = x + channel_mix(ffn_norm(x))      (squared-ReLU MLP over a token shift)
then a final `norm`. Layer 0's values `v_first` feed every later layer's value residual.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .compat import NormParts, Rwkv7AttentionParts, Rwkv7FeedForwardParts, Rwkv7Parts, rwkv7_parts

# RWKV-7's decay bound: w = -exp(-0.5) * sigmoid(.), so exp(w) lies in (0.545, 1).
DECAY_SCALE = -0.6065306597126334
FUSED_L2_EPS = 1e-6  # fla's fused l2 norm: x / sqrt(sum x^2 + eps)


@dataclass
class Rwkv7LayerState:
    """One layer's state after a block.

    attn_shift [B, D]: the time-mix input at the block's last token (for the next token shift);
    wkv [B, H, K, V]: the WKV state, float32;
    ffn_shift [B, D]: the channel-mix input at the block's last token.
    """

    attn_shift: torch.Tensor
    wkv: torch.Tensor
    ffn_shift: torch.Tensor

    def select(self, rows: torch.Tensor) -> "Rwkv7LayerState":
        return Rwkv7LayerState(self.attn_shift[rows], self.wkv[rows], self.ffn_shift[rows])


@dataclass
class Rwkv7State:
    """Every layer's state, in layer order."""

    layers: list[Rwkv7LayerState]

    def select(self, rows: torch.Tensor) -> "Rwkv7State":
        return Rwkv7State([layer.select(rows) for layer in self.layers])


def wkv7_recurrence(r, w, k, v, a, b, state=None):
    """The WKV-7 recurrence, one token at a time (a diagonal-plus-low-rank state update).

    r, w, k, a, b [B, T, H, K]; v [B, T, H, V]; state [B, H, K, V] or None (zeros)
    -> (o [B, T, H, V], state [B, H, K, V]), computed in float32:

        S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T
        o_t = S_t^T r_t
    """
    batch, steps, heads, key_dim = r.shape
    r, w, k, v, a, b = (t.float() for t in (r, w, k, v, a, b))
    S = r.new_zeros(batch, heads, key_dim, v.shape[-1]) if state is None else state.float()
    decay = torch.exp(w)
    outputs = []
    for t in range(steps):
        removed = (a[:, t, :, :, None] * S).sum(-2, keepdim=True)  # a_t^T S: [B, H, 1, V]
        S = decay[:, t, :, :, None] * S + b[:, t, :, :, None] * removed + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append((r[:, t, :, :, None] * S).sum(-2))
    return torch.stack(outputs, dim=1), S


def token_shift(x, previous):
    """x [B, T, D], previous [B, D] (the token before x[:, 0]; None: zeros) -> (x_{t-1} - x_t, x[:, -1])."""
    before = x.new_zeros(x[:, :1].shape) if previous is None else previous[:, None].to(x.dtype)
    shifted = torch.cat([before, x[:, :-1]], dim=1)
    return shifted - x, x[:, -1]


def _layer_norm(norm: NormParts, x):
    """fla's LayerNorm (fused or torch) as plain torch: its weight, bias and eps."""
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def _l2_normalize(x, fused: bool):
    if fused:  # fla's fused kernel adds eps inside the root
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + FUSED_L2_EPS)
    return F.normalize(x, dim=-1, p=2.0)


def time_mix(attn: Rwkv7AttentionParts, x, v_first, shift, wkv):
    """fla's `RWKV7Attention` forward. x [B, T, D] (after attn_norm), v_first [B, T, value_dim] or None
    (layer 0 makes it) -> (output [B, T, D], v_first, new shift [B, D], new wkv state)."""
    batch, steps, _ = x.shape
    delta, shift = token_shift(x, shift)
    xr, xw, xk, xv, xa, xg = (x + delta * mix for mix in attn.mixes)
    r, k, v = attn.r_proj(xr), attn.k_proj(xk), attn.v_proj(xv)
    w = DECAY_SCALE * torch.sigmoid(attn.w_lora(xw))
    if attn.first_layer:
        v_first = v
    else:
        v = torch.lerp(v, v_first, torch.sigmoid(attn.v_lora(xv)))
    a = torch.sigmoid(attn.a_lora(xa))
    g = attn.g_lora(xg)
    heads, key_dim, value_dim = attn.num_heads, attn.head_dim, attn.head_v_dim
    kk = _l2_normalize((k * attn.k_k).view(batch, steps, heads, key_dim), attn.fuse_norm)
    k = k + k * (a - 1) * attn.k_a  # the in-context learning rate scales the key
    split = lambda t, d: t.view(batch, steps, heads, d)  # noqa: E731
    r, w, k, a = (split(t, key_dim) for t in (r, w, k, a))
    v = split(v, value_dim)
    o, wkv = wkv7_recurrence(r, w, k, v, -kk, kk * a, wkv)
    norm = attn.g_norm
    o = F.group_norm(o.reshape(batch * steps, -1).to(x.dtype), norm.num_groups, norm.weight, norm.bias, norm.eps)
    bonus = (r * k * attn.r_k).sum(-1, keepdim=True) * v  # the per-head "bonus" of the current token
    o = (o.view(batch, steps, -1) + bonus.reshape(batch, steps, -1)) * g
    return attn.o_proj(o), v_first, shift, wkv


def channel_mix(ffn: Rwkv7FeedForwardParts, x, shift):
    """fla's `RWKV7FeedForward`: x [B, T, D] (after ffn_norm) -> (output [B, T, D], new shift [B, D])."""
    delta, shift = token_shift(x, shift)
    return ffn.value(torch.relu(ffn.key(x + delta * ffn.x_k)) ** 2), shift


def rwkv7_block_step(backbone, input_ids, state: Rwkv7State | None):
    """One block input_ids [B, T] through fla's `RWKV7Model` from `state` (None: the start)
    -> (final hidden states [B, T, D], the state after the block)."""
    backbone = rwkv7_parts(backbone)
    hidden = backbone.embeddings(input_ids)
    previous = [None] * len(backbone.layers) if state is None else state.layers
    v_first, new_states = None, []
    for layer, layer_state in zip(backbone.layers, previous):
        attn_shift, wkv, ffn_shift = (None, None, None) if layer_state is None else (
            layer_state.attn_shift, layer_state.wkv, layer_state.ffn_shift)
        if layer.pre_norm is not None:
            hidden = _layer_norm(layer.pre_norm, hidden)
        mixed, v_first, attn_shift, wkv = time_mix(layer.attn, _layer_norm(layer.attn_norm, hidden), v_first, attn_shift, wkv)
        hidden = hidden + mixed
        mixed, ffn_shift = channel_mix(layer.ffn, _layer_norm(layer.ffn_norm, hidden), ffn_shift)
        hidden = hidden + mixed
        new_states.append(Rwkv7LayerState(attn_shift, wkv, ffn_shift))
    return _layer_norm(backbone.norm, hidden), Rwkv7State(new_states)


def check_rwkv7_backbone(parts: Rwkv7Parts) -> None:
    """Refuse what this path does not run: hybrid layers (standard attention) and other activations, as
    `compat.rwkv7_parts` read them from fla's config at load."""
    if parts.attn:
        raise ValueError(
            "This RWKV-7 checkpoint mixes in standard attention layers (`attn` in its config); the plain-torch "
            "RWKV-7 path runs RWKV-7 layers only."
        )
    if parts.hidden_act != "sqrelu":
        raise ValueError(f"RWKV-7 `hidden_act` {parts.hidden_act!r} is not supported (only 'sqrelu').")


__all__ = ["Rwkv7LayerState", "Rwkv7State", "check_rwkv7_backbone", "rwkv7_block_step", "wkv7_recurrence"]
