"""The README's commands, read from README.md and run as written on a tiny checkpoint.

A README edit that breaks a command (a flag renamed, an option the checkpoint refuses) fails here.
The placeholders (SOURCE, OUTPUT, CHECKPOINT, MODEL, T) and the Quickstart's Hub id become local
tiny models; everything else is the README's own text. Optional parts in brackets run too, except a
repetition (`[MODEL ...]`). `runs/minilm-lmk`, the Quickstart's output, is the CHECKPOINT and MODEL
of the later commands, as a user following the README would have it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO_ROOT, stdlib_texts

README = REPO_ROOT / "README.md"
QUICKSTART_CHECKPOINT = "runs/minilm-lmk"
QUICKSTART_SOURCE = "sentence-transformers/all-MiniLM-L6-v2"  # needs the Hub: a tiny local encoder stands in

# `lmk-embed` commands the test does not run, each with the reason (any other command of the README runs).
NOT_RUN = {
    "train": "fine-tuning takes minutes; tests/lmk_embed_tools/training/ runs `train` on its worked configs",
    "serve": "a long-running server; tests/lmk_embed_tools/serve/ starts it and drives it over HTTP",
}
# Appended to a command that would otherwise take minutes on the tiny model: fewer lengths and queries.
SMALLER = {"evaluate": ["--max-lengths", "256", "--queries", "4", "--documents", "8"]}


def fenced_blocks(language: str) -> list[str]:
    """The README's ```language blocks, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def expand_optional(line: str) -> str:
    """Brackets mark optional parts: keep their contents, drop a repetition (`[MODEL ...]`)."""
    return re.sub(r"\[([^\]]*)\]", lambda part: "" if part.group(1).endswith(" ...") else part.group(1), line)


def readme_commands() -> list[list[str]]:
    """Every `lmk-embed` line of the README's bash blocks, as argv (without `lmk-embed`), in order."""
    commands = []
    for block in fenced_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(expand_optional(line), comments=True)
            if words[:1] == ["lmk-embed"]:
                commands.append(words[1:])
    return commands


def test_the_readme_commands_are_found():
    """The parser sees the commands a user reads, so the test below cannot pass on nothing."""
    names = [argv[0] for argv in readme_commands()]
    for name in ("convert-lmk", "convert-recurrent", "evaluate", "encode-corpus", "search", "card", "push",
                 "export-onnx", "train", "serve"):
        assert name in names, names
    assert expand_optional("evaluate MODEL [MODEL ...] --task x") == "evaluate MODEL  --task x"
    assert expand_optional('[--default-task "..."] [--tokenizer T]') == '--default-task "..." --tokenizer T'


def local_argv(argv: list[str], values: dict) -> list[str]:
    """A README argv with its placeholders made local (SOURCE depends on the family converted)."""
    source = values["recurrent_source"] if argv[0] == "convert-recurrent" else values["encoder_source"]
    names = {"SOURCE": source, QUICKSTART_SOURCE: values["encoder_source"], "OUTPUT": f"made/{argv[0]}",
             "CHECKPOINT": QUICKSTART_CHECKPOINT, "MODEL": QUICKSTART_CHECKPOINT, "T": values["tokenizer"]}
    return [str(names.get(word, word)) for word in argv] + SMALLER.get(argv[0], [])


def write_inputs(folder) -> None:
    """The files the README's encode-corpus commands read: short texts, and pages longer than a window."""
    texts = stdlib_texts(40)
    (folder / "data").mkdir()
    (folder / "pages").mkdir()
    with open(folder / "data" / "docs.jsonl", "w") as rows:
        for number, text in enumerate(texts[:8]):
            rows.write(json.dumps({"id": number, "text": text}) + "\n")
    with open(folder / "pages" / "pages.jsonl", "w") as rows:
        for number in range(4):
            rows.write(json.dumps({"id": number, "text": "\n\n".join(texts[number * 8:(number + 1) * 8])}) + "\n")


DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys
    from lmk_embed_tools import cli

    results = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(argv)
            except SystemExit as exit_:  # argparse's own errors
                status = exit_.code
        results.append({"argv": argv, "status": status, "stdout": out.getvalue()[-2000:], "stderr": err.getvalue()[-2000:]})
    print(json.dumps(results))
""")


def run_python(code: str, *args: str, cwd) -> subprocess.CompletedProcess:
    env = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_every_readme_command_runs_as_written(tmp_path, mamba2_lm, bpe_tokenizer_dir):
    """convert, encode (the Quickstart's Python), export-onnx, card, push --dry-run, evaluate,
    encode-corpus (shards and the landmark index) and search, in the README's order, in one folder."""
    from lmk_embed_tools.corpus.table import read_record
    from tests.helpers import tiny_encoder_source

    values = {"encoder_source": tiny_encoder_source(tmp_path / "bert", "bert"), "recurrent_source": mamba2_lm,
              "tokenizer": bpe_tokenizer_dir}
    work = tmp_path / "work"
    work.mkdir()
    write_inputs(work)
    commands = [local_argv(argv, values) for argv in readme_commands() if argv[0] not in NOT_RUN]
    assert commands[0][:3] == ["convert-lmk", str(values["encoder_source"]), QUICKSTART_CHECKPOINT], commands[0]

    done = run_python(DRIVER, json.dumps(commands), cwd=work)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    failed = [f"lmk-embed {shlex.join(r['argv'])} -> {r['status']}: {r['stderr'][-600:]}" for r in results if r["status"]]
    assert not failed, "\n".join(failed)

    # Each command left what the README says it makes.
    assert (work / QUICKSTART_CHECKPOINT / "onnx" / "model_qint8.onnx").is_file()
    assert (work / QUICKSTART_CHECKPOINT / "README.md").is_file()
    assert json.loads((work / "embeddings" / "manifest.json").read_text())["complete"]
    index_settings = read_record(work / "index")["settings"]
    assert (index_settings["long_input"], index_settings["window_length"]) == ("windows", 256)
    assert (work / "runs" / "evaluate" / "results.json").is_file()
    searched = results[[r["argv"][0] for r in results].index("search")]
    assert "how do I parse json?" in searched["stdout"] and " 1. " in searched["stdout"], searched["stdout"]

    # The Quickstart's Python, on the checkpoint its convert command wrote.
    (quickstart,) = [block for block in fenced_blocks("python") if QUICKSTART_CHECKPOINT in block
                     and "AutoModel.from_pretrained" in block]
    ran = run_python(quickstart, cwd=work)
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert ran.stdout.splitlines()[0] in ("The json module encodes and decodes JSON.",
                                          "The csv module reads and writes CSV files."), ran.stdout
