"""`model.save_pretrained(d)` writes a complete checkpoint: the tokenizer beside the weights
(encode() needs it), the family's code and the sentence-transformers files, so AutoModel and
SentenceTransformer of the saved folder give the model's own vectors (before, SentenceTransformer
built its default mean pooling over an LMK folder without a word). Checked for both families as a
user would: a fresh process that never imports our package, so the checkpoint's own code runs."""

import json

import pytest

from tests.helpers import run_fresh_python

ROUND_TRIP = r"""
import json, os, sys
import numpy as np
import torch
from pathlib import Path
from sentence_transformers import SentenceTransformer
from transformers import AutoModel

checkpoint, saved = {checkpoint!r}, {saved!r}
texts = ["hello", "The json module exposes an API familiar to users of the marshal and pickle modules. " * 20,
         "Zip archives: read and write ZIP files."]
model = AutoModel.from_pretrained(checkpoint, trust_remote_code=True)
model.save_pretrained(saved)  # before any encode(): the tokenizer was never loaded
reloaded = AutoModel.from_pretrained(saved, trust_remote_code=True)
first_diff = float(np.abs(reloaded.encode(texts) - model.encode(texts)).max())
with torch.no_grad():  # a fine-tuning step changed the weights; save again, as transformers / PEFT users do
    next(reloaded.parameters()).mul_(1.01)
reloaded.save_pretrained(saved)
reloaded = AutoModel.from_pretrained(saved, trust_remote_code=True)
st = SentenceTransformer(saved, trust_remote_code=True)
code = {{p.name: p.read_bytes() for p in Path(checkpoint).glob("*.py")}}
print(json.dumps({{
    "module": type(reloaded).__module__,
    "lmk_embed_imported": any(name.split(".")[0] == "lmk_embed" for name in sys.modules),
    "files": sorted(os.listdir(saved)),
    "hello_shape": list(reloaded.encode("hello").shape),
    "first_diff": first_diff,
    "changed": float(np.abs(reloaded.encode(texts) - model.encode(texts)).max()),
    "st_modules": [type(m).__name__ for m in st],
    "st_max_abs_diff": float(np.abs(st.encode(texts) - reloaded.encode(texts)).max()),
    "same_code": {{p.name: p.read_bytes() for p in Path(saved).glob("*.py")}} == code,
    "same_ids": reloaded.tokenizer(texts[1])["input_ids"] == model.tokenizer(texts[1])["input_ids"],
}}))
"""


@pytest.mark.parametrize("which", ["minilm_lmk_checkpoint", "mamba2_checkpoint"])
def test_save_reload_encode_gives_the_same_vectors(which, request, tmp_path):
    checkpoint = request.getfixturevalue(which)
    report = run_fresh_python(ROUND_TRIP.format(checkpoint=str(checkpoint), saved=str(tmp_path / "saved")), cwd=tmp_path,
                              env_extra={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert report["module"].startswith("transformers_modules") and not report["lmk_embed_imported"]
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"} <= set(report["files"])
    dim = json.loads((checkpoint / "config.json").read_text())["backbone_config"]["hidden_size"]
    assert report["hello_shape"] == [dim]
    assert report["first_diff"] <= 1e-6 and report["changed"] > 1e-4 and report["same_ids"] and report["same_code"]
    assert report["st_modules"] == ["EmbedderModule", "Normalize"]
    assert report["st_max_abs_diff"] <= 1e-6


def test_the_held_tokenizer_is_the_one_saved(lmk_checkpoint, tmp_path):
    from lmk_embed import LMKModel, LMKTokenizer

    model = LMKModel.from_pretrained(lmk_checkpoint)
    tokenizer = LMKTokenizer.from_pretrained(lmk_checkpoint)
    tokenizer.add_tokens(["zzqx-new-token"])
    model.tokenizer = tokenizer
    model.save_pretrained(tmp_path / "saved")
    assert "zzqx-new-token" in LMKTokenizer.from_pretrained(tmp_path / "saved").get_vocab()


def test_a_tokenizer_that_cannot_be_loaded_is_a_warning(lmk_checkpoint, tmp_path):
    from lmk_embed import LMKModel

    bare = tmp_path / "bare"  # weights and config, no tokenizer files
    LMKModel.from_pretrained(lmk_checkpoint).save_pretrained(bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    with pytest.warns(UserWarning, match="no tokenizer saved"):
        LMKModel.from_pretrained(bare).save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "config.json").is_file() and not (tmp_path / "saved" / "tokenizer.json").exists()
