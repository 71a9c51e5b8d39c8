"""Model cards for our checkpoints: huggingface_hub's ModelCard / ModelCardData and `template.md`.

`write_card(checkpoint)` writes `README.md` (and, when an extrapolation result exists, the plot
`ndcg_vs_max_length.png`) into a checkpoint folder from what the folder holds: `config.json`,
the saved training run (`run_config.yaml`), recorded evaluation results (`eval_results.json`,
written by `record_results`) and the exported ONNX graphs (`onnx/`, written by `lmk-embed
export-onnx`). Re-run it whenever the results change or the graphs are exported.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from lmk_embed import lora_target_modules
from lmk_embed.encoding import max_length_default
from lmk_embed.onnx_backend import FP32_FILE, ONNX_FILES, QUANTIZED_FILES, weights_fingerprint

TEMPLATE = Path(__file__).resolve().parent / "template.md"
RESULTS_FILE = "eval_results.json"
PLOT_FILE = "ndcg_vs_max_length.png"
MODEL_ID_PLACEHOLDER = "your-org/your-model"
# The card's metadata key for the fingerprint of the weights it describes: `lmk-embed push` refuses
# a card whose weights have changed since it was written.
WEIGHTS_KEY = "weights_sha256"


def check_model_id(model_id) -> str:
    """`model_id` as the Hub names a model: namespace/name."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model_id)
        valid = model_id.count("/") == 1
    except (HFValidationError, AttributeError):
        valid = False
    if not valid:
        raise ValueError(f"`model_id` must look like org/name (with its namespace), got {model_id!r}")
    return model_id

CITATIONS = {
    # Author lists as arXiv gives them (2601.21525, 2604.18199).
    "lmk_embedder": """@article{doshi2026lmk,
  title   = {LMK > CLS: Landmark Pooling for Dense Embeddings},
  author  = {Doshi, Meet and Trivedi, Aashka and Kumar, Vishwajeet and Awasthy, Parul and Li, Yulong and
             Sen, Jaydeep and Florian, Radu and Joshi, Sachindra},
  journal = {arXiv preprint arXiv:2601.21525},
  year    = {2026}
}""",
    "recurrent_embedder": """@article{grantner2026recurrent,
  title   = {Linear-Time and Constant-Memory Text Embeddings Based on Recurrent Language Models},
  author  = {Grantner, Tobias and Sallinger, Emanuel and Flechl, Martin},
  journal = {arXiv preprint arXiv:2604.18199},
  year    = {2026}
}""",
}

LIMITATIONS = {
    "lmk_embedder": [
        "Landmark pooling averages one vector per chunk: a single relevant sentence in a very long document "
        "(needle / passkey retrieval) is diluted, a weakness the LMK paper reports.",
        "The `sentence` splitter is weaker on code, whose line structure does not follow sentence punctuation.",
        "Inputs longer than the backbone's position limit are truncated (landmarks count against it); a "
        "warning says so.",
    ],
    "recurrent_embedder": [
        "The embedding is the final recurrent state at EOS: a fixed-size state summarises the whole text, so "
        "details from early in a very long document can fade.",
        "Queries need the instruction prefix (`encode_query` adds it); documents take none.",
        "On CPU the vertical schedule uses a plain-torch scan; the fused CUDA kernels need the `cuda` extra.",
    ],
}
NOT_EVALUATED = "Not evaluated here: MTEB, MLDR, LongEmbed or any benchmark beyond those in the table above."


