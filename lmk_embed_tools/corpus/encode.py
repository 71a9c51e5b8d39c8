"""`encode_corpus`: embed every row of INPUT into resumable parquet shards in OUTPUT_DIR."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

from lmk_embed_tools.commandline import check_positive_int

from . import shards as shard_files
from .inputs import CorpusInputError, check_sources, resolve_sources

ENGINES = ("local", "ray")
OUTPUT_VALUES = ("embedding", "landmarks")
DTYPES = ("float32", "float16")
PROMPT_NAMES = ("document", "query")
BACKENDS = ("torch", "onnx")
# Files whose bytes decide a local checkpoint's outputs (its README does not); pickled weights
# (pytorch_model.bin) load too, so they are part of its identity.
_MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin", ".py", ".txt", ".model")
# The checkpoints whose own `encode()` encode-corpus runs (others have no `resolve` or landmarks).
OUR_MODEL_TYPES = ("lmk_embedder", "recurrent_embedder")


class CorpusSettingsError(ValueError):
    """OUTPUT_DIR holds shards made otherwise; the message lists each setting that differs."""


class CorpusArgumentError(ValueError):
    """A bad argument: a value out of range, a MODEL that is not found, an OUTPUT_DIR that is a file,
    a prompt the model lacks. The message names the argument."""


def _choice(name: str, value, choices) -> str:
    if value not in choices:
        raise CorpusArgumentError(f"`{name}` must be one of {list(choices)}, got {value!r}")
    return value


def folder_sha256(path: Path) -> str:
    """sha256 over the names and bytes of the files that decide a checkpoint folder's outputs."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _MODEL_FILE_SUFFIXES):
        digest.update(file.name.encode() + b"\0")
        shard_files.update_digest(digest, file)
    return "sha256:" + digest.hexdigest()


def describe_model(model: str) -> tuple[dict, Path]:
    """The model's identity for the manifest, and the local folder holding its files.

    A folder is identified by a sha256 over the files that decide its outputs (`folder_sha256`); a
    Hub id by the commit of the snapshot it resolves to (offline: the cached one).
    """
    path = Path(model)
    if path.is_dir():
        return {"source": str(path.resolve()), "revision": None, "sha256": folder_sha256(path)}, path
    if path.exists():
        raise CorpusArgumentError(f"MODEL {model!r} is a file; give the checkpoint's folder or a Hub id")
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(model))
    except Exception as error:
        raise CorpusArgumentError(f"cannot find MODEL {model!r} (not a folder, and not on the Hub or in its cache): "
                                  f"{str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"
                                  ) from None
    return {"source": model, "revision": folder.name, "sha256": None}, folder


def _check_model_settings(identity: dict, folder: Path, settings: dict) -> None:
    """Load the model once here and let its own `resolve` check the call's options (max_length,
    output_value), so a bad setting is refused before anything is written to OUTPUT_DIR."""
    from lmk_embed_tools import quiet_model_loading

    from .worker import load_model

    if not (folder / "config.json").is_file():
        if (folder / "adapter_config.json").is_file():
            raise CorpusArgumentError(f"MODEL {identity['source']!r} holds a LoRA adapter, not a full checkpoint: merge it "
                                      "into its base (`lmk-embed train --save_mode merged`) and encode with that")
        raise CorpusArgumentError(f"MODEL {identity['source']!r} is not a checkpoint (no config.json)")
    family = json.loads((folder / "config.json").read_text()).get("model_type")
    if family not in OUR_MODEL_TYPES:  # a foreign AutoModel would load, then fail inside encode
        raise CorpusArgumentError(f"MODEL {identity['source']!r} is a {family!r} checkpoint, not one of lmk-embed's "
                                  f"{list(OUR_MODEL_TYPES)}: convert it first (`lmk-embed convert-lmk` or "
                                  "`convert-recurrent`)")
    try:
        with quiet_model_loading():  # a refusal below must be the only line printed
            # an ONNX graph exported from other weights than the folder's is refused by the
            # checkpoint's own loader, before any shard
            model = load_model(identity, backend=settings.get("backend"))
    except ValueError as error:
        raise CorpusArgumentError(" ".join(str(error).split())) from None
    try:
        model.resolve(max_length=settings["max_length"], output_value=settings["output_value"])
    except (TypeError, ValueError) as error:
        raise CorpusArgumentError(f"{' '.join(str(error).split())} (MODEL is a {model.config.model_type} checkpoint)") from None


