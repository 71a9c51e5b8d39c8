"""Publish a checkpoint to the Hugging Face Hub in three phases: stage -> validate -> upload.

    python push.py CHECKPOINT REPO_ID [--dry-run] [--private] [--revision BRANCH] [--tag TAG]
                   [--commit-message MSG] [--stage-dir DIR] [--max-file-mb 50]
    lmk-embed push ...   (the same)

1. stage: copy an allow-list of files into a clean staging folder: safetensors weights, config and
   tokenizer files, the sentence-transformers files, the card, its plots and the run/results files.
   The shipped .py files are the checkpoint family's (`lmk_embed.shipped_files(family)`) and come
   from `lmk_embed/`'s current source, so a checkpoint never ships stale code, nor another family's
   (an older checkpoint's copies of those are left out). Refused (non-zero exit, with the reason):
   pickled weights (.bin, .pt, .pkl, ...), non-weight files over --max-file-mb, `.env` files,
   weights with a NaN or inf in any tensor (every tensor is read, one at a time), and anything that
   looks like a Hub token (`hf_` + 30 characters) or a private key, in any file: PNG text chunks
   (tEXt, and zTXt / iTXt decompressed) and safetensors metadata and tensor names included. An LMK
   checkpoint's ONNX graphs (`onnx/model.onnx`, `onnx/model_qint8.onnx`, written by `lmk-embed
   export-onnx`) are staged too, as weights: every byte is scanned for secrets, every float initializer
   for NaN and inf, and a graph not written by export-onnx, or exported from other weights than the
   checkpoint's safetensors, is refused. Files outside the allow-list are listed and left out.
2. validate: check the card's metadata, that the staged .py files are exactly the family's shipped
   files (the same names, the same bytes) and that every code file config.json /
   tokenizer_config.json `auto_map` and modules.json name is staged. Then load the staged folder as
   a user would, in a clean process: an empty working directory, no project import possible (this
   repository off sys.path, `lmk_embed` and `lmk_embed_tools` unimportable), a temporary
   HF_MODULES_CACHE, offline; with AutoModel and SentenceTransformer, by path and by REPO_ID from a
   Hub-cache layout, each class coming from the staged files (`transformers_modules.*`). Embed a
   fixed probe set and compare with the source checkpoint's vectors, computed in this process with
   the current classes (max abs diff <= 1e-5). Staged ONNX graphs are loaded the same way with
   `backend="onnx"`: fp32 within 1e-4 of those vectors, int8 with a cosine of at least 0.9 to each,
   and the card must name every staged graph. Any failure stops the push; the message's first line
   names what failed.
3. upload: `HfApi.create_repo(exist_ok=True)`, then `upload_folder` (optionally to a branch) with
   `delete_patterns=["*"]`, so the remote mirrors the staged folder and no file of an earlier push
   survives, and `create_tag`. Unchanged files are not sent again (upload_folder skips them). The
   token comes from huggingface_hub's own sources (HF_TOKEN, `hf auth login`), never from a flag.
   `--dry-run` stops after validate and prints what would be uploaded, with sizes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from lmk_embed import AUTO_MAPS, shipped_files
from lmk_embed.onnx_backend import GRAPH_FORMAT, ONNX_FILES, QUANTIZED_FILES
from lmk_embed.onnx_backend import weights_fingerprint

WEIGHT_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
ALLOWED_NAMES = {
    "config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "modules.json", "config_sentence_transformers.json", "embedder_module_config.json",
    "1_Normalize/config.json", "README.md", "run_config.yaml", "eval_results.json", "generation_config.json",
}
ALLOWED_SUFFIXES = WEIGHT_SUFFIXES + (".png",)
# Exported graphs: weights (no size limit), staged for LMK checkpoints only, under these names only.
GRAPH_SUFFIXES = (".onnx",)
ONNX_TOLERANCE = 1e-4  # fp32 graph against the torch vectors
INT8_MIN_COSINE = 0.9  # int8 graph: cosine to the torch vector of every probe text
TOKEN_PATTERN = re.compile(rb"hf_[A-Za-z0-9]{30,}")
PRIVATE_KEY_PATTERN = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")
PROBE_TEXTS = [
    "How do I parse a JSON document in Python?",
    "The json module exposes an API familiar to users of the marshal and pickle modules. " * 30,
    "Zip archives: read and write ZIP files.",
    "",
]


class PushError(Exception):
    """A reason to stop the push; the command exits non-zero with it."""


@dataclass
class StageReport:
    folder: Path
    files: dict[str, int] = field(default_factory=dict)  # relative path -> bytes
    refreshed_code: list[str] = field(default_factory=list)  # shipped .py files replaced by current source
    left_out: list[str] = field(default_factory=list)


# ---- 1. stage ---------------------------------------------------------------------------------


def family_of(folder: Path) -> str:
    """The family (`model_type`) recorded in a checkpoint's config.json."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise PushError(f"{folder} has no config.json; is it a checkpoint folder?")
    model_type = json.loads(config_path.read_text()).get("model_type")
    if model_type not in AUTO_MAPS:
        raise PushError(f"{folder}: model_type {model_type!r} is not one of our families {sorted(AUTO_MAPS)}.")
    return model_type


