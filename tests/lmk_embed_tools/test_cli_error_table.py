"""The CLI's error table: every subcommand's user mistakes (outputs that are files, missing models
and tokenizers, bad values, sources of the wrong kind, bad files) exit 2 with one line on stderr,
naming the problem, and no traceback. Run in process: a traceback would be an exception here."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from lmk_embed_tools import cli


def exit_and_lines(argv, capsys):
    try:
        code = cli.main([str(arg) for arg in argv])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.startswith(("lmk-embed", "push:"))], err


@pytest.fixture(scope="module")
def files(tmp_path_factory, minilm_path, lmk_checkpoint):
    root = tmp_path_factory.mktemp("cli-errors")
    (root / "a-file").write_text("x")
    (root / "in.jsonl").write_text('{"id": "a", "text": "x"}\n')
    (root / "pairs.jsonl").write_text('{"query": "q", "positive": "p"}\n')
    (root / "pairs.txt").write_text("q\tp\n")
    (root / "empty").mkdir()
    pickled = shutil.copytree(minilm_path, root / "pickle-only",
                              ignore=shutil.ignore_patterns("*.safetensors", "onnx", "openvino", "*.onnx"))
    from safetensors.torch import load_file

    torch.save(load_file(next(minilm_path.glob("*.safetensors"))), pickled / "pytorch_model.bin")
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": str(lmk_checkpoint)}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    carded = shutil.copytree(lmk_checkpoint, root / "carded")
    from lmk_embed_tools.model_cards import write_card

    write_card(carded, model_id="our-org/x")
    from tests.lmk_embed_tools.corpus.indexes import write_indexes

    write_indexes(root, lmk_checkpoint)  # root/index and its damaged copies root/index-*
    return root


CASES = [
    # outputs that are files
    (["convert-lmk", "{minilm}", "{root}/a-file"], "is a file"),
    (["convert-recurrent", "{mamba2_lm}", "{root}/a-file"], "is a file"),
    (["train", "--model", "{lmk}", "--output_dir", "{root}/a-file", "--train_data", "{root}/pairs.jsonl"], "is a file"),
    (["evaluate", "{lmk}", "--task", "passkey", "--out", "{root}/a-file"], "is a file"),
    (["push", "{root}/carded", "our-org/x", "--dry-run", "--stage-dir", "{root}/a-file"], "is a file"),
    # bad values
    (["convert-lmk", "{minilm}", "{root}/out-1", "--max-length", "1"], "max_length"),
    (["encode-corpus", "{lmk}", "{root}/in.jsonl", "{root}/out-2", "--max-length", "1"], "max_length"),
    (["card", "{lmk}", "--model-id", "no slash"], "org/name"),
    # models and tokenizers that do not exist
    (["convert-recurrent", "{mamba2_lm}", "{root}/out-3", "--tokenizer", "{root}/no-such-tokenizer"], "no-such-tokenizer"),
    (["train", "--model", "{root}/no-such-model", "--output_dir", "{root}/out-4", "--train_data", "{root}/pairs.jsonl"],
     "no-such-model"),
    # sources of the wrong kind
    (["convert-recurrent", "{minilm}", "{root}/out-5"], "recurrent"),
    (["convert-recurrent", "{mamba2_lm}", "{root}/out-6", "--tokenizer", "{minilm}"], "EOS"),
    (["convert-lmk", "{mamba2_lm}", "{root}/out-7"], "convert-recurrent"),
    (["convert-lmk", "{root}/pickle-only", "{root}/out-8"], "safetensors"),
    (["encode-corpus", "{mamba2}", "{root}/in.jsonl", "{root}/out-9", "--output-value", "landmarks"], "landmarks"),
    (["encode-corpus", "{root}/adapter", "{root}/in.jsonl", "{root}/out-10"], "adapter"),
    (["encode-corpus", "{root}/pickle-only", "{root}/in.jsonl", "{root}/out-14"], "not one of lmk-embed's"),
    (["encode-corpus", "{mamba2_lm}", "{root}/in.jsonl", "{root}/out-15"], "not one of lmk-embed's"),
    (["encode-corpus", "{lmk}", "{root}/in.jsonl", "{root}/out-16", "--gpus-per-worker", "-1"], "gpus_per_worker"),
    # damaged landmark indexes (tests/lmk_embed_tools/corpus/indexes.py), each named with what is wrong
    (["search", "{root}/index-swapped", "q"], "cannot read the index's table"),
    (["search", "{root}/index-truncated", "q"], "cannot read the index's table"),
    (["search", "{root}/index-deleted", "q"], "cannot read the index's table"),
    (["search", "{root}/index-changed", "q"], "it was changed after encoding"),
    (["search", "{root}/index-incomplete", "q"], "is not complete"),
    (["search", "{root}/index-rows", "q"], "holds 4 rows but the input had 5"),
    (["search", "{root}/index-no-settings", "q"], "`settings` is missing"),
    (["search", "{root}/index-dimension", "q"], "vectors of width 32, its record says dimension 64"),
    (["search", "{root}/index-model-path", "q"], "moved-model' is not a checkpoint folder"),
    (["search", "{root}/index-shards", "q"], "lmk-embed index convert"),
    # another model: an edited record, --model of the same width, --model of another width
    (["search", "{root}/index-model-entry", "q"], "is not the model that encoded INDEX"),
    (["search", "{root}/index", "q", "--model", "{root}/other-lmk"], "is not the model that encoded INDEX"),
    (["search", "{root}/index", "q", "--model", "{minilm}"], "is not the model that encoded INDEX"),
    (["search", "{root}/index", "  "], "query 1 is empty or blank"),
    (["search", "{root}/index", "q", ""], "query 2 is empty or blank"),
    # conversions that wrote checkpoints which could not be used, or gave tracebacks
    (["convert-lmk", "{minilm}", "{root}/out-17", "--long-input", "windows", "--window-length", "3"],
     "`window_length`=3 must hold one chunk of g=128"),
    (["convert-lmk", "{minilm}", "{root}/out-18", "--long-input", "windows", "--window-length", "9999"],
     "`window_length`=9999 exceeds the backbone's limit of 512"),
    (["convert-lmk", "{minilm}", "{root}/out-19", "--pooling", "cls", "--window-length", "64"], "needs pooling='lmk'"),
    (["convert-lmk", "{lmk}", "{root}/out-20"], "already an lmk-embed checkpoint (lmk_embedder)"),
    (["convert-recurrent", "{mamba2}", "{root}/out-21"], "already an lmk-embed checkpoint (recurrent_embedder)"),
    (["convert-lmk", "{root}/empty", "{root}/out-22"], "holds no config.json"),
    (["convert-recurrent", "{root}/empty", "{root}/out-23"], "holds no config.json"),
    (["convert-recurrent", "{mamba2_lm}", "{root}/out-24", "--max-length", "1"], "`max_length`=1 is too small"),
    # runs refused before they start or write
    (["train-student", "--out", "{root}/a-file"], "--out"),
    (["train", "--model", "{lmk}", "--output_dir", "{root}/out-25", "--train_data", "{root}/pairs.txt"],
     "Unsupported training data format '.txt'"),
]


@pytest.mark.parametrize("args, named", CASES, ids=[" ".join(a[:1] + [n]) for a, n in CASES])
def test_error_table(args, named, files, minilm_path, lmk_checkpoint, mamba2_lm, mamba2_checkpoint, capsys):
    values = {"root": files, "minilm": minilm_path, "lmk": lmk_checkpoint, "mamba2_lm": mamba2_lm, "mamba2": mamba2_checkpoint}
    code, lines, err = exit_and_lines([arg.format(**values) for arg in args], capsys)
    assert code == 2 and len(lines) == 1 and named in lines[0], err[-3000:]
    assert "Traceback" not in err and lines[0] == err.strip().splitlines()[-1]
    outputs = [arg.format(**values) for arg in args if "{root}/out-" in arg]
    assert not any(Path(out).exists() for out in outputs), "a refused command wrote its output"


@pytest.mark.parametrize("args, named", [
    (["train", "--model", "{root}/no-such-model", "--output_dir", "{root}/out-11", "--train_data", "stdlib"], "no-such-model"),
    (["encode-corpus", "{lmk}", "{root}/in.jsonl", "{root}/out-12", "--max-length", "1"], "max_length"),
    (["convert-recurrent", "{mamba2_lm}", "{root}/out-13", "--tokenizer", "{minilm}"], "EOS"),
], ids=["train-imports-no-quantisation", "encode-corpus-loads-quietly", "convert-recurrent-loads-quietly"])
def test_the_console_prints_the_error_line_alone(args, named, files, minilm_path, lmk_checkpoint, mamba2_lm):
    """The console command, in a fresh process: no bitsandbytes banner, progress bar or load report
    before the one line (bitsandbytes is imported only where 4-bit is asked for)."""
    from tests.lmk_embed_tools.test_cli import run_cli

    values = {"root": files, "minilm": minilm_path, "lmk": lmk_checkpoint, "mamba2_lm": mamba2_lm}
    result = run_cli(*[arg.format(**values) for arg in args])
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and named in result.stderr, result.stderr[-2000:]


def test_a_refused_setting_leaves_the_output_folder_reusable(files, lmk_checkpoint):
    """The settings are checked before manifest.json is written: the corrected rerun is not refused
    as "other settings"."""
    from lmk_embed_tools.corpus import CorpusArgumentError, encode_corpus

    out = files / "out-reuse"
    with pytest.raises(CorpusArgumentError, match="max_length"):
        encode_corpus(str(lmk_checkpoint), str(files / "in.jsonl"), out, max_length=1, show_progress_bar=False)
    assert not (out / "manifest.json").exists()
    assert encode_corpus(str(lmk_checkpoint), str(files / "in.jsonl"), out, show_progress_bar=False)["rows"] == 1
