"""LMK checkpoints on ONNX Runtime: `LMKModel`'s encode() surface running on an exported graph.

A checkpoint folder may hold, beside its torch weights (written by `lmk-embed export-onnx`, whose code
lives in the tooling, `lmk_embed_tools/onnx_export.py`, and never ships in a checkpoint):

    onnx/model.onnx        fp32: `torch.onnx.export`, opset 17, eager attention
    onnx/model_qint8.onnx  int8: `onnxruntime.quantization.quantize_dynamic` of it (MatMul weights only)

BERT-family graphs are fused by ONNX Runtime's transformer optimizer; their attention runs without a
mask (the CPU flash kernel) when a run has no padded row. Each graph records the CPU features of the
machine it was exported on (`CPU_FEATURES`); loading it on a CPU that lacks some warns once.

The graph takes `input_ids`, `attention_mask` and `landmark_mask`, int64 [B, T], with dynamic B and T
(up to the checkpoint's position limit; pooling `cls` and `mean` read no landmark mask, so their graph
takes the first two only). An extended position table (`config.position_extension`) is read inside
the graph: its position ids come from `attention_mask` (`extended_position_ids`), so the inputs stay
the same. Its outputs:

    embedding          [B, D] float32: the checkpoint's pooling, L2-normalised when `config.normalize`
    pooled             [B, D] float32: the same before normalisation (`LMKOutput.embeddings`)
    last_hidden_state  [B, T, D] float32: the final states (landmark vectors, token embeddings)

The graph carries the fingerprint of the torch weights it was exported from (`weights_fingerprint`,
over every weight format the folder holds); loading a graph from a folder whose weights have changed
since is refused, by path or by model id from a Hub-cache snapshot alike (`stale_graph="warn"` only
warns), as `lmk-embed push` refuses to publish one.

Loading: `AutoModel.from_pretrained(x, trust_remote_code=True, backend="onnx")` (`file_name=`
picks the int8 graph) returns an `LMKOnnxModel` (modeling_lmk.py): the checkpoint's config and
tokenizer, LMKModel's `encode()` / `encode_query()` / `prepare_features()`, and an `OnnxGraph` (an
`onnxruntime.InferenceSession` and its checks, here) in place of the torch weights, which are never
loaded. onnxruntime is imported only here, when that backend is asked for.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import numpy as np
import torch
from transformers.utils import logging

from .configuration_lmk import LMKConfig
from .encoding import TOKENIZER_LOADING_KWARGS, check_choice

logger = logging.get_logger(__name__)

BACKENDS = ("torch", "onnx")
FP32_FILE = "onnx/model.onnx"
QUANTIZED_FILES = {"int8": "onnx/model_qint8.onnx"}
ONNX_FILES = (FP32_FILE, *QUANTIZED_FILES.values())
# One session.run holds at most about this many bytes of attention scores (rows x heads x T x T float32):
# ONNX Runtime's CPU attention materialises them, so long inputs run a few rows at a time.
ATTENTION_BYTES_PER_RUN = 128 * 2**20
# ONNX Runtime fusions kept off when a session loads a graph. The export leaves each residual sum and
# LayerNorm as Add, Add, LayerNormalization, and each FFN bias and GELU as Add, Gelu: ONNX Runtime's CPU
# SkipLayerNormalization kernel runs about 4.5x slower than those three ops, and BiasGelu slower
# than Add and Gelu (docs/onnx.md, "Unfused LayerNorm and GELU"). Its load-time optimisations would fuse them back.
FUSIONS_OFF_AT_LOAD = ("SkipLayerNormFusion", "BiasGeluFusion")
INPUT_NAMES = ("input_ids", "attention_mask", "landmark_mask")
OUTPUT_NAMES = ("embedding", "pooled", "last_hidden_state")
GRAPH_FORMAT = "lmk-embed-onnx/1"
INSTALL_HINT = "pip install 'lmk-embed[onnx]' (or pip install onnxruntime onnx)"
STALE_GRAPH_CHOICES = ("error", "warn")
# The keyword arguments transformers' AutoModel adds on its way to `from_pretrained`; the ONNX model has no use for them.
_AUTO_KWARGS = ("trust_remote_code", "_from_auto", "adapter_kwargs", "code_revision")


# The CPU features ONNX Runtime's CPU kernels (MLAS) pick their paths by: wide vectors, the int8
# dot-product instructions (VNNI) and the matrix units (AMX). A graph records those of the CPU it was
# exported and measured on (`lmk_tuned_cpu`).
CPU_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> list[str] | None:
    """The `CPU_FEATURES` this machine's CPU has (Linux's `flags` line), or None where it cannot be read."""
    try:
        with open(cpuinfo) as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), None)
    except OSError:
        return None
    return None if flags is None else [feature for feature in CPU_FEATURES if feature in flags]


def warn_if_tuned_for_other_cpu(graph_metadata: dict, file_name: str, running: list[str] | None = None) -> None:
    """Warn once when the graph was tuned on a CPU with features (`lmk_tuned_cpu`) this one lacks:
    ONNX Runtime then takes slower kernels, and the graph may lose to backend='torch' here. Nothing
    is said where either CPU's features are unknown."""
    tuned = graph_metadata.get("lmk_tuned_cpu", "unknown")
    running = cpu_features() if running is None else running
    if tuned == "unknown" or running is None:
        return
    missing = [feature for feature in tuned.split(",") if feature and feature not in running]
    if missing:
        logger.warning_once(
            f"{file_name} was exported and measured on a CPU with {', '.join(missing)}, which this CPU lacks: ONNX "
            "Runtime takes other kernels here and may be slower than backend='torch'. Compare the two on this CPU "
            "(docs/onnx.md gives the figures per CPU family).")