def secrets_in(texts) -> list[str]:
    """What in `texts` (bytes) looks like a secret, one reason per kind."""
    problems = []
    if any(TOKEN_PATTERN.search(text) for text in texts):
        problems.append("contains what looks like a Hugging Face token (hf_...)")
    if any(PRIVATE_KEY_PATTERN.search(text) for text in texts):
        problems.append("contains a private key")
    return problems


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _inflate(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj()
    text = inflater.decompress(data, limit)
    if inflater.unconsumed_tail:  # refuse what cannot be scanned whole rather than pass it unscanned
        raise ValueError(f"a compressed PNG text chunk inflates to more than {limit} bytes")
    return text


def png_texts(path: Path, limit: int) -> list[bytes]:
    """The text of every tEXt, zTXt and iTXt chunk of a PNG, decompressed (keyword and text).

    A compressed chunk hides its text from a scan of the raw bytes. Raises ValueError when the file
    is not a well-formed PNG or a chunk cannot be decompressed, so nothing passes unscanned."""
    data = path.read_bytes()
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG file (bad signature)")
    texts, offset = [], len(PNG_SIGNATURE)
    try:
        while offset < len(data):
            (length,) = struct.unpack(">I", data[offset:offset + 4])
            kind, body = data[offset + 4:offset + 8], data[offset + 8:offset + 8 + length]
            if len(body) != length:
                raise ValueError(f"truncated {kind!r} chunk")
            offset += 12 + length  # length, type, data, CRC
            if kind == b"tEXt":
                texts.append(body)
            elif kind == b"zTXt":  # keyword \0 method compressed-text
                keyword, _, rest = body.partition(b"\0")
                texts += [keyword, _inflate(rest[1:], limit)]
            elif kind == b"iTXt":  # keyword \0 flag method language \0 translated \0 text
                keyword, _, rest = body.partition(b"\0")
                flag, language_and_rest = rest[:1], rest[2:]
                language, _, rest = language_and_rest.partition(b"\0")
                translated, _, text = rest.partition(b"\0")
                texts += [keyword, language, translated, _inflate(text, limit) if flag == b"\1" else text]
            elif kind == b"IEND":
                break
    except (struct.error, zlib.error) as error:
        raise ValueError(f"cannot read its PNG chunks to scan them ({error})") from error
    return texts


def scan_safetensors(path: Path) -> list[str]:
    """Problems with one safetensors file: a tensor holding a NaN or inf, or a secret in its header.

    Reads one tensor at a time, so memory stays at the largest tensor whatever the file's size. Probe
    texts would miss a NaN in one embedding row; the first user whose text holds that token would not."""
    problems = []
    try:
        with safe_open(str(path), framework="pt") as weights:
            metadata = weights.metadata() or {}
            header = [text.encode() for item in metadata.items() for text in item] + [k.encode() for k in weights.keys()]
            problems += [f"metadata or tensor names {problem}" for problem in secrets_in(header)]
            for key in weights.keys():
                tensor = weights.get_tensor(key)
                if tensor.is_floating_point() or tensor.is_complex():
                    bad = int((~torch.isfinite(tensor)).sum())
                    if bad:
                        problems.append(f"tensor {key!r} has {bad} non-finite value(s) (NaN or inf)")
    except SafetensorError as error:
        problems.append(f"is not a readable safetensors file ({error})")
    return problems


def scan_onnx(path: Path, weights: str) -> list[str]:
    """Problems with one exported graph: a secret anywhere in its bytes (node and tensor names, metadata
    and doc strings are plain protobuf strings), a float initializer holding a NaN or inf, a graph that
    `lmk-embed export-onnx` did not write, or one exported from other weights than `weights` (the
    checkpoint's `weights_fingerprint`)."""
    import numpy as np

    problems = list(secrets_in([path.read_bytes()]))
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        return problems + ["cannot be checked without the onnx package: pip install 'lmk-embed[onnx]'"]
    try:
        graph = onnx.load(str(path))
    except Exception as error:  # noqa: BLE001 - any parse failure means it cannot be scanned
        return problems + [f"is not a readable ONNX file ({type(error).__name__}: {error})"]
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    for tensor in graph.graph.initializer:
        if tensor.data_type in floats:
            bad = int((~np.isfinite(numpy_helper.to_array(tensor))).sum())
            if bad:
                problems.append(f"initializer {tensor.name!r} has {bad} non-finite value(s) (NaN or inf)")
    metadata = {prop.key: prop.value for prop in graph.metadata_props}
    if metadata.get("lmk_embed_format") != GRAPH_FORMAT:
        problems.append(f"was not written by `lmk-embed export-onnx` (format {metadata.get('lmk_embed_format')!r})")
    elif metadata.get("lmk_weights_sha256") != weights:
        problems.append(f"was exported from other weights ({metadata.get('lmk_weights_sha256')}) than this checkpoint's "
                        f"({weights}): export it again (`lmk-embed export-onnx CHECKPOINT`)")
    return problems


def _relative_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def stage(checkpoint: str | Path, stage_dir: str | Path, max_file_mb: float = 50.0) -> StageReport:
    """Copy the allow-listed files of `checkpoint` into a fresh `stage_dir` (see the module docstring)."""
    source = Path(checkpoint)
    if not source.is_dir():
        raise PushError(f"{source} is not a checkpoint folder.")
    if (source / "adapter_config.json").exists():
        raise PushError(f"{source} holds a LoRA adapter, not a full checkpoint: merge it (save_mode='merged') first.")
    family = family_of(source)
    code = shipped_files(family)
    files = _relative_files(source)
    graphs = [name for name in ONNX_FILES if name in files] if family == "lmk_embedder" else []
    weights = weights_fingerprint(source) if graphs else None
    refusals = []
    for name in files:
        path = source / name
        lower = name.lower()
        if lower.endswith(PICKLE_SUFFIXES):
            refusals.append(f"{name}: pickled weights are not published (use safetensors)")
        elif Path(lower).name == ".env" or Path(lower).name.startswith(".env."):
            refusals.append(f"{name}: environment files are never published")
        elif not lower.endswith(WEIGHT_SUFFIXES + GRAPH_SUFFIXES) and path.stat().st_size > max_file_mb * 2**20:
            refusals.append(f"{name}: {path.stat().st_size / 2**20:.2f} MB is over --max-file-mb={max_file_mb:g} and is not weights")
        elif lower.endswith(WEIGHT_SUFFIXES):
            refusals.extend(f"{name}: {problem}" for problem in scan_safetensors(path))
        elif lower.endswith(GRAPH_SUFFIXES):
            if name in graphs:  # other graphs are left out below, unread
                refusals.extend(f"{name}: {problem}" for problem in scan_onnx(path, weights))
        else:
            texts = [path.read_bytes()]
            if lower.endswith(".png"):
                try:
                    texts.extend(png_texts(path, limit=int(max_file_mb * 2**20)))
                except ValueError as error:
                    refusals.append(f"{name}: {error}")
            refusals.extend(f"{name}: {problem}" for problem in secrets_in(texts))
    for path in code:  # staged from the current source, so scanned there
        refusals.extend(f"{path.name} (current source): {problem}" for problem in secrets_in([path.read_bytes()]))
    if refusals:
        raise PushError("refusing to stage " + str(source) + ":\n  " + "\n  ".join(refusals))
    if not (source / "model.safetensors").exists() and not (source / "model.safetensors.index.json").exists():
        raise PushError(f"{source} has no model.safetensors.")

    target = Path(stage_dir)
    inside = {source.resolve(), *source.resolve().parents}
    if target.resolve() in inside or source.resolve() in target.resolve().parents:
        # the staging folder is emptied first: it must not hold, or be held by, the checkpoint
        raise PushError(f"--stage-dir {target} overlaps the checkpoint {source}; stage somewhere else.")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    report = StageReport(folder=target)
    shipped = {path.name for path in code}
    for name in files:  # other .py files, another family's shipped code included, are left out
        if name in shipped:
            continue
        if name in ALLOWED_NAMES or name.endswith(ALLOWED_SUFFIXES) or name in graphs:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target / name)
        else:
            report.left_out.append(name)
    for path in code:  # the current source, never what an older checkpoint carried
        shutil.copyfile(path, target / path.name)
    for name in shipped:
        old = source / name
        if not old.exists() or old.read_bytes() != (target / name).read_bytes():
            report.refreshed_code.append(name)
    report.files = {name: (target / name).stat().st_size for name in _relative_files(target)}
    return report