def _prompt(folder: Path, prompt_name: str) -> str:
    """The prompt `prompt_name` names in config_sentence_transformers.json (sentence-transformers'
    `prompt_name`); a checkpoint without that file has no prompts."""
    path = folder / "config_sentence_transformers.json"
    prompts = json.loads(path.read_text()).get("prompts", {}) if path.is_file() else {}
    if prompt_name not in prompts:
        if prompt_name == "document" and not prompts:
            return ""
        raise CorpusArgumentError(f"`prompt_name` {prompt_name!r} is not among the model's prompts {sorted(prompts)}")
    return prompts[prompt_name]


def _onnx_setting(folder: Path, onnx_file: str, gpus_per_worker: float) -> dict:
    """The `backend` setting of an ONNX run: the graph's name and the sha256 of its bytes."""
    from .shards import file_sha256

    config = folder / "config.json"
    family = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    if family != "lmk_embedder":
        raise CorpusArgumentError(f"`backend` 'onnx' is for LMK checkpoints; MODEL is {family!r} (run it on torch)")
    graph = folder / onnx_file
    if not isinstance(onnx_file, str) or not graph.is_file():
        raise CorpusArgumentError(f"`onnx_file` {onnx_file!r} is not in MODEL's files: export it with "
                                  "`lmk-embed export-onnx CHECKPOINT` (--quantize int8 for onnx/model_qint8.onnx)")
    if gpus_per_worker:
        raise CorpusArgumentError("`backend` 'onnx' runs on CPU; give `gpus_per_worker` 0")
    return {"name": "onnx", "file": onnx_file, "sha256": file_sha256(graph)}


def _dimension(model: dict) -> int:
    from transformers import AutoConfig

    kwargs = {"revision": model["revision"]} if model.get("revision") else {}
    return int(AutoConfig.from_pretrained(model["source"], trust_remote_code=True, **kwargs).embedding_dim)


def _check_output_dir(output_dir: Path) -> dict | None:
    if output_dir.exists() and not output_dir.is_dir():
        raise CorpusArgumentError(f"OUTPUT_DIR {str(output_dir)!r} is a file; give a new or empty folder, or one "
                                  "encode-corpus wrote before")
    existing = next((parent for parent in output_dir.absolute().parents if parent.exists()), None)
    if not output_dir.exists() and existing is not None and not existing.is_dir():
        raise CorpusArgumentError(f"OUTPUT_DIR {str(output_dir)!r} cannot be made: {str(existing)!r} is a file")
    try:
        manifest = shard_files.read_manifest(output_dir) if output_dir.is_dir() else None
    except ValueError as error:  # a manifest.json that is not JSON
        raise CorpusSettingsError(str(error)) from None
    if manifest is None and output_dir.is_dir() and any(output_dir.iterdir()):
        raise CorpusSettingsError(f"OUTPUT_DIR {str(output_dir)!r} is not empty and has no {shard_files.MANIFEST}; "
                                  "it was not written by encode-corpus (give an empty or new folder)")
    if manifest is not None and manifest.get("format") != shard_files.FORMAT:
        raise CorpusSettingsError(f"{output_dir / shard_files.MANIFEST} has format {manifest.get('format')!r}, "
                                  f"not {shard_files.FORMAT!r}")
    return manifest


