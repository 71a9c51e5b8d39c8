"""LMK checkpoints on ONNX Runtime: the exported graph, and `LMKModel`'s encode() surface running on it.

A checkpoint folder may hold, beside its torch weights (written by `export_onnx`, `lmk-embed export-onnx`):

    onnx/model.onnx        fp32: `torch.onnx.export`, opset 17, eager attention
    onnx/model_qint8.onnx  int8: `onnxruntime.quantization.quantize_dynamic` of it (MatMul weights only)

The graph takes `input_ids`, `attention_mask` and `landmark_mask`, int64 [B, T], with dynamic B and T
(up to the checkpoint's position limit; pooling `cls` and `mean` read no landmark mask, so their graph
takes the first two only). An extended position table (`config.position_extension`) is read inside
the graph: its position ids come from `attention_mask` (`extended_position_ids`), so the inputs stay
the same. Its outputs:

    embedding          [B, D] float32: the checkpoint's pooling, L2-normalised when `config.normalize`
    pooled             [B, D] float32: the same before normalisation (`LMKOutput.embeddings`)
    last_hidden_state  [B, T, D] float32: the final states (landmark vectors, token embeddings)

Loading: `AutoModel.from_pretrained(x, trust_remote_code=True, backend="onnx")` (`file_name=`
picks the int8 graph) returns an `LMKOnnxModel`: the checkpoint's config and tokenizer, LMKModel's
`encode()` / `encode_query()` / `prepare_features()`, and an `onnxruntime.InferenceSession` in place
of the torch weights, which are never loaded. onnxruntime (and onnx, for exporting) are imported only
here, when that backend is asked for.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .configuration_lmk import LMKConfig
from .encoding import TOKENIZER_LOADING_KWARGS, check_choice
from .modeling_lmk import LMKModel, LMKOutput, combine_windows

BACKENDS = ("torch", "onnx")
FP32_FILE = "onnx/model.onnx"
QUANTIZED_FILES = {"int8": "onnx/model_qint8.onnx"}
ONNX_FILES = (FP32_FILE, *QUANTIZED_FILES.values())
OPSET = 17
# Backbones whose exported graph ONNX Runtime's transformer optimizer fuses (its `model_type="bert"` patterns).
FUSED_BACKBONES = ("bert", "roberta", "xlm-roberta")
# One session.run holds at most about this many bytes of attention scores (rows x heads x T x T float32):
# ONNX Runtime's CPU attention materialises them, so long inputs run a few rows at a time.
ATTENTION_BYTES_PER_RUN = 128 * 2**20
INPUT_NAMES = ("input_ids", "attention_mask", "landmark_mask")
OUTPUT_NAMES = ("embedding", "pooled", "last_hidden_state")
GRAPH_FORMAT = "lmk-embed-onnx/1"
INSTALL_HINT = "pip install 'lmk-embed[onnx]' (or pip install onnxruntime onnx)"
# Largest difference allowed between the exported fp32 graph and the torch model on the export's check.
EXPORT_TOLERANCE = 1e-4
# The keyword arguments transformers' AutoModel adds on its way to `from_pretrained`; the ONNX model has no use for them.
_AUTO_KWARGS = ("trust_remote_code", "_from_auto", "adapter_kwargs", "code_revision")
_PROBE_TEXTS = [
    "The json module exposes an API familiar to users of the marshal and pickle modules. " * 6,
    "Zip archives: read and write ZIP files.",
    "Text wrapping and filling. The textwrap module provides some convenience functions, as well as "
    "TextWrapper, the class that does all the work. " * 3,
]


def require_onnxruntime():
    """The `onnxruntime` module, or an ImportError naming what to install. Every import of onnxruntime and
    onnx in this file sits inside a function and a try block: transformers' remote-code loader skips
    imports in try blocks when it checks what a checkpoint's code needs, so loading stays possible without them."""
    try:
        import onnxruntime
    except ImportError as error:
        raise ImportError(f"backend='onnx' needs onnxruntime, which is not installed: {INSTALL_HINT}.") from error
    return onnxruntime


def require_onnx():
    """The `onnx` module (export and quantisation write files with it), or an ImportError naming what to install."""
    try:
        import onnx
    except ImportError as error:
        raise ImportError(f"Exporting to ONNX needs the onnx package, which is not installed: {INSTALL_HINT}.") from error
    return onnx


def weights_fingerprint(folder) -> str:
    """sha256 over a checkpoint folder's safetensors weights (every shard, in name order): recorded in
    the graphs at export, so a graph exported from other weights is recognised (`lmk-embed push` refuses it)."""
    digest = hashlib.sha256()
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no .safetensors weights.")
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


# ---- the graph ----------------------------------------------------------------------------------