# ---- 2. validate --------------------------------------------------------------------------------

# The project's own packages: a user's process has neither, so the clean load must not reach them.
PROJECT_PACKAGES = ("lmk_embed", "lmk_embed_tools")

# Runs in a clean process: an empty working directory, this repository off PYTHONPATH and sys.path,
# the project's packages made unimportable (they are installed here, not where users load it), fresh
# HF_MODULES_CACHE and HF_HUB_CACHE, offline. Everything the checkpoint's code needs must then come
# from its own files or the declared dependencies. It imports nothing of this project, and checks
# that the classes came from transformers' remote-code loader (`transformers_modules.*`).
CLEAN_LOAD_SCRIPT = r"""
import json, os, sys, traceback

spec = json.loads(open(sys.argv[1]).read())
blocked = tuple(spec["blocked"])


class NotInstalledForUsers:  # a meta path finder: the project's packages do not exist for a user
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (the checkpoint's code may import only its own "
                                      "files and the declared dependencies)", name=name)
        return None


sys.meta_path.insert(0, NotInstalledForUsers())
for root in spec["hidden_paths"]:
    sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or ".") != os.path.realpath(root)]

import numpy as np

done = {}


def fail(step, error):
    with open(os.path.join(spec["out"], "result.json"), "w") as handle:
        json.dump({"ok": False, "step": step, "error": f"{type(error).__name__}: {' '.join(str(error).split())}",
                   "traceback": traceback.format_exc()[-4000:]}, handle)
    sys.exit(1)


def from_checkpoint_files(obj):
    module = type(obj).__module__
    if not module.startswith("transformers_modules"):
        raise RuntimeError(f"{type(obj).__name__} came from {module!r}, not from the checkpoint's own files")


for key, how, name, options in spec["loads"]:
    given = "".join(f", {option}={value!r}" for option, value in options.items())
    step = (f"AutoModel.from_pretrained({name!r}, trust_remote_code=True{given}).encode(...)" if how == "automodel" else
            f"SentenceTransformer({name!r}, trust_remote_code=True{given}).encode(...)")
    try:
        if how == "automodel":
            from transformers import AutoModel

            model = AutoModel.from_pretrained(name, trust_remote_code=True, **options)
            from_checkpoint_files(model)
        else:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(name, trust_remote_code=True, device="cpu", **options)
            from_checkpoint_files(model[0])
            if getattr(model[0], "model", None) is not None:
                from_checkpoint_files(model[0].model)
        vectors = np.asarray(model.encode(spec["texts"]), dtype=np.float64)
        del model
    except BaseException as error:  # noqa: BLE001 - every failure is reported, named by its step
        fail(step, error)
    np.save(os.path.join(spec["out"], key + ".npy"), vectors)
    done[key] = step
leaked = sorted(name for name in sys.modules if name.split(".")[0] in blocked)
if leaked:
    fail("the clean process", RuntimeError(f"imported the project's own modules {leaked}"))
with open(os.path.join(spec["out"], "result.json"), "w") as handle:
    json.dump({"ok": True, "loads": done}, handle)
"""

