"""Publish a checkpoint to the Hugging Face Hub in three phases: stage -> validate -> upload.

    python push.py CHECKPOINT REPO_ID [--dry-run] [--private] [--revision BRANCH] [--tag TAG]
                   [--commit-message MSG] [--stage-dir DIR] [--max-file-mb 50]
    lmk-embed push ...   (the same)

1. stage: copy an allow-list of files into a clean staging folder: safetensors weights, config
   and tokenizer files, the sentence-transformers files, the card, its plots and the run/results
   files. The shipped .py files come from `lmk_embed/`'s current source, so a checkpoint
   never ships stale code. Refused (non-zero exit, with the reason): pickled weights (.bin, .pt,
   .pkl, ...), non-weight files over --max-file-mb, `.env` files, weights with a NaN or inf in any
   tensor (every tensor is read, one at a time), and anything that looks like a Hub token (`hf_` + 30
   characters) or a private key, in any file: PNG text chunks (tEXt, and zTXt / iTXt decompressed)
   and safetensors metadata and tensor names included. Files outside the allow-list are listed and left out.
2. validate: in a fresh process, offline, from another directory: load the staged folder with
   AutoModel and with SentenceTransformer, embed a fixed probe set, compare with the source
   checkpoint (max abs diff <= 1e-5), and check the card's metadata. Any failure stops the push.
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
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from lmk_embed import AUTO_MAPS, shipped_files

WEIGHT_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
ALLOWED_NAMES = {
    "config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "modules.json", "config_sentence_transformers.json", "embedder_module_config.json",
    "1_Normalize/config.json", "README.md", "run_config.yaml", "eval_results.json", "generation_config.json",
}
ALLOWED_SUFFIXES = WEIGHT_SUFFIXES + (".png",)
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


def _relative_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def stage(checkpoint: str | Path, stage_dir: str | Path, max_file_mb: float = 50.0) -> StageReport:
    """Copy the allow-listed files of `checkpoint` into a fresh `stage_dir` (see the module docstring)."""
    source = Path(checkpoint)
    if not source.is_dir():
        raise PushError(f"{source} is not a checkpoint folder.")
    if (source / "adapter_config.json").exists():
        raise PushError(f"{source} holds a LoRA adapter, not a full checkpoint: merge it (save_mode='merged') first.")
    family_of(source)
    files = _relative_files(source)
    refusals = []
    for name in files:
        path = source / name
        lower = name.lower()
        if lower.endswith(PICKLE_SUFFIXES):
            refusals.append(f"{name}: pickled weights are not published (use safetensors)")
        elif Path(lower).name == ".env" or Path(lower).name.startswith(".env."):
            refusals.append(f"{name}: environment files are never published")
        elif not lower.endswith(WEIGHT_SUFFIXES) and path.stat().st_size > max_file_mb * 2**20:
            refusals.append(f"{name}: {path.stat().st_size / 2**20:.2f} MB is over --max-file-mb={max_file_mb:g} and is not weights")
        elif lower.endswith(WEIGHT_SUFFIXES):
            refusals.extend(f"{name}: {problem}" for problem in scan_safetensors(path))
        else:
            texts = [path.read_bytes()]
            if lower.endswith(".png"):
                try:
                    texts.extend(png_texts(path, limit=int(max_file_mb * 2**20)))
                except ValueError as error:
                    refusals.append(f"{name}: {error}")
            refusals.extend(f"{name}: {problem}" for problem in secrets_in(texts))
    for path in shipped_files():  # staged from the current source, so scanned there
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
    shipped = {path.name for path in shipped_files()}
    for name in files:
        if name in shipped:
            continue
        if name in ALLOWED_NAMES or name.endswith(ALLOWED_SUFFIXES):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target / name)
        else:
            report.left_out.append(name)
    for path in shipped_files():  # the current source, never what an older checkpoint carried
        shutil.copyfile(path, target / path.name)
    for name in shipped:
        old = source / name
        if not old.exists() or old.read_bytes() != (target / name).read_bytes():
            report.refreshed_code.append(name)
    report.files = {name: (target / name).stat().st_size for name in _relative_files(target)}
    return report


# ---- 2. validate --------------------------------------------------------------------------------

VALIDATE_SCRIPT = r"""
import json, sys
import numpy as np
from transformers import AutoModel
from sentence_transformers import SentenceTransformer