def load_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def record_results(checkpoint: str | Path, results: list[dict] | None = None, extrapolation: dict | None = None,
                   baselines: list[dict] | None = None) -> Path:
    """Store evaluation results beside a checkpoint, for its card.

    results: [{"dataset", "dataset_type", "split", "metric", "value", "max_length"}, ...]
    extrapolation: a length curve per task, [{"dataset", "metric", "points": {max_length: value},
        "baselines": {model: {max_length: value}}}, ...] (a single dict is one curve; "baselines" is
        optional): the card's plot, one panel per task, the other models dashed

    Other models' scores on the same data (the untouched base above all) go under the key
    "baselines": [{"model", "dataset", "metric", "value", "max_length"}, ...]; the card shows them
    beside this checkpoint's own, so a reader sees whether fine-tuning helped.

    The file records the fingerprint of the weights the results are of; a card is not written from
    results of other weights.
    """
    path = Path(checkpoint) / RESULTS_FILE
    data = load_json(path)
    if results is not None:
        data["results"] = results
    if extrapolation is not None:
        data["extrapolation"] = extrapolation
    if baselines is not None:
        data["baselines"] = baselines
    if any(Path(checkpoint).glob("*.safetensors")):  # the weights these results are of (the card checks it)
        data[WEIGHTS_KEY] = weights_fingerprint(checkpoint)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "dataset"


def dataset_types(rows: list[dict]) -> dict[str, str]:
    """A model-index dataset type for each dataset name of `rows`, distinct per name.

    huggingface_hub files results under (task, dataset type, config, split): results of two
    datasets that share a type would be merged under the first one's name. A type given for
    one dataset only is kept; a type shared by several gets the dataset's name appended."""
    names_by_type: dict[str, list[str]] = {}
    for row in rows:
        names = names_by_type.setdefault(str(row["dataset_type"]), [])
        if row["dataset"] not in names:
            names.append(row["dataset"])
    types, taken = {}, set()
    for given, names in names_by_type.items():
        for name in names:
            kind = given if len(names) == 1 else f"{given}-{_slug(name)}"
            while kind in taken:  # two names with one slug
                kind += "-x"
            taken.add(kind)
            types.setdefault(name, kind)
    return types


def eval_results_of(rows: list[dict]) -> list[EvalResult]:
    """The model-index entries of recorded results: one dataset entry per dataset (split), each
    metric with its max length (`args.max_length`, and in its name)."""
    types = dataset_types(rows)
    results = []
    for row in rows:
        max_length = row.get("max_length")
        results.append(EvalResult(
            task_type="retrieval", task_name="Retrieval", dataset_type=types[row["dataset"]], dataset_name=row["dataset"],
            dataset_split=row.get("split", "test"), metric_type=row["metric"], metric_value=round(float(row["value"]), 4),
            metric_name=f"{row['metric']} (max length {max_length})" if max_length is not None else None,
            metric_args={"max_length": int(max_length)} if max_length is not None else None,
        ))
    return results


def _triples(results) -> list[tuple]:
    """(dataset name, metric, value, max length) of EvalResults, sorted (for comparing with the file)."""
    return sorted(((r.dataset_name, r.metric_type, float(r.metric_value), (r.metric_args or {}).get("max_length"))
                   for r in results), key=repr)