# The source's vectors are computed here, in this process, one checkpoint at a time (demo.py validates
# from threads; loading is not guaranteed thread-safe).
_REFERENCE_LOCK = threading.Lock()


def reference_vectors(checkpoint: Path, family: str):
    """The current classes on the source checkpoint's own weights, config and tokenizer files
    (whatever code the source carries, possibly stale, is not used)."""
    import numpy as np

    from lmk_embed import LMKModel, LMKTokenizer, RecurrentEmbedModel, RecurrentEmbedTokenizer

    model_class, tokenizer_class = ((LMKModel, LMKTokenizer) if family == "lmk_embedder" else
                                    (RecurrentEmbedModel, RecurrentEmbedTokenizer))
    with _REFERENCE_LOCK:
        model = model_class.from_pretrained(checkpoint).eval()
        model.tokenizer = tokenizer_class.from_pretrained(checkpoint)
        vectors = np.asarray(model.encode(PROBE_TEXTS), dtype=np.float64)
        del model
    return vectors


def _named_modules(folder: Path) -> list[tuple[str, str]]:
    """(where, module file) for every code file the staged metadata names: config.json's and
    tokenizer_config.json's `auto_map`, and modules.json's custom module types."""
    named = []
    for name in ("config.json", "tokenizer_config.json"):
        path = folder / name
        auto_map = json.loads(path.read_text()).get("auto_map", {}) if path.is_file() else {}
        for auto_class, value in auto_map.items():
            for reference in value if isinstance(value, list) else [value]:
                if reference and "--" not in reference:  # "repo--module.Class" is code of another repo: loaded, not checked
                    named.append((f"{name} auto_map.{auto_class} = {reference!r}", reference.rsplit(".", 1)[0] + ".py"))
    path = folder / "modules.json"
    for module in json.loads(path.read_text()) if path.is_file() else []:
        kind = module.get("type", "")
        if kind.count(".") == 1:  # "file.Class": a class in a .py file of the folder; longer paths are packages
            named.append((f"modules.json type {kind!r}", kind.split(".")[0] + ".py"))
    return named


