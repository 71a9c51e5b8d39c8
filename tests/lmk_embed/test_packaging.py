"""The checkpoint contract: a fresh process, another working directory, HF_HUB_OFFLINE=1, by folder and
by model id (hub-cache layout): AutoModel and SentenceTransformer load it with the same vectors, and
SentenceTransformer.add_adapter trains."""

import json

import pytest

from lmk_embed_tools.push import install_in_hub_cache
from lmk_embed_tools.training.convert import convert_to_lmk
from tests.helpers import run_fresh_python, stdlib_texts

CONTRACT_SCRIPT = r"""
import json, os, sys
import numpy as np, torch
from transformers import AutoModel
from sentence_transformers import SentenceTransformer, losses
from peft import LoraConfig

target = sys.argv[-1] if len(sys.argv) > 1 else None
source, lora_targets, texts = {source!r}, {lora_targets!r}, {texts!r}
report = {{"cwd": os.getcwd()}}
auto = AutoModel.from_pretrained(source, trust_remote_code=True)
st = SentenceTransformer(source, trust_remote_code=True, device="cpu")
a, b = auto.encode(texts), st.encode(texts)
report["auto_class"] = type(auto).__name__
report["max_abs_diff"] = float(np.abs(a - b).max())
report["shape"] = list(a.shape)
report["query_prompt"] = st.prompts.get("query")
report["st_max_seq_length"] = st.max_seq_length
report["tokens"] = st.tokenize(texts)["attention_mask"].sum(1).tolist()  # real tokens, padding left out

st.add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=lora_targets))
trainable = {{n: p.detach().clone() for n, p in st.named_parameters() if p.requires_grad}}
report["trainable"] = len(trainable)
report["only_lora_trainable"] = all("lora_" in n for n in trainable)
st.train()
loss_fn = losses.MultipleNegativesRankingLoss(st)
queries, docs = st.preprocess(texts[:2]), st.preprocess(texts[2:4])
loss = loss_fn([queries, docs], labels=None)
loss.backward()
torch.optim.AdamW([p for p in st.parameters() if p.requires_grad], lr=1e-2).step()
report["changed"] = sum(not torch.equal(trainable[n], p) for n, p in st.named_parameters() if p.requires_grad)
report["loss_finite"] = bool(torch.isfinite(loss))
print(json.dumps(report))
"""

TEXTS = [
    "How do I parse JSON in Python?",
    "Serialize an object hierarchy to a string.",
    "The json module exposes an API familiar to users of the marshal and pickle modules. " * 12,
    "Text wrapping and filling: textwrap fills paragraphs to a given width.",
    "",
]


def check_contract(checkpoint, tmp_path, lora_targets, texts=TEXTS):
    cache = tmp_path / "hub-cache"
    install_in_hub_cache(checkpoint, "our-org/tiny-embedder", cache)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reports = {}
    for label, source in [("folder", str(checkpoint)), ("model_id", "our-org/tiny-embedder")]:
        code = CONTRACT_SCRIPT.format(source=source, lora_targets=lora_targets, texts=texts)
        env = {"HF_HUB_CACHE": str(cache), "HF_MODULES_CACHE": str(tmp_path / f"modules-{label}")}
        reports[label] = run_fresh_python(code, cwd=elsewhere, env_extra=env)
    for label, report in reports.items():
        assert report["cwd"] == str(elsewhere)
        assert report["max_abs_diff"] <= 1e-5, (label, report)
        assert report["shape"][0] == len(texts)
        assert report["trainable"] > 0 and report["only_lora_trainable"]
        assert report["changed"] > 0 and report["loss_finite"], (label, report)
    return reports


@pytest.mark.slow
def test_lmk_checkpoint_contract(minilm_lmk_checkpoint, tmp_path):
    reports = check_contract(minilm_lmk_checkpoint, tmp_path, ["query", "value"])
    assert reports["folder"]["auto_class"] == "LMKModel"
    assert reports["folder"]["shape"] == [len(TEXTS), 384]