class EmbeddingGraph(nn.Module):
    """What the ONNX file computes: LMKModel's forward (positions, backbone, pooling), then the
    config's normalisation.

    forward(input_ids, attention_mask, landmark_mask: int64 [B, T]) ->
        (embedding [B, D], pooled [B, D], last_hidden_state [B, T, D]), float32
    """

    def __init__(self, model: LMKModel):
        super().__init__()
        self.model = model
        self.normalize = bool(model.config.normalize)

    def forward(self, input_ids, attention_mask, landmark_mask):
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, landmark_mask=landmark_mask)
        pooled = output.embeddings.float()
        embedding = F.normalize(pooled, p=2, dim=-1) if self.normalize else pooled
        return embedding, pooled, output.last_hidden_state.float()


def graph_metadata(model: LMKModel, weights: str, quantization: str, fused: bool) -> dict[str, str]:
    """The facts the runtime reads from a graph (ONNX `metadata_props`, all strings)."""
    limit = model.max_positions()
    return {
        "lmk_embed_format": GRAPH_FORMAT,
        "lmk_pooling": model.config.pooling,
        "lmk_normalize": str(bool(model.config.normalize)).lower(),
        "lmk_embedding_dim": str(model.config.embedding_dim),
        "lmk_max_positions": "" if limit is None else str(int(limit)),
        "lmk_weights_sha256": weights,
        "lmk_quantization": quantization,
        "lmk_fused": "bert" if fused else "none",
    }


def _write_metadata(path: Path, metadata: dict[str, str]) -> None:
    onnx = require_onnx()
    graph = onnx.load(str(path))
    kept = [prop for prop in graph.metadata_props if prop.key not in metadata]
    del graph.metadata_props[:]
    graph.metadata_props.extend(kept)
    for key, value in metadata.items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))