def check_staged_code(staged: str | Path) -> None:
    """The staged .py files are exactly the family's shipped files (the same names and bytes), and every
    code file the metadata names is staged."""
    staged = Path(staged)
    family = family_of(staged)
    problems = []
    code = shipped_files(family)
    for path in code:
        copy = staged / path.name
        if not copy.is_file():
            problems.append(f"{path.name} is missing")
        elif copy.read_bytes() != path.read_bytes():
            problems.append(f"{path.name} differs from the shipped {path}")
    expected = {path.name for path in code}
    for name in _relative_files(staged):
        if name.endswith(".py") and name not in expected:
            problems.append(f"{name} is not one of the {family} files {sorted(expected)}")
    for where, filename in _named_modules(staged):
        if not (staged / filename).is_file():
            problems.append(f"{where} needs {filename}, which the staged folder does not have")
    if problems:
        raise PushError("validation failed: the staged code is wrong: " + "; ".join(problems))


def _environment(hidden: Path, **values) -> dict:
    """This environment, offline, with `hidden` (the repository) left out of PYTHONPATH."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    kept = [entry for entry in env.pop("PYTHONPATH", "").split(os.pathsep)
            if entry and os.path.realpath(entry) != os.path.realpath(hidden)]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    env.update(values)
    return env


def check_card_matches(staged: Path, repo_id: str | None) -> None:
    """The card describes what is staged: the weights it was written for (its `weights_sha256`),
    results that the staged eval_results.json still holds, and, given `repo_id`, that repository
    (its snippets load `repo_id`, not another id or the placeholder)."""
    from huggingface_hub import ModelCard

    from lmk_embed_tools.model_cards.generator import MODEL_ID_PLACEHOLDER, RESULTS_FILE, WEIGHTS_KEY

    rewrite = "rewrite it with `lmk-embed card CHECKPOINT --model-id ORG/NAME`"
    card = ModelCard.load(staged / "README.md")
    recorded = card.data.to_dict().get(WEIGHTS_KEY)
    if recorded != weights_fingerprint(staged):
        raise PushError(f"validation failed: the card was written for other weights ({recorded or 'none recorded'}) "
                        f"than the staged model.safetensors: {rewrite}.")
    if card.data.eval_results and not (staged / RESULTS_FILE).is_file():
        raise PushError(f"validation failed: the card reports results but the checkpoint has no {RESULTS_FILE} "
                        f"to back them: {rewrite} (or record the results again with `lmk-embed evaluate --record`).")
    if repo_id is not None:
        named = sorted(set(re.findall(r'model_id = "([^"]*)"', card.text)))
        if named != [repo_id]:
            hint = " (the placeholder: the card was written without --model-id)" if MODEL_ID_PLACEHOLDER in named else ""
            raise PushError(f"validation failed: the card's snippets load {named}{hint}, not {repo_id!r}: {rewrite}.")


def validate(staged: str | Path, checkpoint: str | Path, tolerance: float = 1e-5,
             repo_id: str | None = None) -> dict[str, float]:
    """Load the staged folder as a user would and compare its vectors with the source checkpoint's.

    The user's side runs in a clean process (see `CLEAN_LOAD_SCRIPT`): AutoModel and
    SentenceTransformer, by path and by `repo_id` from a Hub-cache layout of the staged folder.
    The source's vectors are computed in this process (another one than the user's), with the
    current classes on the source's files. The card must match what is staged
    (`check_card_matches`; its snippets must name `repo_id` when given). Returns the max abs
    difference of each load; any failure raises PushError, its first line naming what failed."""
    from lmk_embed_tools.model_cards import check_card

    staged, checkpoint = Path(staged).resolve(), Path(checkpoint).resolve()
    if not (staged / "README.md").is_file():
        raise PushError(f"{staged} has no README.md model card (write one with `lmk-embed card`).")
    try:
        check_card(staged / "README.md")
    except ValueError as error:
        raise PushError(f"validation failed: the card is invalid: {' '.join(str(error).split())}") from None
    check_staged_code(staged)
    check_card_matches(staged, repo_id)
    card = (staged / "README.md").read_text(encoding="utf-8")
    unnamed = [name for name in ONNX_FILES if (staged / name).is_file() and name not in card]
    if unnamed:
        raise PushError(f"validation failed: the card does not name the staged ONNX graphs {unnamed}: rewrite it with "
                        "`lmk-embed card CHECKPOINT` (it lists the graphs and how to load them).")
    family = family_of(staged)
    repo_id = repo_id or "validation/staged-checkpoint"  # the id the clean process loads the Hub-cache copy by
    repo_root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="lmk-embed-validate-") as scratch:
        scratch = Path(scratch)
        for name in ("user", "out"):
            (scratch / name).mkdir()
        install_in_hub_cache(staged, repo_id, scratch / "hub", revision="0" * 40, link=True)
        loads = [["automodel_path", "automodel", str(staged), {}],
                 ["sentence_transformers_path", "sentence_transformers", str(staged), {}],
                 ["automodel_id", "automodel", repo_id, {}], ["sentence_transformers_id", "sentence_transformers", repo_id, {}]]
        loads += _graph_loads(staged, repo_id)
        spec = {"blocked": list(PROJECT_PACKAGES), "hidden_paths": [str(repo_root)], "texts": PROBE_TEXTS,
                "loads": loads, "out": str(scratch / "out")}
        (scratch / "spec.json").write_text(json.dumps(spec))
        clean_env = _environment(repo_root, HF_MODULES_CACHE=str(scratch / "modules"), HF_HUB_CACHE=str(scratch / "hub"))
        log = scratch / "clean-process.log"  # a file, not a pipe: nothing blocks while this process works
        with open(log, "w") as output:
            clean = subprocess.Popen([sys.executable, "-c", CLEAN_LOAD_SCRIPT, str(scratch / "spec.json")],
                                     cwd=scratch / "user", env=clean_env, stdout=output, stderr=subprocess.STDOUT)
            try:  # while the clean process starts (mostly imports)
                expected = reference_vectors(checkpoint, family)
            except Exception as error:
                clean.kill()
                clean.wait()
                raise PushError(f"validation failed: the source checkpoint {checkpoint} does not encode with the current "
                                f"code: {type(error).__name__}: {' '.join(str(error).split())}") from error
            clean.wait()
        clean_err = log.read_text(errors="replace")
        result_path = scratch / "out" / "result.json"
        result = json.loads(result_path.read_text()) if result_path.is_file() else None
        if clean.returncode != 0 or not (result or {}).get("ok"):
            if result:
                raise PushError(f"validation failed: {result['step']} in a clean process raised {result['error']}\n"
                                f"{result['traceback']}")
            raise PushError(f"validation failed: the clean loading process exited with {clean.returncode}\n{clean_err[-4000:]}")
        import numpy as np

        vectors = {key: np.load(scratch / "out" / f"{key}.npy") for key, _, _, _ in loads}
    diffs = {key: float(np.abs(found - expected).max()) for key, found in vectors.items()}
    limits = {key: ONNX_TOLERANCE if "_onnx" in key else tolerance for key in diffs if "_int8_" not in key}
    bad = {key: diffs[key] for key, limit in limits.items() if not diffs[key] <= limit}
    if bad:
        raise PushError(f"validation failed: staged embeddings differ from the source by {bad} (> {tolerance} for "
                        f"torch, > {ONNX_TOLERANCE} for the fp32 ONNX graph).")
    unit = expected / np.maximum(np.linalg.norm(expected, axis=-1, keepdims=True), 1e-12)
    for key in (key for key in vectors if "_int8_" in key):
        found = vectors[key] / np.maximum(np.linalg.norm(vectors[key], axis=-1, keepdims=True), 1e-12)
        lowest = float((found * unit).sum(-1).min())
        if not lowest >= INT8_MIN_COSINE:
            raise PushError(f"validation failed: {key}: the int8 graph's lowest cosine to the source's vectors is "
                            f"{lowest:.3f} (< {INT8_MIN_COSINE}).")
    return diffs


def _graph_loads(staged: Path, repo_id: str) -> list[list]:
    """The clean process's loads of the staged ONNX graphs: fp32 by path and by id with both classes,
    int8 with AutoModel by path and SentenceTransformer by id."""
    loads = []
    for kind, name in (("onnx", ONNX_FILES[0]), *((f"onnx_{q}", f) for q, f in QUANTIZED_FILES.items())):
        if not (staged / name).is_file():
            continue
        auto = {"backend": "onnx", "file_name": name}
        sentence = {"backend": "onnx", "model_kwargs": {"file_name": name}}
        loads += [[f"automodel_{kind}_path", "automodel", str(staged), auto],
                  [f"sentence_transformers_{kind}_id", "sentence_transformers", repo_id, sentence]]
        if kind == "onnx":
            loads += [[f"automodel_{kind}_id", "automodel", repo_id, auto],
                      [f"sentence_transformers_{kind}_path", "sentence_transformers", str(staged), sentence]]
    return loads


# ---- 3. upload ----------------------------------------------------------------------------------


def upload(staged: str | Path, repo_id: str, *, api=None, private: bool = False, revision: str | None = None,
           tag: str | None = None, commit_message: str | None = None) -> dict:
    """Create the repo (exist_ok), make its revision mirror the staged folder, tag it."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()  # token from HF_TOKEN or the cached login; never from the command line
    staged = Path(staged)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    if revision:
        api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
    # The remote mirrors the staged folder: files of an earlier push that are not staged now (a single
    # model.safetensors beside new shards, a stale adapter) are deleted in the same commit.
    # upload_folder itself skips files whose content is already on the remote.
    commit = api.upload_folder(repo_id=repo_id, folder_path=str(staged), repo_type="model", revision=revision,
                               commit_message=commit_message or f"Upload {staged.name}", delete_patterns=["*"])
    outcome = {"repo_id": repo_id, "revision": revision or "main", "commit": getattr(commit, "oid", None), "tag": None}
    print(f"{repo_id}@{outcome['revision']}: commit {outcome['commit']}.")
    if tag:
        api.create_tag(repo_id, tag=tag, revision=revision, repo_type="model", exist_ok=True)
        outcome["tag"] = tag
        print(f"{repo_id}: tagged {tag}.")
    return outcome


