"""A transformers Mamba2 backbone, exported as numpy arrays, written as a llama.cpp GGUF (fp32, f16, bf16, q8_0).

    python -m benchmarks.gguf_mamba2 FOLDER [--formats f32 f16 bf16 q8_0]

Runs in the llama.cpp venv (`make bench-llamacpp` builds it: numpy, gguf, llama-cpp-python); it needs
neither torch nor transformers. FOLDER holds what `benchmarks.recurrent_vs_llamacpp` exports:

    config.json    the backbone's Mamba2Config (hidden_size, num_hidden_layers, state_size, head_dim,
                   num_heads, n_groups, expand, conv_kernel, layer_norm_epsilon, vocab_size)
    weights.npz    the backbone's state dict in transformers' names, float32

and gets mamba2-f32.gguf, written here with the gguf package, then mamba2-f16.gguf, mamba2-bf16.gguf
and mamba2-q8_0.gguf made from it by llama.cpp's own quantizer (`llama_cpp.llama_model_quantize`), which keeps the 1-D
tensors, the norms and the conv1d in f32 and converts token_embd, ssm_in and ssm_out.

Why not llama.cpp's convert_hf_to_gguf.py: its Mamba2 path stores a tokenizer.json as a GPT-2 BPE
vocabulary and refuses any pre-tokenizer whose hash it does not know ("BPE pre-tokenizer was not
recognized"). Our tokenizer is MiniLM's WordPiece, which is no BPE at all. The benchmark feeds token
ids to both engines, so the GGUF carries no vocabulary: `tokenizer.ggml.model = "none"` and
`mamba2.vocab_size = V`, for which llama.cpp adds V dummy tokens and accepts any id below V.
The tensors get the converter's Mamba2 layout (its Mamba2Model.modify_tensors):

    transformers (torch shape)              GGUF name (numpy shape; GGUF's ne is the reverse)
    embeddings.weight [V, d]                token_embd.weight [V, d]
    layers.i.norm.weight [d]                blk.i.attn_norm.weight [d]
    layers.i.mixer.in_proj.weight [P, d]    blk.i.ssm_in.weight [P, d]; P = 2i + 2gn + h, [z, xBC, dt]
    layers.i.mixer.conv1d.weight [c, 1, k]  blk.i.ssm_conv1d.weight [c, k]  (squeezed; c = i + 2gn)
    layers.i.mixer.conv1d.bias [c]          blk.i.ssm_conv1d.bias [c]
    layers.i.mixer.dt_bias [h]              blk.i.ssm_dt.bias [h]
    layers.i.mixer.A_log [h]                blk.i.ssm_a [h, 1] = -exp(A_log)
    layers.i.mixer.D [h]                    blk.i.ssm_d [h, 1]
    layers.i.mixer.norm.weight [i]          blk.i.ssm_norm.weight [g, i / g]  (gated RMSNorm, per group)
    layers.i.mixer.out_proj.weight [d, i]   blk.i.ssm_out.weight [d, i]
    norm_f.weight [d]                       output_norm.weight [d]

No output.weight: llama.cpp then ties the LM head to token_embd, and the embedding mode never uses it.
llama.cpp uses one epsilon (`mamba2.attention.layer_norm_rms_epsilon`) for the layer norms, the gated
norm and the final norm, as transformers' Mamba2 does (`layer_norm_epsilon`), and applies no dt clamp,
which matches transformers' default `time_step_limit = (0, inf)`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FORMATS = ("f32", "f16", "bf16", "q8_0")


def gguf_path(folder: Path, fmt: str) -> Path:
    return Path(folder) / f"mamba2-{fmt}.gguf"


def write_f32(folder: Path) -> Path:
    """FOLDER/config.json + weights.npz -> FOLDER/mamba2-f32.gguf (every tensor float32)."""
    import gguf
    import numpy as np

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    weights = np.load(folder / "weights.npz")
    d, layers, n_state = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["state_size"]
    inner = cfg.get("intermediate_size") or cfg["expand"] * d
    heads, groups = cfg["num_heads"], cfg["n_groups"]
    assert heads * cfg["head_dim"] == inner, "llama.cpp derives head_dim as d_inner / n_head"
    assert not cfg.get("use_bias", False), "llama.cpp's Mamba2 has no in_proj/out_proj bias"
    vocab = weights["embeddings.weight"].shape[0]

    path = gguf_path(folder, "f32")
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MAMBA2])
    writer.add_name("lmk-embed benchmark Mamba2 (random weights)")
    writer.add_context_length(2**20)  # the converter's value: a recurrent model has no positional limit
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(0)  # unused, required when loading (as in the converter)
    writer.add_head_count(0)
    writer.add_block_count(layers)
    writer.add_ssm_conv_kernel(cfg.get("conv_kernel", 4))
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_state_size(n_state)
    writer.add_ssm_time_step_rank(heads)
    writer.add_ssm_group_count(groups)
    writer.add_layer_norm_rms_eps(cfg["layer_norm_epsilon"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("none")  # ids only: see the module docstring
    writer.add_vocab_size(vocab)

    def name(tensor: gguf.MODEL_TENSOR, layer: int | None = None, suffix: str | None = "weight") -> str:
        base = gguf.TENSOR_NAMES[tensor].format(bid=layer)
        return f"{base}.{suffix}" if suffix else base

    def add(key: str, array) -> None:
        writer.add_tensor(key, np.ascontiguousarray(array, dtype=np.float32))

    T = gguf.MODEL_TENSOR
    add(name(T.TOKEN_EMBD), weights["embeddings.weight"])
    for i in range(layers):
        p = f"layers.{i}."
        m = p + "mixer."
        add(name(T.ATTN_NORM, i), weights[p + "norm.weight"])
        add(name(T.SSM_IN, i), weights[m + "in_proj.weight"])
        add(name(T.SSM_CONV1D, i), weights[m + "conv1d.weight"].squeeze(1))
        add(name(T.SSM_CONV1D, i, "bias"), weights[m + "conv1d.bias"])
        add(name(T.SSM_DT, i, "bias"), weights[m + "dt_bias"])
        add(name(T.SSM_A, i, None), -np.exp(weights[m + "A_log"].astype(np.float32)).reshape(heads, 1))
        add(name(T.SSM_D, i, None), weights[m + "D"].reshape(heads, 1))
        add(name(T.SSM_NORM, i), weights[m + "norm.weight"].reshape(groups, inner // groups))
        add(name(T.SSM_OUT, i), weights[m + "out_proj.weight"])
    add(name(T.OUTPUT_NORM), weights["norm_f.weight"])

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize(source: Path, target: Path, fmt: str, threads: int = 2) -> Path:
    """llama.cpp's quantizer: source GGUF -> target GGUF of file type `fmt` ("f16", "bf16" or "q8_0")."""
    import llama_cpp

    ftype = {"f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "bf16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16,
             "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}[fmt]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params)
    if code != 0:
        raise RuntimeError(f"llama_model_quantize({fmt}) returned {code}")
    return target


def convert(folder: Path, formats=FORMATS) -> dict[str, str]:
    """Write every format in `formats` (f32 first: the others are quantized from it) -> {fmt: path}."""
    folder = Path(folder)
    paths = {"f32": str(write_f32(folder))}
    for fmt in formats:
        if fmt != "f32":
            paths[fmt] = str(quantize(Path(paths["f32"]), gguf_path(folder, fmt), fmt))
    return {fmt: paths[fmt] for fmt in formats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    args = parser.parse_args()
    print(json.dumps(convert(args.folder, args.formats)))


if __name__ == "__main__":
    main()