@pytest.mark.slow
def test_extended_checkpoint_contract(minilm_path, tmp_path):
    """MiniLM extended to 4,096 positions: a text past 512 tokens runs whole, through both loaders, by
    folder and by model id, with the same vectors; LoRA trains."""
    checkpoint = convert_to_lmk(minilm_path, tmp_path / "extended", granularity=32, max_positions=4096)
    long_text = " ".join(stdlib_texts(4))  # about 1,250 tokens with its landmarks
    reports = check_contract(checkpoint, tmp_path, ["query", "value"], texts=[*TEXTS[:4], long_text])
    for report in reports.values():
        assert report["st_max_seq_length"] == 4096
        assert 1024 < report["tokens"][-1] < 4096  # past the original 512 rows, and not truncated


def test_recurrent_checkpoint_contract(mamba2_checkpoint, tmp_path):
    reports = check_contract(mamba2_checkpoint, tmp_path, ["in_proj"])
    assert reports["folder"]["auto_class"] == "RecurrentEmbedModel"
    assert reports["model_id"]["query_prompt"].startswith("Instruct: ")


def test_lmk_checkpoint_files(minilm_lmk_checkpoint):
    files = {p.name for p in minilm_lmk_checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "modules.json",
            "config_sentence_transformers.json", "embedder_module_config.json", "configuration_lmk.py",
            "modeling_lmk.py", "tokenization_lmk.py", "encoding.py", "st_module.py"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    config = json.loads((minilm_lmk_checkpoint / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_lmk.LMKModel"
    assert config["auto_map"]["AutoConfig"] == "configuration_lmk.LMKConfig"
    assert config["auto_map"]["AutoTokenizer"][1] == "tokenization_lmk.LMKTokenizer"
    assert "site-packages" not in (minilm_lmk_checkpoint / "config.json").read_text()  # no local paths
    modules = json.loads((minilm_lmk_checkpoint / "modules.json").read_text())
    assert modules[0]["type"] == "st_module.EmbedderModule"


def test_sentence_transformers_save_round_trip(minilm_lmk_checkpoint, tmp_path):
    """A checkpoint re-saved by SentenceTransformer (as the trainer does) still loads both ways."""
    code = f"""
    import json, numpy as np
    from transformers import AutoModel
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer({str(minilm_lmk_checkpoint)!r}, trust_remote_code=True)
    st.save({str(tmp_path / 'resaved')!r})
    a = AutoModel.from_pretrained({str(tmp_path / 'resaved')!r}, trust_remote_code=True).encode({TEXTS!r})
    b = SentenceTransformer({str(tmp_path / 'resaved')!r}, trust_remote_code=True).encode({TEXTS!r})
    c = st.encode({TEXTS!r})
    print(json.dumps({{"ab": float(np.abs(a - b).max()), "ac": float(np.abs(a - c).max())}}))
    """
    report = run_fresh_python(code, cwd=tmp_path, env_extra={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert report["ab"] <= 1e-5 and report["ac"] <= 1e-5


def test_loading_without_trust_remote_code_is_refused(minilm_lmk_checkpoint):
    from sentence_transformers import SentenceTransformer

    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(minilm_lmk_checkpoint), trust_remote_code=False)


@pytest.mark.slow
def test_cli_converters(modernbert_source, mamba2_lm, tmp_path):
    import subprocess
    import sys

    from lmk_embed_tools import cli
    from tests.helpers import REPO_ROOT

    commands = [
        ["convert-lmk", str(modernbert_source), str(tmp_path / "lmk"), "--pooling", "mean@k", "--granularity", "16",
         "--splitter", "sentence", "--base-model", "org/encoder"],
        ["convert-recurrent", str(mamba2_lm), str(tmp_path / "rec"), "--block-size", "64", "--default-task", "Find docs"],
    ]
    first = subprocess.run([sys.executable, "-m", "lmk_embed_tools.cli", *commands[0]], capture_output=True, text=True,
                           cwd=REPO_ROOT)  # the console command, in a fresh process
    assert first.returncode == 0, first.stderr[-2000:]
    assert cli.main(commands[1]) == 0
    lmk = json.loads((tmp_path / "lmk" / "config.json").read_text())
    assert (lmk["pooling"], lmk["granularity"], lmk["splitter"], lmk["base_model"]) == ("mean@k", 16, "sentence", "org/encoder")
    rec = json.loads((tmp_path / "rec" / "config.json").read_text())
    assert (rec["block_size"], rec["default_task"]) == (64, "Find docs")
