"""Converting a transformers recurrent LM keeps its weights bit for bit."""

import torch
from safetensors.torch import load_file

from tests import helpers


def test_weights_survive_a_source_with_rescale_prenorm_residual(tmp_path, bpe_tokenizer_dir):
    """transformers 5 divides a loaded Mamba2's out_proj by sqrt(layers) again when the config asks for
    the rescale (an init-only flag); the converted checkpoint must still hold the source's weights."""
    from transformers import AutoTokenizer, Mamba2ForCausalLM

    from lmk_embed_tools.training.convert import convert_to_recurrent

    config = helpers.tiny_mamba2_config()
    config.rescale_prenorm_residual = True
    torch.manual_seed(0)
    Mamba2ForCausalLM(config).save_pretrained(tmp_path / "lm")
    AutoTokenizer.from_pretrained(bpe_tokenizer_dir).save_pretrained(tmp_path / "lm")
    source = load_file(tmp_path / "lm" / "model.safetensors")
    converted = load_file(convert_to_recurrent(tmp_path / "lm", tmp_path / "emb") / "model.safetensors")
    kept = {name.removeprefix("backbone."): tensor for name, tensor in converted.items()}
    for name, tensor in source.items():
        if name.startswith("backbone."):
            assert torch.equal(kept[name.removeprefix("backbone.")], tensor), name
    assert len(kept) == sum(name.startswith("backbone.") for name in source)