# ---- a local Hub cache (offline loading by model id) ---------------------------------------------


def install_in_hub_cache(folder: str | Path, repo_id: str, cache_dir: str | Path, revision: str | None = None,
                         link: bool = False) -> str:
    """Lay `folder` out as a Hub cache entry so `repo_id` resolves offline (`HF_HUB_OFFLINE=1`).

    Writes `cache_dir/models--org--name/snapshots/<revision>/...` and `refs/main`; returns the revision.
    With `link`, the snapshot's files are symbolic links to `folder`'s (as the Hub cache links to its
    blobs), so nothing is copied; `folder` must then outlive the cache entry.
    """
    if repo_id.count("/") != 1:
        raise ValueError(f"`repo_id` must look like 'org/name', got {repo_id!r}.")
    folder = Path(folder)
    if revision is None:  # a stable 40-hex id derived from the files' bytes
        digest = hashlib.sha1()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(folder)).encode())
            digest.update(path.read_bytes())
        revision = digest.hexdigest()
    repo_dir = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / revision
    if snapshot.exists():
        shutil.rmtree(snapshot)
    if link:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            target = snapshot / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path.resolve())
    else:
        shutil.copytree(folder, snapshot)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return revision


# ---- the command ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The command's arguments, on `parser` (this script's own, or `lmk-embed push`)."""
    parser.add_argument("checkpoint", help="the checkpoint folder to publish")
    parser.add_argument("repo_id", help="org/name on the Hub")
    parser.add_argument("--stage-dir", default=None, help="staging folder (default: a new temporary folder)")
    parser.add_argument("--dry-run", action="store_true", help="stop after validate; print what would be uploaded")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--revision", default=None, help="branch to upload to (created when missing)")
    parser.add_argument("--tag", default=None, help="tag to create on the uploaded revision")
    parser.add_argument("--commit-message", default=None)
    parser.add_argument("--max-file-mb", type=float, default=50.0, help="refuse non-weight files larger than this")
    return parser


