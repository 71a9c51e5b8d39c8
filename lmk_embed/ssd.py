"""Mamba2's SSD scan: the per-token reference, the chunked torch forms, and mamba_ssm's kernel.

The scan (a selective state-space model, per head, with a scalar decay per token):

    state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T      state [h, p, n]
    y_t     = state_t C_t + D x_t

Shapes (b batch, t tokens, h heads of p channels, g groups of B / C, n state size; head i reads
group i // (h / g)):
    x [b, t, h, p], dt [b, t, h] (discretised: softplus + bias + clamp done), A [h], B, C [b, t, g, n],
    D [h], initial_state [b, h, p, n] or None (zeros) -> (y [b, t, h, p], final state [b, h, p, n]).

`ssd_reference` is the recurrence above, one token at a time: slow, and the ground truth every
other path is tested against. `ssd_chunked` is the chunked form (Mamba2's SSD), lean for inference
in plain torch, float32 inside. In chunks of q tokens it runs four steps, numbered in its comments
as in mamba_ssm's minimal SSD:
    1. diagonal blocks        each chunk's output from its own inputs (a masked [q, q] product);
    2. intra-chunk states     each chunk's input to the state at its end;
    3. inter-chunk recurrence the state entering each chunk, by a short loop over chunks;
    4. state-to-output        each chunk's output from the state entering it.
`ssd_scan` is what the model calls: mamba_ssm's fused kernel for CUDA tensors when the `cuda` extra
is installed, `ssd_chunked` everywhere else.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from transformers.utils import logging

logger = logging.get_logger(__name__)

try:  # CUDA kernels, optional (the `cuda` extra); inside `try`, so that loading a checkpoint never requires them
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
except ImportError:  # not installed
    mamba_chunk_scan_combined = None

# Whether mamba_ssm's fused scan can run: `ssd_scan` uses it for CUDA tensors.
is_mamba_ssm_available = mamba_chunk_scan_combined is not None

# The factored scan's weights stay within e^±SSD_MAX_EXPONENT (5e21): far from float32's 3.4e38.
SSD_MAX_EXPONENT = 50.0


def ssd_scan(x, dt, A, B, C, D, dt_bias, dt_limit, chunk_size: int, kernel_chunk_size: int, initial_state=None):
    """Mamba2's scan from the raw time step, as transformers' `Mamba2Mixer` runs it.

    dt [b, t, h] before discretisation (here: softplus(dt + dt_bias) clamped to dt_limit = (low, high));
    dt_bias [h]; the other shapes as in the module docstring -> (y [b, t, h, p], final state [b, h, p, n]).
    CUDA tensors go through mamba_ssm's fused kernel (chunks of `kernel_chunk_size`, the backbone's
    own) when it is installed; otherwise `ssd_chunked` runs, in chunks of `chunk_size`.
    """
    if x.is_cuda:
        if is_mamba_ssm_available:
            return mamba_chunk_scan_combined(
                x, dt, A, B, C, chunk_size=kernel_chunk_size, D=D, dt_bias=dt_bias, dt_softplus=True,
                dt_limit=tuple(dt_limit), initial_states=initial_state, return_final_states=True,
            )
        logger.warning_once(
            "mamba_ssm is not installed: the Mamba2 scan runs in plain torch on CUDA, which is slower than "
            "mamba_ssm's fused kernel. Install the `cuda` extra (pip install 'lmk-embed[cuda]') for the kernel."
        )
    dt = torch.clamp(F.softplus(dt + dt_bias.to(dt.dtype)), min=dt_limit[0], max=dt_limit[1])
    return ssd_chunked(x, dt, A, B, C, D, chunk_size, initial_state)


# ---- the minimal reference ----------------------------------------------------------------------


def ssd_reference(x, dt, A, B, C, D, initial_state=None):
    """The SSM recurrence one token at a time (reference; slow).

    x [b, t, h, p], dt [b, t, h] (discretised: softplus + bias + clamp done), A [h], B, C [b, t, g, n],
    D [h], initial_state [b, h, p, n] -> (y [b, t, h, p], final state [b, h, p, n]). Head i reads group i // (h/g).
    """
    b, t, h, p = x.shape
    repeat = h // B.shape[2]
    B, C = B.repeat_interleave(repeat, dim=2), C.repeat_interleave(repeat, dim=2)
    state = x.new_zeros(b, h, p, B.shape[-1]) if initial_state is None else initial_state
    outputs = []
    for step in range(t):
        decay = torch.exp(dt[:, step] * A)[..., None, None]
        state = state * decay + (dt[:, step, :, None] * x[:, step])[..., None] * B[:, step, :, None, :]
        outputs.append((state * C[:, step, :, None, :]).sum(-1) + D[:, None] * x[:, step])
    return torch.stack(outputs, dim=1), state


# ---- the fast chunked form, and its log-space fallback -------------------------------------------


def ssd_chunked(x, dt, A, B, C, D, chunk_size: int, initial_state=None):
    """The same scan in chunks (Mamba2's SSD), lean for inference; float32 inside.

    x [b, t, h, p], dt [b, t, h] (discretised), A [h], B, C [b, t, g, n], D [h], initial_state
    [b, h, p, n] or None -> (y [b, t, h, p] float32, final state [b, h, p, n] float32). Within a chunk
    the output is a masked (decayed) attention-like product; between chunks only the [h, p, n] state
    is carried, by a short loop over chunks.

    The fast form factors the decay: exp(cum[l] - cum[s]) = exp(cum[l] - m) exp(m - cum[s]), with m
    midway between the chunk's first and last cumulative log decay. The second factor goes into the
    inputs and the first onto the outputs, so a group's heads share one masked [q, q] product of
    C B^T and every product is a plain [q, *] GEMM over the group's heads together ([t, h p] layout,
    no permuted copies): no [q, q] decay per head is built. Both factors stay within
    e^(span / 2), span = the chunk's largest drop in cumulative log decay; where a chunk of
    `chunk_size` would pass e^SSD_MAX_EXPONENT, the chunk is halved down to 32, and below that the
    scan takes the log-space form (`_ssd_chunked_log_space`), which is stable for any decay.
    """
    if torch.is_autocast_enabled(x.device.type):  # float32 inside also under autocast (bf16 training)
        with torch.autocast(x.device.type, enabled=False):
            return ssd_chunked(x, dt, A, B, C, D, chunk_size, initial_state)
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    log_decay = dt * A.float()  # [b, t, h]
    q = chunk_size
    cumulative = _chunk_cumsum(log_decay, q)  # [b, c, q, h]
    while float((cumulative[:, :, 0] - cumulative[:, :, -1]).max().detach()) > 2 * SSD_MAX_EXPONENT:
        if q < 64:  # below 32 the loop over chunks costs more than the log-space form saves
            return _ssd_chunked_log_space(x, dt, A, B, C, D, chunk_size, initial_state)
        q //= 2
        cumulative = _chunk_cumsum(log_decay, q)
    c = cumulative.shape[1]
    pad = c * q - t
    middle = (cumulative[:, :, :1] + cumulative[:, :, -1:]) / 2  # [b, c, 1, h], <= 0
    grow = torch.exp(middle - cumulative).view(b, c * q, h)[:, :t] * dt
    grown = x * grow[..., None]  # x dt exp(m - cum): [b, t, h, p]
    if pad:  # zero inputs at no decay: the final state is unchanged
        grown, B, C = (F.pad(tensor, (0, 0, 0, 0, 0, pad)) for tensor in (grown, B, C))
    grown = grown.view(b, c, q, g, r * p).transpose(2, 3)  # [b, c, g, q, r p]: x dt exp(m - cum)
    B_chunks = B.view(b, c, q, g, n).transpose(2, 3)  # [b, c, g, q, n]
    C_chunks = C.view(b, c, q, g, n).transpose(2, 3)

    # Step 1, diagonal blocks: y[l] = exp(cum[l] - m) sum_{s<=l} (C[l] . B[s]) grown[s], the factor
    # exp(cum[l] - m) applied once at the end, with step 4's part.
    scores = (C_chunks @ B_chunks.transpose(-1, -2)).masked_fill_(_future_mask(q, x.device), 0.0)  # [b, c, g, q, q]
    y = scores @ grown  # [b, c, g, q, r p]

    # Step 2, intra-chunk states: each chunk's input to the state at its end.
    partial = (grown.transpose(-1, -2) @ B_chunks).view(b, c, h, p, n)
    to_middle = torch.exp(middle[:, :, 0])[..., None, None]  # [b, c, h, 1, 1]
    middle_to_end = torch.exp(cumulative[:, :, -1] - middle[:, :, 0])[..., None, None]
    partial = partial * middle_to_end

    # Step 3, inter-chunk recurrence: one multiply-add per chunk on the [h, p, n] state. The states
    # entering the chunks are kept as exp(m) state, the part of exp(cum[l]) that the output's factor lacks.
    state = x.new_zeros(b, h, p, n) if initial_state is None else initial_state.float()
    entering = []
    for chunk in range(c):
        entering.append(state * to_middle[:, chunk])
        state = torch.addcmul(partial[:, chunk], entering[-1], middle_to_end[:, chunk])
    entering = torch.stack(entering, dim=1).view(b * c * g, r * p, n)

    # Step 4, state-to-output: y[l] += C[l] . exp(m) state, one [q, n] @ [n, r p] product per chunk
    # and group; then the output factor exp(cum[l] - m) on both parts, and the skip D x.
    y = y.view(b * c * g, q, r * p).baddbmm_(C_chunks.reshape(b * c * g, q, n), entering.transpose(1, 2))
    y = y.view(b, c, g, q, r * p).transpose(2, 3).reshape(b, c * q, h, p)[:, :t]
    y = y * torch.exp(cumulative - middle).view(b, c * q, h, 1)[:, :t]
    return torch.addcmul(y, x, D.float()[:, None]), state


def _chunk_cumsum(log_decay, q: int):
    """log_decay [b, t, h] -> cumulative log decay within chunks of q [b, c, q, h] (zero-padded to c q)."""
    b, t, h = log_decay.shape
    return F.pad(log_decay, (0, 0, 0, (-t) % q)).view(b, -1, q, h).cumsum(2)


def _ssd_chunked_log_space(x, dt, A, B, C, D, chunk_size: int, initial_state=None):
    """`ssd_chunked` with the decay built in log space, one [q, q] block per head: exp(cum[l] - cum[s])
    is formed from the difference, so it holds for any decay, at the cost of four elementwise passes
    over every head's [q, q] block. Shapes as in `ssd_chunked`."""
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r, q = h // g, chunk_size
    pad = (-t) % q
    c = (t + pad) // q
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    xdt = x * dt[..., None]
    log_decay = dt * A.float()
    if pad:  # zero padding: no input and no decay, so the final state is unchanged
        xdt, log_decay = F.pad(xdt, (0, 0, 0, 0, 0, pad)), F.pad(log_decay, (0, 0, 0, pad))
        B, C = F.pad(B, (0, 0, 0, 0, 0, pad)), F.pad(C, (0, 0, 0, 0, 0, pad))
    cumulative = log_decay.view(b, c, q, h).cumsum(2)  # [b, c, q, h]
    B_chunks = B.view(b, c, q, g, n).transpose(2, 3)  # [b, c, g, q, n]
    C_chunks = C.view(b, c, q, g, n).transpose(2, 3)

    # Step 1, diagonal blocks: y[l] = sum_{s<=l} exp(cum[l] - cum[s]) (C[l] . B[s]) x[s] dt[s].
    # The [q, q] decay is built once per head and, without autograd, in place in one buffer:
    # on CPU these elementwise passes, not the products, are much of the scan's time.
    in_place = not torch.is_grad_enabled()
    scores = C_chunks @ B_chunks.transpose(-1, -2)  # [b, c, g, q, q], shared by the group's heads
    per_head = cumulative.transpose(2, 3)  # [b, c, h, q]
    decay = (per_head[..., :, None] - per_head[..., None, :]).masked_fill_(_future_mask(q, x.device), float("-inf"))
    decay = decay.exp_().view(b, c, g, r, q, q)
    decay = decay.mul_(scores[:, :, :, None]) if in_place else decay * scores[:, :, :, None]
    X = xdt.view(b, c, q, g, r, p).permute(0, 1, 3, 4, 2, 5)  # [b, c, g, r, q, p]
    y = (decay @ X).permute(0, 1, 4, 2, 3, 5)  # [b, c, q, g, r, p]
    del decay

    # Step 2, intra-chunk states: each chunk's contribution to the state at its end,
    # sum_s exp(cum[-1] - cum[s]) x[s] dt[s] B[s]^T.
    to_end = torch.exp(cumulative[:, :, -1:] - cumulative)  # [b, c, q, h]
    weighted = (xdt.view(b, c, q, h, p) * to_end[..., None]).view(b, c, q, g, r * p)
    chunk_states = (weighted.permute(0, 1, 3, 4, 2) @ B_chunks).view(b, c, h, p, n)

    # Step 3, inter-chunk recurrence, one multiply-add per chunk: a loop of c small steps over the
    # [h, p, n] state costs less here than a [c + 1, c + 1] decay product per head.
    chunk_decay = torch.exp(cumulative[:, :, -1])  # [b, c, h]
    state = x.new_zeros(b, h, p, n) if initial_state is None else initial_state.float()
    entering = []
    for chunk in range(c):
        entering.append(state)
        state = torch.addcmul(chunk_states[:, chunk], state, chunk_decay[:, chunk, :, None, None])
    entering = torch.stack(entering, dim=1).view(b, c, g, r * p, n)

    # Step 4, state-to-output: y[l] += exp(cum[l]) C[l] . state entering the chunk; then the skip D x.
    from_state = (C_chunks @ entering.transpose(-1, -2)).view(b, c, g, q, r, p).transpose(2, 3)  # [b, c, q, g, r, p]
    y = torch.addcmul(y, from_state, torch.exp(cumulative).view(b, c, q, g, r, 1))
    y = y.reshape(b, c * q, h, p)[:, :t]
    return torch.addcmul(y, x, D.float()[:, None]), state


@functools.lru_cache(maxsize=16)
def _future_mask(q: int, device: torch.device) -> torch.Tensor:
    """[q, q] True above the diagonal (s > l): built once per chunk size, not once per call.

    Built outside inference mode: a cached inference tensor could not be saved for a later backward."""
    with torch.inference_mode(False):
        return torch.ones(q, q, dtype=torch.bool, device=device).triu(1)


__all__ = ["SSD_MAX_EXPONENT", "is_mamba_ssm_available", "ssd_chunked", "ssd_reference", "ssd_scan"]
