"""Writing an LMK checkpoint's ONNX graphs (`lmk-embed export-onnx`): export, int8 quantisation and
the weights fingerprint the graphs carry. Tooling: a checkpoint ships only the runtime that loads and
runs a graph (`lmk_embed/onnx_backend.py`, whose file names, graph format and input and output names
this module writes to).
"""

from __future__ import annotations

import json
import logging
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lmk_embed.configuration_lmk import LMKConfig
from lmk_embed.encoding import check_choice
from lmk_embed.modeling_lmk import LMKModel
from lmk_embed.onnx_backend import (FP32_FILE, GRAPH_FORMAT, INPUT_NAMES, INSTALL_HINT, OUTPUT_NAMES, QUANTIZED_FILES,
                                    cpu_features, new_session, require_onnxruntime, weights_fingerprint)

OPSET = 17
# Backbones whose exported graph ONNX Runtime's transformer optimizer fuses (its `model_type="bert"` patterns).
FUSED_BACKBONES = ("bert", "roberta", "xlm-roberta")
# Largest difference allowed between the exported fp32 graph and the torch model on the export's check.
EXPORT_TOLERANCE = 1e-4
# Why recurrent checkpoints are not exported (docs/onnx.md says more).
RECURRENT_ONNX_REFUSAL = (
    "ONNX export is for LMK checkpoints; recurrent checkpoints are refused: their vertical schedule is a "
    "Python loop over blocks that carries each layer's conv and SSM state, which a traced graph would unroll "
    "for one length, and their CPU time is the scan's own products and elementwise passes, which ONNX Runtime "
    "has no fused kernel for. Run them on torch (see docs/onnx.md)"
)
_PROBE_TEXTS = [
    "The json module exposes an API familiar to users of the marshal and pickle modules. " * 6,
    "Zip archives: read and write ZIP files.",
    "Text wrapping and filling. The textwrap module provides some convenience functions, as well as "
    "TextWrapper, the class that does all the work. " * 3,
]