# The int8 dot-product instructions: without any of them ONNX Runtime's int8 products take AVX2's
# 16-bit pair sums, and the int8 graph's scores move further from fp32's (docs/onnx.md).
VNNI_FEATURES = ("avx512_vnni", "avx_vnni", "amx_int8")


def warn_if_int8_without_vnni(graph_metadata: dict, file_name: str, running: list[str] | None = None) -> None:
    """Warn once when an int8 graph runs on a CPU with none of `VNNI_FEATURES`: measured there (AVX2
    kernels), int8 scored 0.012 nDCG@10 below fp32 on one of two out-of-domain splits, where VNNI CPUs
    stay within 0.003. Nothing is said for fp32 graphs or where the CPU's features are unknown."""
    running = cpu_features() if running is None else running
    if graph_metadata.get("lmk_quantization") != "int8" or running is None:
        return
    if not any(feature in running for feature in VNNI_FEATURES):
        logger.warning_once(
            f"{file_name} is int8 and this CPU has no VNNI ({', '.join(VNNI_FEATURES)}): ONNX Runtime's int8 products "
            "here move the vectors further from fp32's (0.012 nDCG@10 lower on one of two test splits, "
            "docs/onnx.md). Where quality matters, load onnx/model.onnx (fp32).")


def require_onnxruntime():
    """The `onnxruntime` module, or an ImportError naming what to install. Every import of onnxruntime in
    this file sits inside a function and a try block: transformers' remote-code loader skips imports in
    try blocks when it checks what a checkpoint's code needs, so loading stays possible without it."""
    try:
        import onnxruntime
    except ImportError as error:
        raise ImportError(f"backend='onnx' needs onnxruntime, which is not installed: {INSTALL_HINT}.") from error
    return onnxruntime


# Every weight format a checkpoint folder may hold (transformers reads safetensors first, then a torch
# pickle): the fingerprint covers them all, so a graph beside rewritten weights of any format is stale.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack")


def weight_files(folder) -> list[Path]:
    """The weight files of a checkpoint folder (`WEIGHT_PATTERNS`, top level), in name order."""
    return sorted({path for pattern in WEIGHT_PATTERNS for path in Path(folder).glob(pattern)}, key=lambda p: p.name)


def weights_fingerprint(folder) -> str:
    """sha256 over a checkpoint folder's weight files (`weight_files`: every shard and format, in name
    order): recorded in the graphs at export, so a graph exported from other weights is recognised at
    load and at push. A folder of safetensors only has the same fingerprint as before pickles counted."""
    digest = hashlib.sha256()
    files = weight_files(folder)
    if not files:
        raise FileNotFoundError(f"{folder} holds no weights ({', '.join(WEIGHT_PATTERNS)}).")
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def check_graph_weights(folder, graph_metadata: dict, file_name: str, stale_graph: str = "error",
                        remedy: str | None = None) -> None:
    """Refuse (or, `stale_graph="warn"`, warn about) a graph in a checkpoint `folder` (a local folder or
    a Hub-cache snapshot) that was exported from other torch weights than the folder's: its vectors are
    the old weights'. A folder without weights (a graph-only copy, or a snapshot where only the graph
    was downloaded) has nothing to compare with. `remedy` ends the message (default: the command that
    exports it again)."""
    check_choice("stale_graph", stale_graph, STALE_GRAPH_CHOICES)
    folder = Path(folder)
    files = weight_files(folder)
    if not files:
        return
    weights, exported = weights_fingerprint(folder), graph_metadata.get("lmk_weights_sha256")
    if exported == weights:
        return
    names = ", ".join(path.name for path in files)
    message = (f"{folder / file_name} was exported from other weights ({exported}) than the checkpoint's {names} "
               f"({weights}): its vectors are the old weights'. "
               f"{remedy or f'Export it again: lmk-embed export-onnx {folder}'}")
    if stale_graph == "error":
        raise ValueError(message + " (or load with stale_graph='warn').")
    warnings.warn(message, stacklevel=3)