def add_push_command(subparsers) -> None:
    parser = subparsers.add_parser("push", help="Stage, validate and upload a checkpoint: lmk-embed push CHECKPOINT REPO_ID ...")
    add_arguments(parser)
    parser.set_defaults(handler=run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmk-embed push", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_arguments(parser)


def main(argv: list[str] | None = None, api=None) -> int:
    return run(build_parser().parse_args(argv), api=api)


def run(args: argparse.Namespace, api=None) -> int:
    """Stage, validate, then upload (or stop, with --dry-run). Exit status: 2 for a bad argument,
    1 when the push is refused or fails validation, 0 otherwise."""
    from lmk_embed_tools.model_cards.generator import check_model_id

    try:
        check_model_id(args.repo_id)
    except ValueError:
        print(f"push: `repo_id` must look like org/name, got {args.repo_id!r}", file=sys.stderr)
        return 2
    if not Path(args.checkpoint).is_dir():
        print(f"push: `checkpoint` {args.checkpoint!r} is not a folder", file=sys.stderr)
        return 2
    if not args.max_file_mb > 0:
        print(f"push: --max-file-mb must be > 0, got {args.max_file_mb:g}", file=sys.stderr)
        return 2
    if args.stage_dir and Path(args.stage_dir).exists() and not Path(args.stage_dir).is_dir():
        print(f"push: --stage-dir {args.stage_dir!r} is a file; give a folder to stage into", file=sys.stderr)
        return 2
    scratch = None if args.stage_dir else Path(tempfile.mkdtemp(prefix="lmk-embed-stage-"))  # removed at the end
    stage_dir = Path(args.stage_dir) if args.stage_dir else scratch / "staged"
    try:
        report = stage(args.checkpoint, stage_dir, args.max_file_mb)
        kept = "" if scratch is None else " (removed at the end; --stage-dir DIR keeps it)"
        print(f"Staged {len(report.files)} files in {report.folder}{kept}")
        if report.refreshed_code:
            print(f"  code refreshed from the current source: {', '.join(sorted(report.refreshed_code))}")
        if report.left_out:
            print(f"  left out (not on the allow-list): {', '.join(report.left_out)}")
        diffs = validate(report.folder, args.checkpoint, repo_id=args.repo_id)
        torch_diff = max(value for key, value in diffs.items() if "_onnx" not in key)
        print(f"Validated in a clean process: max abs diff vs source {torch_diff:.2e} (AutoModel and "
              f"SentenceTransformer, by path and as {args.repo_id})")
        for key in (key for key in diffs if "_onnx" in key):
            print(f"  {key}: max abs diff {diffs[key]:.2e}")
        if args.dry_run:
            total = sum(report.files.values())
            print(f"Dry run: would upload to {args.repo_id}@{args.revision or 'main'} ({total / 2**20:.2f} MB):")
            for name, size in report.files.items():
                print(f"  {size:>12,d}  {name}")
            return 0
        upload(report.folder, args.repo_id, api=api, private=args.private, revision=args.revision, tag=args.tag,
               commit_message=args.commit_message)
    except PushError as error:
        print(f"push: {error}", file=sys.stderr)
        return 1
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