def encode_corpus(
    model: str,
    input: str,
    output_dir: str | os.PathLike,
    *,
    text_field: str = "text",
    id_field: str = "id",
    path_field: str | None = None,
    batch_size: int = 32,
    max_length: int | None = None,
    prompt_name: str = "document",
    output_value: str = "embedding",
    engine: str = "local",
    num_workers: int = 1,
    shard_size: int = 10_000,
    dtype: str = "float32",
    ray_address: str | None = None,
    gpus_per_worker: float = 0,
    show_progress_bar: bool = True,
    backend: str = "torch",
    onnx_file: str = "onnx/model.onnx",
) -> dict:
    """Embed every row of `input` with `model`'s own `encode()` into parquet shards in `output_dir`.

    With `path_field`, each row names a UTF-8 text file (relative to its input file's folder)
    instead of holding the text; recurrent models stream it (flat memory in its length).
    Shard k holds input rows [k * shard_size, (k + 1) * shard_size) in input order, as columns
    `id`, `embedding` (fixed_size_list<dtype>[D]) and, for `output_value="landmarks"`,
    `landmarks` (list of [D] vectors per row) and `landmark_spans` (their [start, end) characters).
    A rerun with the same settings skips complete shards; with other settings it raises
    `CorpusSettingsError`. batch_size, engine and num_workers are not settings: they may change
    between runs (batch composition may move the last bits of a vector).

    `backend="onnx"` (LMK checkpoints) runs the checkpoint's exported graph `onnx_file` on ONNX
    Runtime, on CPU, through the same `encode()`; the backend and the graph's bytes are settings.

    Returns the summary: {"rows", "truncated", "empty", "tokens", "shards", "shards_skipped", "shards_written"}.
    """
    _check_arguments(batch_size=batch_size, num_workers=num_workers, shard_size=shard_size, max_length=max_length,
                     engine=engine, output_value=output_value, dtype=dtype, prompt_name=prompt_name, backend=backend,
                     text_field=text_field, id_field=id_field, path_field=path_field, gpus_per_worker=gpus_per_worker)

    output_dir = Path(output_dir)
    manifest = _check_output_dir(output_dir)
    sources = resolve_sources(input)
    found = check_sources(sources, text_field, id_field, path_field)
    identity, folder = describe_model(model)
    settings = {
        "model": {k: v for k, v in identity.items() if k != "source"},
        "input": [{"fingerprint": s.fingerprint, "rows": s.rows} for s in sources],
        "text_field": None if path_field else text_field, "path_field": path_field, "id_field": id_field,
        "max_length": max_length, "prompt_name": prompt_name,
        "prompt": _prompt(folder, prompt_name), "output_value": output_value, "shard_size": shard_size, "dtype": dtype,
    }
    if backend != "torch":  # absent for torch, so manifests written before backends existed still match
        settings["backend"] = _onnx_setting(folder, onnx_file, gpus_per_worker)
    _check_model_settings(identity, folder, settings)
    _check_same_settings(output_dir, manifest, settings)

    total = found["rows"]
    plan = [{"index": k, "start": start, "stop": min(start + shard_size, total)}
            for k, start in enumerate(range(0, total, shard_size))]
    output_dir.mkdir(parents=True, exist_ok=True)
    shard_files.remove_temporaries(output_dir)
    done = _shards_already_written(output_dir, plan, manifest)
    skipped = len(done)

    manifest = {
        "format": shard_files.FORMAT,
        "model": identity,
        "settings": settings,
        # Where the rows came from, as a record (absolute); search never reads INPUT: shards hold the text.
        "input": {"paths": [os.path.abspath(s.path) for s in sources], "formats": [s.format for s in sources],
                  "rows": total},
        "dimension": _dimension(identity),
        "num_shards": len(plan),
        "shards": [],
        "complete": False,
    }

    def save() -> None:
        manifest["shards"] = [done[k] for k in sorted(done)]
        shard_files.write_manifest(output_dir, manifest)

    save()
    pending = [shard for shard in plan if shard["index"] not in done]
    # Absolute paths: spawned processes and Ray actors may run elsewhere than this working directory.
    job = {"model": identity, "sources": [{**vars(s), "path": os.path.abspath(s.path)} for s in sources],
           "settings": settings,
           "output_dir": str(output_dir.resolve()), "batch_size": batch_size}
    _run(job, pending, engine, num_workers, done, save, show_progress_bar, ray_address, gpus_per_worker)

    counts = {key: sum(record[key] for record in done.values()) for key in ("rows", "truncated", "empty", "tokens")}
    summary = {**counts, "shards": len(plan), "shards_skipped": skipped, "shards_written": len(plan) - skipped}
    manifest["complete"] = True
    manifest["counts"] = counts
    save()
    return summary