# ---- the model on ONNX Runtime ----------------------------------------------------------------------


class OnnxGraph:
    """An exported LMK graph on an ONNX Runtime `session`, checked against `config` at load and run a
    few rows at a time: the rows of `LMKOnnxModel` (modeling_lmk.py), which holds no torch weights.
    This file imports no model file, so that model's file imports this one and nothing circles back."""

    def __init__(self, config: LMKConfig, session, file_name: str = FP32_FILE):
        self.config = config
        self.session = session
        self.file_name = file_name
        self.metadata = dict(session.get_modelmeta().custom_metadata_map)
        self.inputs = [item.name for item in session.get_inputs()]
        self.check()

    def check(self) -> None:
        info, config = self.metadata, self.config
        where = f"{config.name_or_path or 'this checkpoint'}: {self.file_name}"
        if info.get("lmk_embed_format") != GRAPH_FORMAT:
            raise ValueError(f"{where} is not a graph written by export_onnx (format {info.get('lmk_embed_format')!r}, "
                             f"expected {GRAPH_FORMAT!r}); export it again with `lmk-embed export-onnx`.")
        exported = (info.get("lmk_pooling"), info.get("lmk_normalize"), info.get("lmk_embedding_dim"))
        expected = (config.pooling, str(bool(config.normalize)).lower(), str(config.embedding_dim))
        if exported != expected:
            raise ValueError(f"{where} was exported with (pooling, normalize, dim) = {exported}, but config.json says "
                             f"{expected}; export it again with `lmk-embed export-onnx`.")
        missing = [name for name in INPUT_NAMES[:2] if name not in self.inputs]
        if missing or not set(OUTPUT_NAMES) <= {item.name for item in self.session.get_outputs()}:
            raise ValueError(f"{where} lacks the inputs {missing} or the outputs {list(OUTPUT_NAMES)}.")

    def max_positions(self) -> int | None:
        """The position limit recorded at export (`LMKModel.max_positions()` of the exported model)."""
        limit = self.metadata.get("lmk_max_positions")
        return int(limit) if limit else None

    def embed_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   landmark_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids / attention_mask / landmark_mask: [B, T] -> (pooled [B, D], last_hidden_state
        [B, T, D]), from `session.run` on a few rows at a time (`runs`). The graph computes the position
        ids itself."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if landmark_mask is None and "landmark_mask" in self.inputs:
            raise ValueError(f"`landmark_mask` is required for pooling={self.config.pooling!r}; use LMKTokenizer.")
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "landmark_mask": landmark_mask}
        arrays = {name: given[name].detach().cpu().numpy().astype(np.int64, copy=False) for name in self.inputs}
        rows, width = arrays["input_ids"].shape
        lengths = arrays["attention_mask"].sum(-1)
        pooled = np.empty((rows, self.config.embedding_dim), dtype=np.float32)
        hidden = np.zeros((rows, width, self.config.embedding_dim), dtype=np.float32)
        for start, stop in self.runs(lengths):
            used = max(int(lengths[start:stop].max()), 1)  # right padding: later columns are padding in every row
            feeds = {name: array[start:stop, :used] for name, array in arrays.items()}
            pooled[start:stop], hidden[start:stop, :used] = self.session.run(["pooled", "last_hidden_state"], feeds)
        return torch.from_numpy(pooled), torch.from_numpy(hidden)

    def runs(self, lengths: np.ndarray) -> list[tuple[int, int]]:
        """[start, stop) row ranges of one batch (row lengths `lengths` [B]), each run holding at most
        `ATTENTION_BYTES_PER_RUN` of attention scores at its longest row's length (at least one row)."""
        heads = int(getattr(self.config.backbone_config, "num_attention_heads", 1) or 1)
        spans, start = [], 0
        while start < len(lengths):
            stop, longest = start + 1, int(lengths[start])
            while stop < len(lengths):
                widest = max(longest, int(lengths[stop]))
                if (stop + 1 - start) * heads * widest * widest * 4 > ATTENTION_BYTES_PER_RUN:
                    break
                stop, longest = stop + 1, widest
            spans.append((start, stop))
            start = stop
        return spans