staged, source, family = sys.argv[1], sys.argv[2], sys.argv[3]
texts = json.loads(sys.argv[4])
if family == "lmk_embedder":
    from lmk_embed.modeling_lmk import LMKModel as Reference
    from lmk_embed.tokenization_lmk import LMKTokenizer as ReferenceTokenizer
else:
    from lmk_embed.modeling_recurrent import RecurrentEmbedModel as Reference
    from lmk_embed.tokenization_recurrent import RecurrentEmbedTokenizer as ReferenceTokenizer
reference = Reference.from_pretrained(source)  # the source's weights, config and tokenizer files
reference.tokenizer = ReferenceTokenizer.from_pretrained(source)
expected = reference.encode(texts)
auto = AutoModel.from_pretrained(staged, trust_remote_code=True).encode(texts)
st = SentenceTransformer(staged, trust_remote_code=True, device="cpu").encode(texts)
from lmk_embed_tools.model_cards import check_card
check_card(staged + "/README.md")
print(json.dumps({"automodel": float(np.abs(auto - expected).max()), "sentence_transformers": float(np.abs(st - expected).max())}))
"""


def validate(staged: str | Path, checkpoint: str | Path, tolerance: float = 1e-5) -> dict[str, float]:
    """Load the staged folder in a fresh offline process elsewhere; compare with the source checkpoint."""
    staged, checkpoint = Path(staged).resolve(), Path(checkpoint).resolve()
    if not (staged / "README.md").is_file():
        raise PushError(f"{staged} has no README.md model card (write one with `lmk-embed card`).")
    repo_root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as elsewhere:
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(Path(elsewhere) / "modules"),
                   PYTHONPATH=os.pathsep.join([str(repo_root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        command = [sys.executable, "-c", VALIDATE_SCRIPT, str(staged), str(checkpoint), family_of(staged), json.dumps(PROBE_TEXTS)]
        result = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise PushError(f"validation failed: the staged folder does not load or its card is invalid:\n{result.stderr[-4000:]}")
    diffs = json.loads(result.stdout.strip().splitlines()[-1])
    bad = {k: v for k, v in diffs.items() if not v <= tolerance}
    if bad:
        raise PushError(f"validation failed: staged embeddings differ from the source by {bad} (> {tolerance}).")
    return diffs


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


def install_in_hub_cache(folder: str | Path, repo_id: str, cache_dir: str | Path, revision: str | None = None) -> str:
    """Lay `folder` out as a Hub cache entry so `repo_id` resolves offline (`HF_HUB_OFFLINE=1`).

    Writes `cache_dir/models--org--name/snapshots/<revision>/...` and `refs/main`; returns the revision.
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmk-embed push", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_arguments(parser)


def main(argv: list[str] | None = None, api=None) -> int:
    return run(build_parser().parse_args(argv), api=api)


def run(args: argparse.Namespace, api=None) -> int:
    """Stage, validate, then upload (or stop, with --dry-run). Exit status: 2 for a bad argument,
    1 when the push is refused or fails validation, 0 otherwise."""
    if "/" not in args.repo_id:
        print(f"push: `repo_id` must look like org/name, got {args.repo_id!r}", file=sys.stderr)
        return 2
    if not Path(args.checkpoint).is_dir():
        print(f"push: `checkpoint` {args.checkpoint!r} is not a folder", file=sys.stderr)
        return 2
    if not args.max_file_mb > 0:
        print(f"push: --max-file-mb must be > 0, got {args.max_file_mb:g}", file=sys.stderr)
        return 2
    stage_dir = Path(args.stage_dir) if args.stage_dir else Path(tempfile.mkdtemp(prefix="lmk-embed-stage-")) / "staged"
    try:
        report = stage(args.checkpoint, stage_dir, args.max_file_mb)
        print(f"Staged {len(report.files)} files in {report.folder}")
        if report.refreshed_code:
            print(f"  code refreshed from the current source: {', '.join(sorted(report.refreshed_code))}")
        if report.left_out:
            print(f"  left out (not on the allow-list): {', '.join(report.left_out)}")
        diffs = validate(report.folder, args.checkpoint)
        print(f"Validated: max abs diff vs source {max(diffs.values()):.2e} (AutoModel and SentenceTransformer)")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