def _snippets(family: str, model_id: str, backbone_type: str) -> dict[str, str]:
    if family == "lmk_embedder":
        automodel = f'''from transformers import AutoModel

model_id = "{model_id}"
model = AutoModel.from_pretrained(model_id, trust_remote_code=True)
documents = ["A long document about the json module. " * 40, "A short note about zip archives."]
document_embeddings = model.encode_document(documents)          # [2, D], L2-normalised
query_embeddings = model.encode_query(["How do I parse JSON?"])
print(query_embeddings @ document_embeddings.T)
chunks = model.encode(documents[0], output_value="landmarks")  # one vector per landmark, with its span
print(len(chunks["embeddings"]), chunks["spans"][:2])'''
    else:
        automodel = f'''from transformers import AutoModel

model_id = "{model_id}"
model = AutoModel.from_pretrained(model_id, trust_remote_code=True)
documents = ["A long document about the json module. " * 40, "A short note about zip archives."]
document_embeddings = model.encode_document(documents)          # no instruction on documents
query_embeddings = model.encode_query(["How do I parse JSON?"])  # "Instruct: {{task}}\\nQuery: ..."
print(query_embeddings @ document_embeddings.T)
pieces = iter(["A document streamed ", "piece by piece, ", "in constant memory."])
print(model.encode(pieces).shape)                               # same vector as the joined text'''
    sentence_transformers = f'''from sentence_transformers import SentenceTransformer

model_id = "{model_id}"
model = SentenceTransformer(model_id, trust_remote_code=True)
query_embeddings = model.encode_query(["How do I parse JSON?"])
document_embeddings = model.encode_document(["The json module encodes and decodes JSON.", "Zip archives."])
print(model.similarity(query_embeddings, document_embeddings))'''
    peft = f'''from peft import LoraConfig
from sentence_transformers import SentenceTransformer

model_id = "{model_id}"
model = SentenceTransformer(model_id, trust_remote_code=True)
model.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules={lora_target_modules(backbone_type)!r}))
trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
print(f"{{trainable}} trainable parameters")  # then train with SentenceTransformerTrainer'''
    return {"automodel": automodel, "sentence_transformers": sentence_transformers, "peft": peft,
            "serve_command": serve_command(model_id), "serve_client": serve_client(model_id)}


def serve_command(model_id: str) -> str:
    """The shell lines that serve a checkpoint and query it (README and cards)."""
    return (f'lmk-embed serve {model_id}  # the model is then named {model_id!r}; --port 8000 by default\n'
            f'curl -s http://127.0.0.1:8000/v1/embeddings -H "content-type: application/json" '
            f'-d \'{{"model": "{model_id}", "input": ["How do I parse JSON?"]}}\'')


def serve_client(model_id: str) -> str:
    """The `openai` client against `lmk-embed serve` (README and cards)."""
    return f'''from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
response = client.embeddings.create(model="{model_id}", input=["How do I parse JSON?"],
                                    extra_body={{"input_type": "query"}})  # the checkpoint's query prompt
print(len(response.data[0].embedding))'''


ONNX_DESCRIPTIONS = {
    FP32_FILE: "fp32, the same vectors as the torch weights (within 1e-4)",
    QUANTIZED_FILES["int8"]: "int8 dynamic quantisation of the linear layers: faster on CPU, slightly different vectors",
}


def onnx_graphs(folder: Path, family: str) -> list[tuple[str, str]]:
    """(file, description) of the exported graphs an LMK checkpoint folder holds."""
    if family != "lmk_embedder":
        return []
    return [(name, ONNX_DESCRIPTIONS[name]) for name in ONNX_FILES if (folder / name).is_file()]


def _onnx_snippet(model_id: str, graphs: list[tuple[str, str]]) -> str:
    names = [name for name, _ in graphs]
    lines = [
        "# pip install onnxruntime: the exported graph on ONNX Runtime (CPU); no torch weights are loaded",
        "from transformers import AutoModel",
        "from sentence_transformers import SentenceTransformer",
        "",
        f'model_id = "{model_id}"',
    ]
    if FP32_FILE in names:
        lines += ['model = AutoModel.from_pretrained(model_id, trust_remote_code=True, backend="onnx")',
                  'print(model.encode_document(["A long document about the json module. " * 40]).shape)']
    for name in names:
        if name != FP32_FILE:
            lines += [f'quantized = AutoModel.from_pretrained(model_id, trust_remote_code=True, backend="onnx", '
                      f'file_name="{name}")']
    lines += [f'st = SentenceTransformer(model_id, trust_remote_code=True, backend="onnx", '
              f'model_kwargs={{"file_name": "{names[0]}"}})',
              'print(st.encode_query(["How do I parse JSON?"]).shape)']
    return "\n".join(lines)