def _probe_batches(model: LMKModel) -> list[dict[str, torch.Tensor]]:
    """Batches the export is traced on (the first) and checked on: padded rows of several lengths and,
    for an extended position table, a row longer than the original positions (read from the extended rows)."""
    limit = model.max_positions()
    short = min(limit or 512, 96)
    batches = [model.prepare_features(_PROBE_TEXTS[:2], max_length=short, training=False),
               model.prepare_features(_PROBE_TEXTS, max_length=short // 2 + 5, training=False)]
    extension = model.config.position_extension
    if extension is not None and "first_row" in extension:
        length = min(int(extension["original_positions"]) + 200, int(extension["max_positions"]))
        long_text = _PROBE_TEXTS[0] * (length // 40 + 1)  # more tokens than `length`: truncated to it
        batches.append(model.prepare_features([long_text, _PROBE_TEXTS[1]], max_length=length, training=False))
    return batches


def export_onnx(checkpoint, quantize: str | None = None, opset: int = OPSET, fuse: bool = True) -> dict[str, Path]:
    """Export the LMK checkpoint folder `checkpoint` to `checkpoint/onnx/model.onnx` (and, with
    `quantize="int8"`, `onnx/model_qint8.onnx`); returns {"fp32": path, "int8": path}.

    The checkpoint is loaded with eager attention and traced with `torch.onnx.export` (opset 17,
    dynamic batch and sequence axes). For BERT-family backbones (`FUSED_BACKBONES`) and `fuse=True`,
    ONNX Runtime's transformer optimizer then fuses attention, LayerNorm and GELU into its contrib
    operators (the com.microsoft domain, so the graph runs on ONNX Runtime). The fp32 graph is run on
    ONNX Runtime on other batches than the traced one (other batch sizes, lengths and padding, and
    past the original positions where the table is extended) and must give the torch model's vectors
    within 1e-4, or nothing is kept.
    """
    if quantize is not None:
        check_choice("quantize", quantize, QUANTIZED_FILES)
    folder = Path(checkpoint)
    config_file = folder / "config.json"
    family = json.loads(config_file.read_text()).get("model_type") if config_file.is_file() else None
    if family != LMKConfig.model_type:
        raise ValueError(f"`checkpoint` {str(folder)!r} is not an LMK checkpoint folder (model_type {family!r}): only LMK "
                         "checkpoints are exported; recurrent ones run on torch (their block loop carries state).")
    ort, onnx = require_onnxruntime(), require_onnx()
    model = LMKModel.from_pretrained(folder, attn_implementation="eager").eval()
    weights = weights_fingerprint(folder)
    batches = _probe_batches(model)
    target = folder / FP32_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    graph = EmbeddingGraph(model).eval()
    dynamic = {name: {0: "batch", 1: "sequence"} for name in (*INPUT_NAMES, "last_hidden_state")}
    dynamic.update({"embedding": {0: "batch"}, "pooled": {0: "batch"}})
    traced = batches[0]
    written = {"fp32": target}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The TorchScript exporter (dynamo=False) needs no onnxscript; it warns that it is the legacy
            # one, and about a traced shape check in transformers' mask code. The graph is checked below.
            warnings.simplefilter("ignore")
            torch.onnx.export(graph, tuple(traced[name] for name in INPUT_NAMES), str(target), dynamo=False,
                              opset_version=opset, input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES),
                              dynamic_axes=dynamic, do_constant_folding=True)
        fused = fuse and model.config.backbone_config.model_type in FUSED_BACKBONES
        if fused:
            _fuse(target, model.config.backbone_config)
        _write_metadata(target, graph_metadata(model, weights, "none", fused))
        onnx.checker.check_model(str(target))
        session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
        for batch in batches:
            with torch.no_grad():
                expected = model(**batch).embeddings.float().numpy()
            feeds = {i.name: batch[i.name].numpy() for i in session.get_inputs()}
            difference = float(np.abs(session.run(["pooled"], feeds)[0] - expected).max())
            if not difference <= EXPORT_TOLERANCE:
                raise RuntimeError(
                    f"the exported graph differs from the torch model by {difference:.3g} (> {EXPORT_TOLERANCE}) on a "
                    f"batch of shape {tuple(batch['input_ids'].shape)}; nothing was kept.")
        if quantize is not None:
            written[quantize] = folder / QUANTIZED_FILES[quantize]
            quantize_graph(target, written[quantize], graph_metadata(model, weights, quantize, fused))
    except BaseException:
        for path in written.values():
            path.unlink(missing_ok=True)
        raise
    return written


def _fuse(path: Path, backbone_config) -> None:
    """ONNX Runtime's transformer optimizer on the graph at `path` (in place): its Python fusions only
    (`opt_level=0`), so the graph keeps no optimisation that is specific to one execution provider."""
    try:  # lazy, and inside try: transformers' remote-code loader then does not require onnxruntime
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as error:
        raise ImportError(f"Fusing the graph needs onnxruntime, which is not installed: {INSTALL_HINT}.") from error
    optimized = optimize_model(str(path), model_type="bert", num_heads=int(backbone_config.num_attention_heads),
                               hidden_size=int(backbone_config.hidden_size), opt_level=0)
    optimized.save_model_to_file(str(path))


class _DropMessage(logging.Filter):
    """Drops log records whose message contains `text`."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quantize_graph(source: Path, target: Path, metadata: dict[str, str]) -> Path:
    """int8 dynamic quantisation of the fp32 graph `source` into `target`: the weights of every MatMul
    with a constant right-hand side (the linear layers) and of fused attention's QKV projection as
    int8, one scale per output channel, and activations quantised per batch at run time. Embeddings,
    LayerNorm and the attention products stay float32. (One scale per tensor loses more: on CPUs
    without VNNI, ONNX Runtime's u8s8 products saturate.)"""
    onnx = require_onnx()
    try:  # lazy, and inside try: transformers' remote-code loader then does not require onnxruntime
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as error:
        raise ImportError(f"Quantising the graph needs onnxruntime, which is not installed: {INSTALL_HINT}.") from error

    advice = _DropMessage("pre-processing before quantization")  # logged on the root logger, for image models
    logging.getLogger().addFilter(advice)
    try:
        quantize_dynamic(str(source), str(target), op_types_to_quantize=["MatMul", "Attention"], weight_type=QuantType.QInt8,
                         per_channel=True, reduce_range=False,
                         extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        logging.getLogger().removeFilter(advice)
    _write_metadata(target, metadata)
    return target


# ---- the model on ONNX Runtime ----------------------------------------------------------------------


class LMKOnnxModel(LMKModel):
    """`LMKModel` whose forward runs an ONNX graph on ONNX Runtime: inference only, CPU tensors in and out.

    Everything else is LMKModel's: the config, the tokenizer (loaded from the checkpoint on first use),
    `encode()` with its options and batching, `prepare_features`, the sentence-transformers module's
    calls. It holds no torch weights: `__init__` builds no backbone, and training, saving and moving it
    to another device are refused.
    """

    def __init__(self, config: LMKConfig, session, file_name: str = FP32_FILE):
        # PreTrainedModel's set-up only: LMKModel's would build the backbone's torch weights.
        super(LMKModel, self).__init__(config)
        config.check()
        self.session = session
        self.file_name = file_name
        self._tokenizer = None
        self._granularity_draws = random.Random(config.splitter_seed)
        self.graph_metadata = dict(session.get_modelmeta().custom_metadata_map)
        self.graph_inputs = [item.name for item in session.get_inputs()]
        self._check_graph()
        self.eval()

    def _check_graph(self) -> None:
        info, config = self.graph_metadata, self.config
        where = f"{config.name_or_path or 'this checkpoint'}: {self.file_name}"
        if info.get("lmk_embed_format") != GRAPH_FORMAT:
            raise ValueError(f"{where} is not a graph written by export_onnx (format {info.get('lmk_embed_format')!r}, "
                             f"expected {GRAPH_FORMAT!r}); export it again with `lmk-embed export-onnx`.")
        exported = (info.get("lmk_pooling"), info.get("lmk_normalize"), info.get("lmk_embedding_dim"))
        expected = (config.pooling, str(bool(config.normalize)).lower(), str(config.embedding_dim))
        if exported != expected:
            raise ValueError(f"{where} was exported with (pooling, normalize, dim) = {exported}, but config.json says "
                             f"{expected}; export it again with `lmk-embed export-onnx`.")
        missing = [name for name in INPUT_NAMES[:2] if name not in self.graph_inputs]
        if missing or not set(OUTPUT_NAMES) <= {item.name for item in self.session.get_outputs()}:
            raise ValueError(f"{where} lacks the inputs {missing} or the outputs {list(OUTPUT_NAMES)}.")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`load_onnx_model` (this class is never loaded from torch weights)."""
        return load_onnx_model(pretrained_model_name_or_path, *model_args, **kwargs)

    # ---- what a model without torch weights refuses or answers itself ----------------------------

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def max_positions(self) -> int | None:
        """The position limit recorded at export (`LMKModel.max_positions()` of the exported model)."""
        limit = self.graph_metadata.get("lmk_max_positions")
        return int(limit) if limit else None

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

    # ---- forward -------------------------------------------------------------------------------

    def forward(self, input_ids=None, attention_mask=None, landmark_mask=None, inputs_embeds=None,
                window_document=None, **kwargs) -> LMKOutput:
        """input_ids / attention_mask / landmark_mask: [B, T] -> LMKOutput(embeddings [B, D],
        last_hidden_state [B, T, D]), from one `session.run`. Position ids come from the graph itself.
        With `window_document` [B] (windows of documents), embeddings are per document, as in LMKModel."""
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("backend='onnx' takes `input_ids` (the graph embeds them itself), not `inputs_embeds`.")
        if kwargs.get("position_ids") is not None:
            raise ValueError("backend='onnx' computes position ids inside the graph: do not pass `position_ids`.")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if landmark_mask is None and "landmark_mask" in self.graph_inputs:
            raise ValueError(f"`landmark_mask` is required for pooling={self.config.pooling!r}; use LMKTokenizer.")
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "landmark_mask": landmark_mask}
        arrays = {name: given[name].detach().cpu().numpy().astype(np.int64, copy=False) for name in self.graph_inputs}
        rows, width = arrays["input_ids"].shape
        lengths = arrays["attention_mask"].sum(-1)
        pooled = np.empty((rows, self.config.embedding_dim), dtype=np.float32)
        hidden = np.zeros((rows, width, self.config.embedding_dim), dtype=np.float32)
        for start, stop in self.runs(lengths):
            used = max(int(lengths[start:stop].max()), 1)  # right padding: later columns are padding in every row
            feeds = {name: array[start:stop, :used] for name, array in arrays.items()}
            pooled[start:stop], hidden[start:stop, :used] = self.session.run(["pooled", "last_hidden_state"], feeds)
        embeddings = torch.from_numpy(pooled)
        if window_document is not None:
            embeddings = combine_windows(embeddings, landmark_mask, window_document)
        return LMKOutput(embeddings=embeddings, last_hidden_state=torch.from_numpy(hidden))

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


def load_onnx_model(pretrained_model_name_or_path, *model_args, backend: str = "onnx", file_name: str = FP32_FILE,
                    provider: str = "CPUExecutionProvider", num_threads: int | None = None, session_options=None,
                    config: LMKConfig | None = None, **kwargs) -> LMKOnnxModel:
    """An LMK checkpoint (folder or Hub id) on ONNX Runtime: `file_name` is the graph in the checkpoint
    (`onnx/model.onnx`, or `onnx/model_qint8.onnx`), `provider` the execution provider, `num_threads`
    the intra-op threads (or `session_options`, an `onnxruntime.SessionOptions`). The Hub arguments
    (revision, cache_dir, token, local_files_only, subfolder, ...) locate the graph, the config and the
    tokenizer alike."""
    check_choice("backend", backend, BACKENDS)
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
    session = ort.InferenceSession(str(path), options, providers=[provider])
    model = LMKOnnxModel(config, session, file_name=file_name)
    model._tokenizer_loading_kwargs = hub
    return model


__all__ = ["BACKENDS", "EmbeddingGraph", "FP32_FILE", "LMKOnnxModel", "ONNX_FILES", "QUANTIZED_FILES", "export_onnx",
           "load_onnx_model", "require_onnxruntime", "weights_fingerprint"]