def _check_arguments(*, batch_size, num_workers, shard_size, max_length, engine, output_value, dtype, prompt_name,
                     backend, text_field, id_field, path_field, gpus_per_worker) -> None:
    """Every argument of `encode_corpus` that is not a path, checked before anything is read or written."""
    for name, value in (("batch_size", batch_size), ("num_workers", num_workers), ("shard_size", shard_size)):
        check_positive_int(name, value, CorpusArgumentError)
    if max_length is not None:
        check_positive_int("max_length", max_length, CorpusArgumentError)
    for name, value, choices in (("engine", engine, ENGINES), ("output_value", output_value, OUTPUT_VALUES),
                                 ("dtype", dtype, DTYPES), ("prompt_name", prompt_name, PROMPT_NAMES),
                                 ("backend", backend, BACKENDS)):
        _choice(name, value, choices)
    for name, value in (("text_field", text_field), ("id_field", id_field), ("path_field", path_field)):
        if name == "path_field" and value is None:
            continue
        if not isinstance(value, str) or not value:
            raise CorpusArgumentError(f"`{name}` must be a non-empty string, got {value!r}")
    if isinstance(gpus_per_worker, bool) or not isinstance(gpus_per_worker, (int, float)) or \
            not math.isfinite(gpus_per_worker) or gpus_per_worker < 0:
        raise CorpusArgumentError(f"`gpus_per_worker` must be a number >= 0, got {gpus_per_worker!r}")


def _check_same_settings(output_dir: Path, manifest: dict | None, settings: dict) -> None:
    """An OUTPUT_DIR of an earlier run is resumed only with the same settings."""
    differences = shard_files.setting_differences(manifest["settings"], settings) if manifest is not None else []
    if differences:
        raise CorpusSettingsError(
            f"OUTPUT_DIR {str(output_dir)!r} holds shards made with other settings ("
            + "; ".join(differences) + "); use another OUTPUT_DIR, or delete this one to start over")


def _shards_already_written(output_dir: Path, plan: list[dict], manifest: dict | None) -> dict[int, dict]:
    """{shard index: its manifest record} for the shards of `plan` an earlier run finished intact."""
    recorded = {r["index"]: r for r in (manifest or {}).get("shards", [])}
    done = {}
    for shard in plan:
        record = shard_files.verify_shard(output_dir, shard["index"], shard["stop"] - shard["start"],
                                          recorded.get(shard["index"]))
        if record is not None:
            done[shard["index"]] = {"index": shard["index"], **{k: v for k, v in record.items() if k != "index"}}
    return done


def _run(job, pending, engine, num_workers, done, save, show_progress_bar, ray_address, gpus_per_worker) -> None:
    """Run `engine` over `pending`, recording each finished shard in the manifest at once."""
    from tqdm.auto import tqdm

    from .engines import run_local, run_ray

    if not pending:
        return
    progress = tqdm(total=sum(s["stop"] - s["start"] for s in pending), unit="doc", desc="Encoding corpus",
                    disable=not show_progress_bar)
    started, tokens = time.perf_counter(), [0]

    def on_progress(rows: int, batch_tokens: int) -> None:
        tokens[0] += batch_tokens
        progress.set_postfix_str(f"{tokens[0] / max(time.perf_counter() - started, 1e-9):,.0f} tok/s", refresh=False)
        progress.update(rows)

    def on_done(record: dict) -> None:
        done[record["index"]] = record
        save()

    try:
        if engine == "local":
            run_local(job, pending, num_workers, on_done, on_progress)
        else:
            run_ray(job, pending, num_workers, on_done, on_progress, address=ray_address,
                    gpus_per_worker=gpus_per_worker)
    finally:
        progress.close()


__all__ = ["encode_corpus", "CorpusArgumentError", "CorpusInputError", "CorpusSettingsError", "describe_model"]