def card_max_length(folder: Path, config: dict) -> str:
    """The card's "Max length": `max_length` as `encode()` resolves it with no options. LMK asks the
    checkpoint's own model (`resolve()`): read in one pass, the smallest of `config.max_length`, the
    tokenizer's limit and the position table's (less a padding offset, RoBERTa-style); read in windows
    (`long_input="windows"`), `config.max_length`, else the whole text. Recurrent: `config.max_length`."""
    if config.get("model_type") != "lmk_embedder":
        return str(max_length_default(config.get("max_length")) or "unbounded (vertical schedule)")
    from lmk_embed import LMKModel
    from lmk_embed_tools import quiet_model_loading

    with quiet_model_loading():  # the card reads a setting: no progress bar before the command's line
        request = LMKModel.from_pretrained(folder).resolve()
    if request.long_input == "windows":
        read = f"read in windows of {request.window_length} tokens"
        return f"{request.max_length} ({read})" if request.max_length is not None else f"the whole text ({read})"
    return str(request.max_length)


def _details(folder: Path, config: dict) -> tuple[str, str, list[tuple[str, str]]]:
    backbone = config["backbone_config"]
    family = config["model_type"]
    dim = backbone.get("hidden_size")
    if family == "lmk_embedder":
        pooling = config.get("pooling", "lmk")
        title_kind = "LMK (landmark)" if pooling == "lmk" else pooling
        summary = (
            f"A text embedding model with **{title_kind} pooling** over a `{backbone['model_type']}` encoder. "
            "A landmark token closes every chunk of *g* tokens and the embedding is the mean of the landmark "
            "states (arXiv 2601.21525)." if pooling == "lmk" else
            f"A text embedding model with **{pooling} pooling** over a `{backbone['model_type']}` encoder "
            "(a baseline of the LMK paper, arXiv 2601.21525)."
        )
        granularities = ", ".join(str(g) for g in config.get("granularities", []))
        details = [
            ("Family", "LMK encoder (`LMKModel`)"),
            ("Backbone", f"`{backbone['model_type']}`, {backbone.get('num_hidden_layers')} layers"),
            ("Pooling", f"`{pooling}`"),
            ("Splitter", f"`{config.get('splitter')}`"),
            ("Granularity (inference)", str(config.get("granularity"))),
            ("Granularity set (variable splitter)", granularities),
            ("Max length", card_max_length(folder, config)),
            ("Dimension", str(dim)),
            ("Normalised", str(config.get("normalize", True))),
        ]
    else:
        summary = (
            f"A text embedding model built on a `{backbone['model_type']}` recurrent language model: EOS is appended "
            "to every input and the final-layer state at EOS is the embedding (arXiv 2604.18199). Long inputs run "
            "in constant memory with the vertical schedule."
        )
        if config.get("distilled_from"):
            summary += (
                f" Unlike the paper's models (pretrained Mamba2 LMs fine-tuned contrastively), this one is a **student "
                f"distilled from `{config['distilled_from']}`**: a Mamba2 with no language-model pretraining, trained on "
                "the teacher's tokenizer to reproduce the teacher's vectors (and InfoNCE on query-page pairs)."
            )
        details = [
            ("Family", "recurrent (`RecurrentEmbedModel`)"),
            ("Backbone", f"`{backbone['model_type']}`, {backbone.get('num_hidden_layers')} layers"),
            ("Pooling", "final-layer state at EOS"),
            *([("Distilled from", f"`{config['distilled_from']}`")] if config.get("distilled_from") else []),
            ("Schedule", f"`{config.get('schedule')}` (block size V = {config.get('block_size')})"),
            ("Query instruction", f"`{config.get('query_template', '').strip()}` (default task: {config.get('default_task')})"),
            ("Max length", card_max_length(folder, config)),
            ("Dimension", str(dim)),
            ("Normalised", str(config.get("normalize", True))),
        ]
    return family, summary, details