def require_onnx():
    """The `onnx` module (export and quantisation write files with it), or an ImportError naming what to install."""
    try:
        import onnx
    except ImportError as error:
        raise ImportError(f"Exporting to ONNX needs the onnx package, which is not installed: {INSTALL_HINT}.") from error
    return onnx


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
        # Fused graphs: attention without its mask (the flash kernel) when the batch has no padding.
        "lmk_attention": "unmasked-when-unpadded" if fused else "plain",
        # The CPU features of the machine the graph was exported, quantised and measured on: the runtime
        # warns once where the running CPU lacks some (its kernels then take other paths).
        "lmk_tuned_cpu": ",".join(cpu_features() or ["unknown"]),
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
    for an extended position table, a row longer than the original positions (read from the extended rows).

    Each row is one sequence, as the graph computes (one vector per row): read in one pass whatever the
    checkpoint's `long_input`, since `windows` would cut a long row into several, pooled per text by the
    runtime (`combine_windows`) around the graph, not in it."""
    limit = model.max_positions()
    short = min(limit or 512, 96)
    probe = {"training": False, "long_input": "one-pass"}
    batches = [model.prepare_features(_PROBE_TEXTS[:2], max_length=short, **probe),
               model.prepare_features(_PROBE_TEXTS, max_length=short // 2 + 5, **probe)]
    extension = model.config.position_extension
    if extension is not None and "first_row" in extension:
        length = min(int(extension["original_positions"]) + 200, int(extension["max_positions"]))
        long_text = _PROBE_TEXTS[0] * (length // 40 + 1)  # more tokens than `length`: truncated to it
        batches.append(model.prepare_features([long_text, _PROBE_TEXTS[1]], max_length=length, **probe))
    return batches


def export_onnx(checkpoint, quantize: str | None = None, opset: int = OPSET, fuse: bool = True) -> dict[str, Path]:
    """Export the LMK checkpoint folder `checkpoint` to `checkpoint/onnx/model.onnx` (and, with
    `quantize="int8"`, `onnx/model_qint8.onnx`); returns {"fp32": path, "int8": path}.

    The checkpoint is loaded with eager attention and traced with `torch.onnx.export` (opset 17,
    dynamic batch and sequence axes). For BERT-family backbones (`FUSED_BACKBONES`) and `fuse=True`,
    ONNX Runtime's transformer optimizer then fuses attention, the embeddings' LayerNorm and GELU into its
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
    if family == "recurrent_embedder":
        raise ValueError(f"`checkpoint` {str(folder)!r} is a recurrent checkpoint. {RECURRENT_ONNX_REFUSAL}")
    if family != LMKConfig.model_type:
        raise ValueError(f"`checkpoint` {str(folder)!r} is not an LMK checkpoint folder (config.json model_type {family!r})")
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
        session = new_session(ort, target)
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
    (`opt_level=0`), so the graph keeps no optimisation that is specific to one execution provider.
    LayerNorm stays Add, Add, LayerNormalization and the FFN's GELU Add, Gelu, faster on ONNX Runtime's
    CPU kernels than SkipLayerNormalization and BiasGelu (`FUSIONS_OFF_AT_LOAD` keeps them so at load).

    Attention is fused as `MultiHeadAttention`, then run without a mask when the batch has no padding
    and as the `Attention` op when it has (`_attention_by_padding`): without a mask ONNX Runtime's CPU
    kernel takes its flash path, which streams the scores where the masked ops materialise them
    (docs/onnx.md, "Where the graph loses at long lengths")."""
    try:  # lazy, and inside try: transformers' remote-code loader then does not require onnxruntime
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as error:
        raise ImportError(f"Fusing the graph needs onnxruntime, which is not installed: {INSTALL_HINT}.") from error
    options = FusionOptions("bert")
    options.use_multi_head_attention = True
    options.enable_skip_layer_norm = options.enable_bias_skip_layer_norm = options.enable_bias_gelu = False
    optimized = optimize_model(str(path), model_type="bert", num_heads=int(backbone_config.num_attention_heads),
                               hidden_size=int(backbone_config.hidden_size), opt_level=0, optimization_options=options)
    graph = optimized.model.graph
    attentions = [node for node in graph.node if node.op_type == "MultiHeadAttention"]
    if len(attentions) != int(backbone_config.num_hidden_layers):
        raise RuntimeError(f"ONNX Runtime's optimizer fused {len(attentions)} attention layers of "
                           f"{backbone_config.num_hidden_layers}; this onnxruntime's fusions do not fit the graph.")
    _attention_by_padding(graph, attentions)
    optimized.save_model_to_file(str(path))


def _attention_by_padding(graph, attentions: list) -> None:
    """Replace each fused `MultiHeadAttention` in `attentions`, and the three MatMuls that project its
    query, key and value from one input by constant weights [H, H], with an `If` on "no row of the
    batch is padded" (the smallest `attention_mask` value is 1):

    - then: one MatMul by the three weights side by side [H, 3H], a Split, and `MultiHeadAttention`
      without its key padding mask, which ONNX Runtime's CPU kernel needs for its flash path (it
      streams the scores);
    - else: the `Attention` op on the same merged weights and the mask, as ONNX Runtime fuses BERT by
      default (faster than the masked `MultiHeadAttention` on padded batches).

    Both branches compute the same product; only the kernel differs."""
    from onnx import TensorProto, helper, numpy_helper

    producers = {output: node for node in graph.node for output in node.output}
    readers = Counter(name for node in graph.node for name in node.input)
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    unpadded = "lmk_batch_unpadded"
    replaced = {}  # id(node) -> the nodes that take its place (none for the dropped projections)
    for index, attention in enumerate(attentions):
        projections = [producers.get(name) for name in attention.input[:3]]
        if not all(node is not None and node.op_type == "MatMul" and node.input[1] in initializers
                   and readers[node.output[0]] == 1 for node in projections) \
                or len({node.input[0] for node in projections}) != 1 or len(attention.input) < 5:
            raise RuntimeError(f"{attention.name}: query, key and value are not three MatMuls of one input by constant "
                               "weights, or the mask is missing; this onnxruntime's fusions do not fit the graph.")
        hidden, bias, mask = projections[0].input[0], attention.input[3], attention.input[4]
        weight, sizes, output = f"lmk_qkv_weight_{index}", f"lmk_qkv_sizes_{index}", attention.output[0]
        weights = [numpy_helper.to_array(initializers[node.input[1]]) for node in projections]
        graph.initializer.append(numpy_helper.from_array(np.concatenate(weights, axis=1), weight))
        graph.initializer.append(numpy_helper.from_array(np.array([w.shape[1] for w in weights], np.int64), sizes))
        split = [f"lmk_{part}_{index}" for part in ("qkv", "query", "key", "value")]
        unmasked = helper.make_node("MultiHeadAttention", [*split[1:], bias], [f"{output}_unmasked"],
                                    domain="com.microsoft", name=f"lmk_attention_unmasked_{index}")
        masked = helper.make_node("Attention", [hidden, weight, bias, mask], [f"{output}_masked"],
                                  domain="com.microsoft", name=f"lmk_attention_masked_{index}")
        for node in (unmasked, masked):
            node.attribute.extend(attention.attribute)
        then_branch = _float_branch(f"lmk_unpadded_{index}", [
            helper.make_node("MatMul", [hidden, weight], [split[0]], name=f"lmk_qkv_matmul_{index}"),
            helper.make_node("Split", [split[0], sizes], split[1:], axis=-1, name=f"lmk_qkv_split_{index}"),
            unmasked])
        else_branch = _float_branch(f"lmk_padded_{index}", [masked])
        replaced[id(attention)] = [helper.make_node("If", [unpadded], [output], name=f"lmk_attention_{index}",
                                                    then_branch=then_branch, else_branch=else_branch)]
        replaced.update({id(node): [] for node in projections})
    nodes = [new for node in graph.node for new in replaced.get(id(node), [node])]
    nodes[:0] = [
        helper.make_node("ReduceMin", ["attention_mask"], ["lmk_mask_min"], keepdims=0, name="lmk_mask_min"),
        helper.make_node("Constant", [], ["lmk_one"], value=helper.make_tensor("lmk_one", TensorProto.INT64, [], [1]),
                         name="lmk_one"),
        helper.make_node("Equal", ["lmk_mask_min", "lmk_one"], [unpadded], name=unpadded),
    ]
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    used |= {name for node in graph.node if node.op_type == "If" for attr in node.attribute
             for inner in attr.g.node for name in inner.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _float_branch(graph_name: str, nodes: list):
    """An `If` branch of `nodes` whose last output is the branch's result, every tensor typed float32:
    the quantiser reads a product's type from value_info to cast it back."""
    from onnx import TensorProto, helper

    typed = [helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None) for node in nodes for tensor in node.output]
    return helper.make_graph(nodes, graph_name, [], typed[-1:], value_info=typed[:-1])


