"""`encode_corpus`: embed every row of INPUT into resumable parquet shards in OUTPUT_DIR."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

from . import shards as shard_files
from . import table as index_table
from .inputs import CorpusInputError, check_sources, resolve_sources

ENGINES = ("local", "ray")
# The index's units: each document's landmark states, or its late chunks (the mean of each chunk's
# token states, read in context: any checkpoint, no training); both go into the same multivector column.
INDEX_OUTPUT_VALUES = ("landmarks", "late_chunks")
OUTPUT_VALUES = ("embedding", *INDEX_OUTPUT_VALUES)
DTYPES = ("float32", "float16")
PROMPT_NAMES = ("document", "query")
BACKENDS = ("torch", "onnx")
# encode()'s options of how a long text is read, which a run passes on when given (settings).
READING_OPTIONS = ("long_input", "window_length")
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
        extra = {name: settings[name] for name in READING_OPTIONS if name in settings}
        model.resolve(max_length=settings["max_length"], output_value=settings["output_value"], **extra)
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


def _check_output_dir(output_dir: Path, output_value: str) -> dict | None:
    """The record an earlier run left in OUTPUT_DIR (its manifest, or its index's record), or None
    for a new or empty folder; anything else there is refused."""
    if output_dir.exists() and not output_dir.is_dir():
        raise CorpusArgumentError(f"OUTPUT_DIR {str(output_dir)!r} is a file; give a new or empty folder, or one "
                                  "encode-corpus wrote before")
    existing = next((parent for parent in output_dir.absolute().parents if parent.exists()), None)
    if not output_dir.exists() and existing is not None and not existing.is_dir():
        raise CorpusArgumentError(f"OUTPUT_DIR {str(output_dir)!r} cannot be made: {str(existing)!r} is a file")
    if index_table.is_index(output_dir):
        if output_value not in INDEX_OUTPUT_VALUES:
            raise CorpusSettingsError(f"OUTPUT_DIR {str(output_dir)!r} holds a landmark index; give another folder for "
                                      "document vectors")
        try:
            record = index_table.read_record(output_dir)
        except Exception as error:  # a record table that is not ours, or damaged
            raise CorpusSettingsError(f"OUTPUT_DIR {str(output_dir)!r}: cannot read the index's record "
                                      f"({' '.join(str(error).split())[:200]}); give a new folder") from None
        if record.get("format") != index_table.FORMAT:
            raise CorpusSettingsError(f"OUTPUT_DIR {str(output_dir)!r} holds an index of format "
                                      f"{record.get('format')!r}, not {index_table.FORMAT!r}")
        return record
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
    if manifest is not None and output_value in INDEX_OUTPUT_VALUES:
        if manifest.get("settings", {}).get("output_value") == "landmarks":
            raise CorpusSettingsError(f"OUTPUT_DIR {str(output_dir)!r} holds a landmark index in the shard format of "
                                      f"an earlier version: convert it (`lmk-embed index convert {output_dir} NEW_DIR`)")
        raise CorpusSettingsError(f"OUTPUT_DIR {str(output_dir)!r} holds document vectors (parquet shards); give "
                                  "another folder for a landmark index")
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
    long_input: str | None = None,
    window_length: int | None = None,
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
    onnx_file: str | None = None,
) -> dict:
    """Embed every row of `input` with `model`'s own `encode()` into `output_dir`.

    `output_value="embedding"`: parquet shards. Shard k holds input rows [k * shard_size, (k + 1) *
    shard_size) in input order, as columns `id` and `embedding` (fixed_size_list<dtype>[D]), with
    `manifest.json`. `output_value="landmarks"`: the landmark index, LanceDB tables (`table`): one
    row per document with its text, document vector, landmark vectors and their character spans,
    written a shard at a time, then indexed for full-text (and, when large, vector) search.

    With `path_field`, each row names a UTF-8 text file (relative to its input file's folder)
    instead of holding the text; recurrent models stream it (flat memory in its length).
    `long_input` and `window_length` (LMK checkpoints) are `encode()`'s (None: the checkpoint's).
    A rerun with the same settings skips complete shards; with other settings it raises
    `CorpusSettingsError`. batch_size, engine and num_workers are not settings: they may change
    between runs (batch composition may move the last bits of a vector).

    `backend="onnx"` (LMK checkpoints) runs the checkpoint's exported graph `onnx_file` (default
    onnx/model.onnx) on ONNX Runtime, on CPU, through the same `encode()`; the backend and the
    graph's bytes are settings.

    Returns the summary: {"rows", "truncated", "empty", "tokens", "shards", "shards_skipped", "shards_written"}.
    """
    _check_arguments(batch_size=batch_size, num_workers=num_workers, shard_size=shard_size, max_length=max_length,
                     engine=engine, output_value=output_value, dtype=dtype, prompt_name=prompt_name, backend=backend,
                     text_field=text_field, id_field=id_field, path_field=path_field, gpus_per_worker=gpus_per_worker,
                     onnx_file=onnx_file, window_length=window_length)

    output_dir = Path(output_dir)
    previous = _check_output_dir(output_dir, output_value)
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
    for name, value in (("long_input", long_input), ("window_length", window_length)):
        if value is not None:  # absent when not given, so records written before they existed still match
            settings[name] = value
    if backend != "torch":  # absent for torch, so manifests written before backends existed still match
        settings["backend"] = _onnx_setting(folder, onnx_file or "onnx/model.onnx", gpus_per_worker)
    _check_model_settings(identity, folder, settings)
    _check_same_settings(output_dir, previous, settings)

    total = found["rows"]
    plan = [{"index": k, "start": start, "stop": min(start + shard_size, total)}
            for k, start in enumerate(range(0, total, shard_size))]
    record = {
        "model": identity,
        "settings": settings,
        # Where the rows came from, as a record (absolute); search never reads INPUT: the output holds the text.
        "input": {"paths": [os.path.abspath(s.path) for s in sources], "formats": [s.format for s in sources],
                  "rows": total},
        "dimension": _dimension(identity),
    }
    # Absolute paths: spawned processes and Ray actors may run elsewhere than this working directory.
    job = {"model": identity, "sources": [{**vars(s), "path": os.path.abspath(s.path)} for s in sources],
           "settings": settings, "output_dir": str(output_dir.resolve()), "batch_size": batch_size,
           "id_type": found["id_type"]}
    run = (_encode_index if output_value in INDEX_OUTPUT_VALUES else _encode_shards)
    done, finish = run(output_dir, plan, previous, record, job)
    skipped = len(done)
    pending = [shard for shard in plan if shard["index"] not in done]
    _run(job, pending, engine, num_workers, done, finish, show_progress_bar, ray_address, gpus_per_worker)

    counts = {key: sum(r[key] for r in done.values()) for key in ("rows", "truncated", "empty", "tokens")}
    finish(counts, complete=True, unchanged=not pending)
    return {**counts, "shards": len(plan), "shards_skipped": skipped, "shards_written": len(plan) - skipped}


def _encode_shards(output_dir: Path, plan: list[dict], manifest: dict | None, record: dict, job: dict):
    """Parquet shards and manifest.json: (finished shards, save(counts=None, complete=False, unchanged))."""
    output_dir.mkdir(parents=True, exist_ok=True)
    shard_files.remove_temporaries(output_dir)
    done = _shards_already_written(output_dir, plan, manifest)
    manifest = {"format": shard_files.FORMAT, **record, "num_shards": len(plan), "shards": [], "complete": False}

    def save(counts: dict | None = None, complete: bool = False, unchanged: bool = False) -> None:
        manifest["shards"] = [done[k] for k in sorted(done)]
        if complete:
            manifest.update(complete=True, counts=counts)
        shard_files.write_manifest(output_dir, manifest)

    save()
    return done, save


def _encode_index(output_dir: Path, plan: list[dict], previous: dict | None, record: dict, job: dict):
    """The landmark index's tables: (finished shards, finish(counts=None, complete=False, unchanged)).
    Workers append their shards themselves; the record is written at the start (incomplete) and once
    all shards are there, after indexing (complete)."""
    import pyarrow as pa

    index_table.require_lancedb()
    output_dir.mkdir(parents=True, exist_ok=True)
    record = {"format": index_table.FORMAT, **record, "hybrid_weight": index_table.DEFAULT_HYBRID_WEIGHT,
              "complete": False}
    if previous is None:
        id_type = pa.int64() if job["id_type"] == "int" else pa.string()
        index_table.create(output_dir, record, record["dimension"], job["settings"]["dtype"], id_type)
    done = index_table.finished_shards(output_dir, plan)
    if previous is not None and (len(done) < len(plan) or not previous.get("complete")):
        index_table.write_record(output_dir, record)  # incomplete again until the missing shards are in

    def finish(counts: dict | None = None, complete: bool = False, unchanged: bool = False) -> None:
        if not complete or (unchanged and previous is not None and previous.get("complete")):
            return  # each shard commits itself; an index found complete is left as it is
        index_table.finish(output_dir, {**record, "counts": counts})

    return done, finish


def _check_arguments(*, batch_size, num_workers, shard_size, max_length, engine, output_value, dtype, prompt_name,
                     backend, text_field, id_field, path_field, gpus_per_worker, onnx_file, window_length) -> None:
    """Every argument of `encode_corpus` that is not a path, checked before anything is read or written
    (the model's own `resolve` checks max_length and window_length against the model)."""
    from lmk_embed.encoding import check_positive_int  # lazily: torch loads once a job runs

    for name, value in (("batch_size", batch_size), ("num_workers", num_workers), ("shard_size", shard_size),
                        ("max_length", max_length), ("window_length", window_length)):
        if value is None and name in ("max_length", "window_length"):
            continue
        try:
            check_positive_int(name, value)
        except (TypeError, ValueError) as problem:  # one error type for every argument of the job
            raise CorpusArgumentError(str(problem).rstrip(".")) from None
    if onnx_file is not None and backend != "onnx":
        raise CorpusArgumentError(f"`onnx_file` (--onnx-file) {onnx_file!r} is the graph of `backend` 'onnx'; add "
                                  f"--backend onnx to run it, or leave --onnx-file out to run on {backend}")
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
    # `manifest`: the shards' manifest, or the landmark index's record (both carry "settings")
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
    """Run `engine` over `pending`, recording each finished shard at once (`save`)."""
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