def _training_rows(run: dict) -> list[tuple[str, str]]:
    if not run:
        return []
    data = run.get("train_data")
    data_text = "Python standard-library documentation (synopsis -> page; siblings as hard negatives)" if data == "stdlib" else f"`{Path(str(data)).name}`"
    adapter = run.get("finetune")
    if adapter in ("lora", "qlora"):
        adapter += f" (r={run.get('lora_r')}, alpha={run.get('lora_alpha')}, targets={run.get('lora_target_modules') or 'default'})"
    rows = [
        ("Data", data_text),
        ("Objective", f"InfoNCE, temperature {run.get('temperature')}" + (" with GradCache" if run.get("loss") == "gradcache" else "")),
        ("Fine-tuning", adapter),
        ("Steps", str(run.get("max_steps")) if run.get("max_steps", -1) > 0 else f"{run.get('num_train_epochs')} epochs"),
        ("Batch size", str(run.get("per_device_train_batch_size"))),
        ("Learning rate", str(run.get("learning_rate") or "family default")),
        ("Hard negatives per query", str(run.get("num_negatives") if run.get("num_negatives") is not None else "all given")),
        ("Max length (query / passage)", f"{run.get('query_max_length')} / {run.get('passage_max_length')}"),
        ("Seed", str(run.get("seed"))),
    ]
    if run.get("splitter"):
        rows.append(("Splitter while training", f"`{run['splitter']}` over {run.get('granularities')}"))
    return rows


# matplotlib is not thread-safe (pyplot's state, and the mathtext parser that draws the log-axis
# ticks, are shared), and demo.py writes its cards from two threads at once: one plot at a time.
_PLOT_LOCK = threading.Lock()


def _metric_label(metric: str) -> str:
    """ndcg_at_10 -> nDCG@10 (mteb's metric names, as a reader writes them)."""
    return re.sub(r"^ndcg_at_(\d+)$", r"nDCG@\1", metric)


def _curves(extrapolation) -> list[dict]:
    """The recorded length curves with two points or more (a single dict is one curve)."""
    curves = extrapolation if isinstance(extrapolation, list) else [extrapolation] if extrapolation else []
    return [curve for curve in curves if len(curve.get("points") or {}) > 1]


def _plot(folder: Path, curves: list[dict]) -> str | None:
    """One panel per curve (from `_curves`), the other models dashed -> the PNG's file name, or None."""
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def line(ax, points, **style):
        lengths = sorted(int(k) for k in points)
        ax.plot(lengths, [points[str(n)] if str(n) in points else points[n] for n in lengths], marker="o", **style)

    with _PLOT_LOCK:
        fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.4), squeeze=False)
        for ax, curve in zip(axes[0], curves):
            line(ax, curve["points"], label="this model", linewidth=2)
            for name, points in (curve.get("baselines") or {}).items():
                line(ax, points, label=name, linestyle="--", alpha=0.8)
            ax.set_xlabel("max length (tokens)")
            ax.set_ylabel(_metric_label(curve.get("metric", "ndcg_at_10")))
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
            ax.set_title(curve.get("dataset", ""), fontsize=9)
            if curve.get("baselines"):
                ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / PLOT_FILE, dpi=110)
        plt.close(fig)
    return PLOT_FILE