class _DropMessage(logging.Filter):
    """Drops log records whose message contains `text`."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quantize_graph(source: Path, target: Path, metadata: dict[str, str]) -> Path:
    """int8 dynamic quantisation of the fp32 graph `source` into `target`: the weights of every MatMul
    with a constant right-hand side (the linear layers, fused attention's merged QKV projection
    among them) as signed int8, one scale per output channel, and activations quantised per batch at
    run time. Embeddings, LayerNorm and the attention products stay float32. Chosen by measurement on
    an AVX-512 VNNI CPU (docs/onnx.md): one scale per tensor lowered the lowest cosine to torch to 0.88
    (per channel: 0.99), and on CPUs without VNNI ONNX Runtime's u8s8 products saturate."""
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
                         extra_options={"MatMulConstBOnly": True, "EnableSubgraph": True,
                                        "DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        logging.getLogger().removeFilter(advice)
    _write_metadata(target, metadata)
    return target


__all__ = ["EmbeddingGraph", "export_onnx", "graph_metadata", "quantize_graph", "require_onnx", "weights_fingerprint"]


# ---- the command (`lmk-embed export-onnx`) ------------------------------------------------------------

def add_export_onnx_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-onnx", help="Write an LMK checkpoint's ONNX graphs (onnx/model.onnx; int8 too with --quantize int8).")
    parser.add_argument("checkpoint", help="an LMK checkpoint folder; the graphs are written into its onnx/ folder")
    parser.add_argument("--quantize", default=None, choices=["int8"],
                        help="also write onnx/model_qint8.onnx (dynamic int8 quantisation of the linear layers)")
    parser.add_argument("--no-fuse", action="store_true",
                        help="keep plain ONNX operators: no ONNX Runtime attention / LayerNorm / GELU fusions")
    parser.set_defaults(handler=run_export_onnx)


def run_export_onnx(args) -> int:
    from lmk_embed_tools.commandline import UsageError, check_checkpoint_folder

    folder = check_checkpoint_folder(args.checkpoint)
    try:
        written = export_onnx(folder, quantize=args.quantize, fuse=not args.no_fuse)
    except (ImportError, ValueError) as error:  # not an LMK checkpoint, or onnx missing: the message names it
        raise UsageError(str(error)) from None
    for kind, path in written.items():
        print(f"{kind}: {path} ({path.stat().st_size / 2**20:.1f} MB)")
    print("Load with AutoModel.from_pretrained(CHECKPOINT, trust_remote_code=True, backend='onnx') or "
          "SentenceTransformer(CHECKPOINT, trust_remote_code=True, backend='onnx'); `lmk-embed card` lists the "
          "graphs in the model card.")
    return 0