def make_session_options(ort, num_threads: int | None = None):
    """ONNX Runtime session options: every graph optimisation, `num_threads` intra-op threads (None: ORT's default)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if num_threads is not None:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads <= 0:
            raise ValueError(f"`num_threads` must be a positive integer, got {num_threads!r}.")
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
    return options


def new_session(ort, path, options=None, provider: str = "CPUExecutionProvider"):
    """An `onnxruntime.InferenceSession` on the graph at `path`, with `FUSIONS_OFF_AT_LOAD` kept off."""
    return ort.InferenceSession(str(path), options, providers=[provider], disabled_optimizers=list(FUSIONS_OFF_AT_LOAD))


def load_onnx_model(model_class: type, pretrained_model_name_or_path, *model_args, backend: str = "onnx",
                    file_name: str = FP32_FILE, provider: str = "CPUExecutionProvider", num_threads: int | None = None,
                    session_options=None, config: LMKConfig | None = None, stale_graph: str = "error", **kwargs):
    """An LMK checkpoint (folder or Hub id) on ONNX Runtime: `model_class(config, OnnxGraph(...))`
    (`LMKOnnxModel`, which `LMKModel.from_pretrained(backend="onnx")` passes in). `file_name` is the
    graph in the checkpoint (`onnx/model.onnx`, or `onnx/model_qint8.onnx`), `provider` the execution
    provider, `num_threads` the intra-op threads (or `session_options`, an `onnxruntime.SessionOptions`).
    The Hub arguments (revision, cache_dir, token, local_files_only, subfolder, ...) locate the graph,
    the config and the tokenizer alike. A local folder's graph must come from the folder's weights
    (`check_graph_weights`; `stale_graph="warn"` only warns), and so must a Hub checkpoint's, in the
    snapshot it was downloaded to (one where only the graph was downloaded has nothing to compare with)."""
    check_choice("backend", backend, BACKENDS)
    check_choice("stale_graph", stale_graph, STALE_GRAPH_CHOICES)
    if model_args:
        raise TypeError(f"backend='onnx' takes no positional model arguments, got {len(model_args)}.")
    hub = {name: kwargs.pop(name) for name in TOKENIZER_LOADING_KWARGS if name in kwargs}
    hub = {name: value for name, value in hub.items() if value is not None}
    for name in _AUTO_KWARGS:
        kwargs.pop(name, None)
    if kwargs:
        raise TypeError(f"backend='onnx' does not take {sorted(kwargs)}; it takes file_name, provider, num_threads "
                        "and the Hub arguments (revision, cache_dir, token, local_files_only, subfolder, ...).")
    ort = require_onnxruntime()
    from transformers.utils import cached_file

    if config is None:
        config = LMKConfig.from_pretrained(pretrained_model_name_or_path, **hub)
    try:
        path = cached_file(pretrained_model_name_or_path, file_name, **hub)
    except OSError as error:
        raise OSError(f"{pretrained_model_name_or_path!r} has no {file_name}: export it with `lmk-embed export-onnx "
                      f"CHECKPOINT` (--quantize int8 for {QUANTIZED_FILES['int8']}). ({' '.join(str(error).split())[:300]})"
                      ) from None
    if path is None:
        raise OSError(f"{pretrained_model_name_or_path!r} has no {file_name}: export it with `lmk-embed export-onnx CHECKPOINT`.")
    options = session_options if session_options is not None else make_session_options(ort, num_threads)
    graph = OnnxGraph(config, new_session(ort, path, options, provider), file_name)
    # The folder the graph was found in: the local folder, or the Hub-cache snapshot of a model id
    # (where the user cannot see the export history), both with the subfolder.
    found = Path(path).parents[len(Path(file_name).parts) - 1]
    local = Path(pretrained_model_name_or_path).is_dir()
    remedy = None if local else (f"The repository {pretrained_model_name_or_path!r} needs its graph exported again "
                                 "(lmk-embed export-onnx, then push); until then load it with backend='torch'")
    check_graph_weights(found, graph.metadata, file_name, stale_graph, remedy)
    if provider == "CPUExecutionProvider":
        running = cpu_features()  # read once for both checks
        warn_if_tuned_for_other_cpu(graph.metadata, file_name, running)
        warn_if_int8_without_vnni(graph.metadata, file_name, running)
    model = model_class(config, graph)
    model._tokenizer_loading_kwargs = hub
    return model


__all__ = ["BACKENDS", "CPU_FEATURES", "FP32_FILE", "GRAPH_FORMAT", "INPUT_NAMES", "INSTALL_HINT", "ONNX_FILES",
           "OUTPUT_NAMES", "QUANTIZED_FILES", "STALE_GRAPH_CHOICES", "WEIGHT_PATTERNS", "OnnxGraph",
           "check_graph_weights", "cpu_features", "load_onnx_model", "require_onnxruntime",
           "VNNI_FEATURES", "warn_if_int8_without_vnni", "warn_if_tuned_for_other_cpu", "weight_files", "weights_fingerprint"]