def build_card(checkpoint: str | Path, model_id: str | None = None, license: str = "apache-2.0") -> ModelCard:
    """The card for a checkpoint folder (see the module docstring); nothing is written."""
    folder = Path(checkpoint)
    config = load_json(folder / "config.json")
    if config.get("model_type") not in CITATIONS:
        raise ValueError(f"{folder} is not one of our checkpoints (config.json model_type {config.get('model_type')!r}).")
    run = yaml.safe_load((folder / "run_config.yaml").read_text()) if (folder / "run_config.yaml").is_file() else {}
    results = load_json(folder / RESULTS_FILE)
    name = MODEL_ID_PLACEHOLDER if model_id is None else check_model_id(model_id)  # before the model loads
    family, summary, details = _details(folder, config)
    backbone_type = config["backbone_config"]["model_type"]
    weights = weights_fingerprint(folder) if any(folder.glob("*.safetensors")) else None
    if results.get(WEIGHTS_KEY) not in (None, weights):
        raise ValueError(f"{folder / RESULTS_FILE} holds results of other weights ({results[WEIGHTS_KEY]}) than the "
                         f"checkpoint's ({weights}): evaluate it again (`lmk-embed evaluate ... --record`) or delete the file.")
    graphs = onnx_graphs(folder, family)
    snippets = _snippets(family, name, backbone_type)
    if graphs:
        snippets["onnx"] = _onnx_snippet(name, graphs)
    eval_results = eval_results_of(results.get("results", [])) or None
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "custom_code", "long-context",
            "landmark-pooling" if family == "lmk_embedder" else backbone_type]
    if family == "recurrent_embedder":
        tags.append("recurrent")
    if graphs:
        tags.append("onnx")
    train_data = run.get("train_data")
    datasets = [train_data] if train_data and train_data != "stdlib" and "/" in str(train_data) and not Path(str(train_data)).exists() else None
    card_data = ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=tags,
        base_model=config.get("base_model"),
        datasets=datasets,
        language=["en"],
        license=license,
        model_name=name.split("/")[-1],
        eval_results=eval_results,
        **({WEIGHTS_KEY: weights} if weights else {}),
    )
    curves = _curves(results.get("extrapolation"))
    plot = _plot(folder, curves)
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        title=name.split("/")[-1],
        summary=summary,
        details=details,
        snippets=snippets,
        onnx_graphs=graphs,
        training=_training_rows(run),
        backbone_source=config.get("base_model") or f"a {backbone_type} checkpoint",
        evaluations=results.get("results", []),
        baselines=results.get("baselines", []),
        plot=plot,
        plot_caption=", ".join(str(curve.get("dataset", "")) for curve in curves) if plot else "",
        plot_metric=_metric_label(curves[0].get("metric", "ndcg_at_10")) if curves else "",
        limitations=LIMITATIONS[family] + [NOT_EVALUATED],
        citation=CITATIONS[family],
    )


def write_card(checkpoint: str | Path, model_id: str | None = None, license: str = "apache-2.0") -> Path:
    """Write README.md (and the extrapolation plot, when there is one) into the checkpoint folder."""
    card = build_card(checkpoint, model_id=model_id, license=license)
    path = Path(checkpoint) / "README.md"
    card.save(path)
    return path


def check_card(path: str | Path) -> ModelCard:
    """Parse a card back and validate its metadata the way huggingface_hub does offline (model-index,
    eval results); raises ValueError on any problem. The Hub's own YAML check needs the network."""
    card = ModelCard.load(path, ignore_metadata_errors=False)
    data = card.data
    problems = []
    if data.library_name != "sentence-transformers":
        problems.append(f"library_name is {data.library_name!r}")
    if data.pipeline_tag not in ("sentence-similarity", "feature-extraction"):
        problems.append(f"pipeline_tag is {data.pipeline_tag!r}")
    if not data.license:
        problems.append("license is missing")
    if not data.tags or "custom_code" not in data.tags:
        problems.append("tags must include custom_code")
    results_file = Path(path).parent / RESULTS_FILE
    recorded = load_json(results_file).get("results") or [] if results_file.is_file() else None
    if recorded is not None:  # the model-index must say exactly what the results file says
        expected = _triples(eval_results_of(recorded))
        found = _triples(data.eval_results or [])
        if found != expected:
            missing = [t for t in expected if t not in found]
            extra = [t for t in found if t not in expected]
            problems.append(f"model-index does not match {RESULTS_FILE} (missing {missing[:3]}, not in the file "
                            f"{extra[:3]}); rewrite the card with `lmk-embed card`")
        types = {r.dataset_name: r.dataset_type for r in data.eval_results or []}
        if len(set(types.values())) != len(types):
            problems.append("two datasets share a model-index dataset type, so the Hub files them as one")
    if problems:
        raise ValueError(f"{path}: invalid card metadata: " + "; ".join(problems))
    return card
