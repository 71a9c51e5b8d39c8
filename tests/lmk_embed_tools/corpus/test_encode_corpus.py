"""encode-corpus: shards equal the checkpoint's own encode(), in input order; reruns resume;
changed settings and bad inputs are refused with the file, line and field named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lmk_embed_tools.corpus import CorpusInputError, CorpusSettingsError, encode_corpus
from lmk_embed_tools.corpus.shards import file_sha256
from tests.helpers import REPO_ROOT

SHARD_SIZE = 64  # 200 rows: shards of 64, 64, 64, 8


def corpus_texts(count: int = 200) -> list[str]:
    """Deterministic texts of 3..62 words cut from a stdlib page, with a blank and an empty one."""
    import json as json_module
    import pydoc

    words = pydoc.render_doc(json_module, renderer=pydoc.plaintext).split()
    texts = [" ".join(words[(i * 13) % len(words) :][: 3 + (i * 37) % 60]) for i in range(count)]
    texts[5], texts[77] = "", "   "
    return texts


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def texts():
    return corpus_texts()


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory, texts):
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "docs.jsonl",
                       [{"id": f"doc-{i:03d}", "text": t} for i, t in enumerate(texts)])


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory, lmk_checkpoint, jsonl):
    """An uninterrupted local run with one worker: (output_dir, summary)."""
    out = tmp_path_factory.mktemp("clean") / "out"
    summary = encode_corpus(str(lmk_checkpoint), str(jsonl), out, shard_size=SHARD_SIZE, batch_size=16,
                            show_progress_bar=False)
    return out, summary


def read_output(out: Path) -> tuple[list, np.ndarray]:
    table = pq.read_table(sorted(out.glob("part-*.parquet")))
    return table["id"].to_pylist(), np.asarray(table["embedding"].to_pylist(), dtype=np.float32)


def test_shards_equal_encode_in_input_order(clean_run, lmk_model, texts):
    out, summary = clean_run
    ids, vectors = read_output(out)
    assert ids == [f"doc-{i:03d}" for i in range(len(texts))]
    expected = lmk_model.encode(texts, batch_size=16)
    assert vectors.shape == expected.shape
    np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)
    assert summary["rows"] == len(texts) and summary["empty"] == 2


def test_readback_with_datasets(clean_run, lmk_model, texts):
    import datasets

    out, _ = clean_run
    loaded = datasets.load_dataset("parquet", data_files=sorted(str(p) for p in out.glob("part-*.parquet")),
                                   split="train", cache_dir=str(out.parent / "hf-datasets"))
    assert loaded["id"][:3] == ["doc-000", "doc-001", "doc-002"]
    np.testing.assert_allclose(np.asarray(loaded["embedding"][:20]), lmk_model.encode(texts[:20]), atol=1e-5)


def test_manifest_describes_the_shards(clean_run, lmk_checkpoint, texts):
    out, summary = clean_run
    manifest = json.loads((out / "manifest.json").read_text())
    files = sorted(p.name for p in out.glob("part-*.parquet"))
    assert files == [f"part-{k:05d}.parquet" for k in range(4)]
    assert [s["file"] for s in manifest["shards"]] == files
    assert [s["rows"] for s in manifest["shards"]] == [64, 64, 64, 8]
    for shard in manifest["shards"]:
        assert shard["sha256"] == file_sha256(out / shard["file"])
        assert pq.ParquetFile(out / shard["file"]).metadata.num_rows == shard["rows"]
    assert manifest["complete"] and manifest["num_shards"] == 4 and manifest["dimension"] == 32
    assert manifest["model"]["sha256"].startswith("sha256:")
    assert manifest["settings"]["shard_size"] == SHARD_SIZE and manifest["settings"]["text_field"] == "text"
    assert manifest["counts"] == {k: summary[k] for k in ("rows", "truncated", "empty", "tokens")}
    assert list(os.listdir(out)) and not [n for n in os.listdir(out) if ".tmp-" in n]


def test_rerun_keeps_every_complete_shard(clean_run, lmk_checkpoint, jsonl, capsys):
    """The same run again, through the command line and with another batch size (not a setting)."""
    from lmk_embed_tools import cli
    out, _ = clean_run
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    code = cli.main(["encode-corpus", str(lmk_checkpoint), str(jsonl), str(out), "--shard-size", str(SHARD_SIZE),
                     "--batch-size", "8", "--no-progress"])
    assert code == 0
    assert "200 rows in 4 shards (4 kept from an earlier run)" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")} == before


def test_changed_settings_are_refused_with_the_reason(clean_run, lmk_checkpoint, jsonl):
    out, _ = clean_run
    with pytest.raises(CorpusSettingsError, match=r"max_length: None -> 64"):
        encode_corpus(str(lmk_checkpoint), str(jsonl), out, shard_size=SHARD_SIZE, max_length=64,
                      show_progress_bar=False)
    with pytest.raises(CorpusSettingsError, match=r"shard_size: 64 -> 50"):
        encode_corpus(str(lmk_checkpoint), str(jsonl), out, shard_size=50, show_progress_bar=False)


def test_damaged_shard_is_redone_and_unrecorded_complete_shard_kept(tmp_path, clean_run, lmk_checkpoint, jsonl):
    """Shard 1 damaged, shard 2 half-written, shard 3 renamed but not yet in the manifest (a kill
    between the two): only shard 1 and 2 are redone, and shard 3 brings its counts from its file."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(clean_run[0], out)
    (out / "part-00001.parquet").write_bytes(b"not parquet")
    (out / "part-00002.parquet").unlink()
    (out / "part-00002.parquet.tmp-123").write_bytes(b"half a shard")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"] = [s for s in manifest["shards"] if s["index"] != 3]
    (out / "manifest.json").write_text(json.dumps(manifest))
    summary = encode_corpus(str(lmk_checkpoint), str(jsonl), out, shard_size=SHARD_SIZE, batch_size=16,
                            show_progress_bar=False)
    assert summary == {**clean_run[1], "shards_skipped": 2, "shards_written": 2}
    assert not list(out.glob("*.tmp-*"))
    assert read_output(out)[0] == read_output(clean_run[0])[0]
    np.testing.assert_allclose(read_output(out)[1], read_output(clean_run[0])[1], atol=1e-6)


# A run that stops for good inside shard 2: shards 0 and 1 are complete, shard 2 is half-written.
_HANGING_RUN = """
import sys, time
from pathlib import Path

import lmk_embed_tools.corpus.worker as worker
from lmk_embed_tools.corpus import encode_corpus

real = worker.write_shard
def write_shard(output_dir, index, table, counts):
    if index == 2:
        (Path(output_dir) / "part-00002.parquet.tmp-1").write_bytes(b"PAR1")  # half-written
        print("HANGING", flush=True)
        time.sleep(600)
    return real(output_dir, index, table, counts)
worker.write_shard = write_shard
encode_corpus(sys.argv[1], sys.argv[2], sys.argv[3], shard_size=64, batch_size=16, show_progress_bar=False)
"""


@pytest.mark.slow
def test_sigkill_then_two_local_workers_finish_the_run(tmp_path, clean_run, lmk_checkpoint, jsonl):
    """A run killed inside shard 2 keeps shards 0 and 1; two worker processes write shards 2 and 3,
    and the output equals an uninterrupted one-process run (so 2 workers == 1 worker, too)."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_HANGING_RUN), str(lmk_checkpoint), str(jsonl),
                                str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        line = process.stdout.readline()  # blocks until the run hangs inside shard 2
        assert line.strip() == "HANGING", process.stderr.read()
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    kept = {p.name: (p.stat().st_mtime_ns, file_sha256(p)) for p in out.glob("part-*.parquet")}
    assert sorted(kept) == ["part-00000.parquet", "part-00001.parquet"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"] and [s["index"] for s in manifest["shards"]] == [0, 1]

    summary = encode_corpus(str(lmk_checkpoint), str(jsonl), out, shard_size=SHARD_SIZE, batch_size=16,
                            num_workers=2, show_progress_bar=False)
    assert summary["shards_skipped"] == 2 and summary["shards_written"] == 2
    for name, stamp in kept.items():  # complete shards were kept, not rewritten
        assert ((out / name).stat().st_mtime_ns, file_sha256(out / name)) == stamp
    assert not list(out.glob("*.tmp-*"))
    ids, vectors = read_output(out)
    clean_ids, clean_vectors = read_output(clean_run[0])
    assert ids == clean_ids
    np.testing.assert_allclose(vectors, clean_vectors, atol=1e-6, rtol=0)
    assert summary == {**clean_run[1], "shards_skipped": 2, "shards_written": 2}


# ---- bad inputs: named file, line and field; nothing is encoded ---------------------------------


def _bad_jsonl(path: Path, bad_line: str) -> Path:
    path.write_text('{"id": "a", "text": "fine"}\n' + bad_line + "\n" + '{"id": "c", "text": "fine"}\n')
    return path


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"id": "b", "body": "no text field"}', r"docs\.jsonl, line 2: field 'text' \(--text-field\) is missing"),
        ('{"text": "no id"}', r"docs\.jsonl, line 2: field 'id' \(--id-field\) is missing"),
        ('{"id": "b", "text": null}', r"docs\.jsonl, line 2: field 'text' \(--text-field\) is null"),
        ('{"id": "b", "text": 17}', r"docs\.jsonl, line 2: field 'text' must be a string, got int"),
        ('{"id": 2, "text": "int id after a str id"}', r"docs\.jsonl, line 2: field 'id' is int but the first row"),
        ('{"id": "b", "text": "unterminated', r"docs\.jsonl, line 2: not valid JSON"),
        ('["a", "list"]', r"docs\.jsonl, line 2: expected an object with fields, got list"),
    ],
)
def test_bad_jsonl_row_names_file_line_and_field(tmp_path, lmk_checkpoint, bad_line, message):
    source = _bad_jsonl(tmp_path / "docs.jsonl", bad_line)
    with pytest.raises(CorpusInputError, match=message):
        encode_corpus(str(lmk_checkpoint), str(source), tmp_path / "out", show_progress_bar=False)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_unreadable_inputs_are_named(tmp_path, lmk_checkpoint):
    run = lambda source: encode_corpus(str(lmk_checkpoint), str(source), tmp_path / "out", show_progress_bar=False)  # noqa: E731
    (tmp_path / "latin1.jsonl").write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(CorpusInputError, match=r"latin1\.jsonl, line 2: not UTF-8"):
        run(tmp_path / "latin1.jsonl")
    (tmp_path / "broken.parquet").write_bytes(b"not a parquet file")
    with pytest.raises(CorpusInputError, match=r"broken\.parquet: cannot read as parquet"):
        run(tmp_path / "broken.parquet")
    (tmp_path / "notes.txt").write_text("plain text")
    with pytest.raises(CorpusInputError, match=r"notes\.txt: unknown format '\.txt'"):
        run(tmp_path / "notes.txt")
    with pytest.raises(CorpusInputError, match=r"matches no file"):
        run(tmp_path / "missing-*.jsonl")


def test_csv_missing_column_and_short_row(tmp_path, lmk_checkpoint):
    run = lambda source: encode_corpus(str(lmk_checkpoint), str(source), tmp_path / "out", show_progress_bar=False)  # noqa: E731
    (tmp_path / "a.csv").write_text("id,body\n1,hello\n")
    with pytest.raises(CorpusInputError, match=r"a\.csv, line 2: field 'text' \(--text-field\) is missing"):
        run(tmp_path / "a.csv")
    # A quoted newline makes the second row start on line 4.
    (tmp_path / "b.csv").write_text('id,text\n1,"two\nlines"\n2\n')
    with pytest.raises(CorpusInputError, match=r"b\.csv, line 4: field 'text' \(--text-field\) is missing"):
        run(tmp_path / "b.csv")


def test_output_dir_of_something_else_is_refused(tmp_path, lmk_checkpoint, jsonl):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep-me.txt").write_text("not ours")
    with pytest.raises(CorpusSettingsError, match=r"is not empty and has no manifest\.json"):
        encode_corpus(str(lmk_checkpoint), str(jsonl), tmp_path / "out", show_progress_bar=False)


def test_cli_reports_bad_input_in_one_line(tmp_path, lmk_checkpoint, capsys):
    from lmk_embed_tools import cli
    source = _bad_jsonl(tmp_path / "docs.jsonl", '{"id": "b", "text": 17}')
    code = cli.main(["encode-corpus", str(lmk_checkpoint), str(source), str(tmp_path / "out"), "--no-progress"])
    error = capsys.readouterr().err
    assert code == 2
    assert error.startswith("lmk-embed encode-corpus: error: ") and "docs.jsonl, line 2: field 'text'" in error
    assert len(error.strip().splitlines()) == 1


def test_output_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path, lmk_checkpoint, jsonl, capsys):
    from lmk_embed_tools import cli
    from lmk_embed_tools.corpus import CorpusArgumentError

    (tmp_path / "some_file").write_text("not a folder")
    with pytest.raises(CorpusArgumentError, match=r"OUTPUT_DIR '.*some_file' is a file"):
        encode_corpus(str(lmk_checkpoint), str(jsonl), tmp_path / "some_file", show_progress_bar=False)
    code = cli.main(["encode-corpus", str(lmk_checkpoint), str(jsonl), str(tmp_path / "some_file"), "--no-progress"])
    error = capsys.readouterr().err
    assert code == 2 and len(error.strip().splitlines()) == 1
    assert error.startswith("lmk-embed encode-corpus: error: OUTPUT_DIR") and "some_file" in error
    assert (tmp_path / "some_file").read_text() == "not a folder"


# ---- duplicate ids: refused, naming both places; nothing is encoded ----------------------------


def test_duplicate_ids_are_refused_with_both_lines(tmp_path, lmk_checkpoint, capsys):
    from lmk_embed_tools import cli

    source = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "text": "one"}, {"id": "b", "text": "two"},
                                                  {"id": "a", "text": "three"}])
    with pytest.raises(CorpusInputError, match=r"docs\.jsonl, line 3: duplicate id 'a' in field 'id' \(--id-field\), "
                                                r"first at .*docs\.jsonl, line 1"):
        encode_corpus(str(lmk_checkpoint), str(source), tmp_path / "out", show_progress_bar=False)
    assert not (tmp_path / "out").exists()
    code = cli.main(["encode-corpus", str(lmk_checkpoint), str(source), str(tmp_path / "out"), "--no-progress"])
    error = capsys.readouterr().err
    assert code == 2 and len(error.strip().splitlines()) == 1 and "duplicate id 'a'" in error and "line 3" in error


def test_duplicate_ids_across_files_and_formats(tmp_path, lmk_checkpoint):
    import datasets

    (tmp_path / "in").mkdir()
    datasets.Dataset.from_dict({"id": [1, 2, 3], "text": ["x", "y", "z"]}).to_parquet(tmp_path / "in" / "a.parquet")
    datasets.Dataset.from_dict({"id": [4, 2], "text": ["u", "v"]}).to_parquet(tmp_path / "in" / "b.parquet")
    with pytest.raises(CorpusInputError, match=r"b\.parquet, row 2: duplicate id 2 .* first at .*a\.parquet, row 2"):
        encode_corpus(str(lmk_checkpoint), str(tmp_path / "in" / "*.parquet"), tmp_path / "out", show_progress_bar=False)


def test_duplicate_ids_are_refused_on_resume_and_with_streamed_files(tmp_path, clean_run, lmk_checkpoint, mamba2_checkpoint,
                                                                     texts):
    # A finished run's OUTPUT_DIR, its input then given a repeated id: refused before anything is compared or encoded.
    out = tmp_path / "out"
    import shutil

    shutil.copytree(clean_run[0], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rows = [{"id": f"doc-{i:03d}", "text": t} for i, t in enumerate(texts)]
    rows[150]["id"] = "doc-007"
    source = write_jsonl(tmp_path / "docs.jsonl", rows)
    with pytest.raises(CorpusInputError, match=r"line 151: duplicate id 'doc-007' .* first at .*line 8"):
        encode_corpus(str(lmk_checkpoint), str(source), out, shard_size=SHARD_SIZE, batch_size=16, show_progress_bar=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # Rows naming text files (streamed by a recurrent model).
    (tmp_path / "docs").mkdir()
    for name in ("1.txt", "2.txt"):
        (tmp_path / "docs" / name).write_text("some text")
    index = write_jsonl(tmp_path / "index.jsonl", [{"id": 7, "file": "docs/1.txt"}, {"id": 7, "file": "docs/2.txt"}])
    with pytest.raises(CorpusInputError, match=r"index\.jsonl, line 2: duplicate id 7 .* first at .*index\.jsonl, line 1"):
        encode_corpus(str(mamba2_checkpoint), str(index), tmp_path / "out-files", path_field="file", show_progress_bar=False)


# ---- the other input formats, the other family, landmarks, truncation, float16 -------------------


def test_csv_parquet_and_saved_dataset_inputs(tmp_path, lmk_checkpoint, lmk_model, texts):
    """A glob over csv and parquet files (read in name order), and a saved `datasets` dataset."""
    import datasets

    rows = [t for t in texts[:16] if t.strip()]  # a csv cell holds no blank text unquoted
    ids = [f"d{i}" for i in range(len(rows))]
    dataset = datasets.Dataset.from_dict({"id": ids, "text": rows})
    (tmp_path / "files").mkdir()
    dataset.select(range(6)).to_csv(tmp_path / "files" / "a.csv", index=False)
    dataset.select(range(6, len(rows))).to_parquet(tmp_path / "files" / "b.parquet")
    dataset.save_to_disk(tmp_path / "saved")
    expected = lmk_model.encode(rows, batch_size=8)
    for source, out in ((tmp_path / "files" / "*", tmp_path / "out-files"), (tmp_path / "saved", tmp_path / "out-saved")):
        encode_corpus(str(lmk_checkpoint), str(source), out, shard_size=5, batch_size=8, show_progress_bar=False)
        got_ids, vectors = read_output(out)
        assert got_ids == ids
        np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)
    manifest = json.loads((tmp_path / "out-files" / "manifest.json").read_text())
    assert manifest["input"]["formats"] == ["csv", "parquet"] and [s["rows"] for s in manifest["settings"]["input"]] == [6, len(rows) - 6]


def test_dataset_dict_asks_for_a_split(tmp_path, lmk_checkpoint):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"id": ["a"], "text": ["b"]})}).save_to_disk(tmp_path / "dd")
    with pytest.raises(CorpusInputError, match=r"holds the splits \['train'\]; give one split's folder"):
        encode_corpus(str(lmk_checkpoint), str(tmp_path / "dd"), tmp_path / "out", show_progress_bar=False)


def test_recurrent_checkpoint(tmp_path, mamba2_checkpoint, texts):
    from lmk_embed import RecurrentEmbedModel

    rows = texts[:24]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"id": i, "text": t} for i, t in enumerate(rows)])
    encode_corpus(str(mamba2_checkpoint), str(source), tmp_path / "out", shard_size=10, batch_size=4,
                  show_progress_bar=False)
    model = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).eval()
    ids, vectors = read_output(tmp_path / "out")
    assert ids == list(range(24))
    np.testing.assert_allclose(vectors, model.encode(rows, batch_size=4), atol=1e-5, rtol=0)


def read_index(out: Path):
    """The landmark index's documents table in input order."""
    from lmk_embed_tools.corpus import table

    return table.connect(out).open_table("documents").to_arrow().sort_by("row")


def test_landmarks_and_float16(tmp_path, lmk_checkpoint, lmk_model, texts):
    """One forward per batch gives both outputs: the document vector (the landmarks' mean) equals
    encode()'s, and the landmarks equal encode(output_value="landmarks")'s."""
    rows = texts[:12]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(rows)])
    for dtype, atol in (("float32", 1e-6), ("float16", 2e-3)):
        encode_corpus(str(lmk_checkpoint), str(source), tmp_path / dtype, shard_size=5, batch_size=4,
                      output_value="landmarks", dtype=dtype, show_progress_bar=False)
        table = read_index(tmp_path / dtype)
        assert table["id"].to_pylist() == [f"d{i}" for i in range(len(rows))] and table["text"].to_pylist() == rows
        assert str(table.schema.field("embedding").type) == f"fixed_size_list<item: {'halffloat' if dtype == 'float16' else 'float'}>[32]"
        expected = lmk_model.encode(rows, output_value="landmarks", batch_size=4)
        np.testing.assert_allclose(np.asarray(table["embedding"].to_pylist(), dtype=np.float32),
                                   lmk_model.encode(rows, batch_size=4), atol=atol, rtol=0)
        for row, item in enumerate(expected):
            vectors = np.asarray(table["landmarks"][row].as_py(), dtype=np.float32)
            np.testing.assert_allclose(vectors, item["embeddings"], atol=atol, rtol=0)
            assert [tuple(span) for span in table["landmark_spans"][row].as_py()] == [tuple(s) for s in item["spans"]]


def test_reading_options_and_onnx_file_without_its_backend(tmp_path, lmk_checkpoint, lmk_model, texts, capsys):
    """--long-input/--window-length (from the option spec) reach encode(); --onnx-file needs --backend onnx."""
    from lmk_embed_tools import cli

    rows = [" ".join(texts[i : i + 12]) for i in range(0, 36, 12)]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"id": i, "text": t} for i, t in enumerate(rows)])
    assert cli.main(["encode-corpus", str(lmk_checkpoint), str(source), str(tmp_path / "out"), "--long-input", "windows",
                     "--window-length", "24", "--no-progress"]) == 0
    expected = lmk_model.encode(rows, long_input="windows", window_length=24)
    assert np.abs(expected - lmk_model.encode(rows)).max() > 1e-4  # the window changes the vectors
    np.testing.assert_allclose(read_output(tmp_path / "out")[1], expected, atol=1e-5, rtol=0)
    capsys.readouterr()
    for argv, message in ((["--window-length", "24"], "long_input='windows'"),
                          (["--onnx-file", "onnx/model_qint8.onnx"], "`onnx_file` (--onnx-file)")):
        assert cli.main(["encode-corpus", str(lmk_checkpoint), str(source), str(tmp_path / "other"), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "other").exists()


def test_truncated_texts_are_counted(tmp_path, lmk_checkpoint, lmk_model, texts):
    rows = texts[:40]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(rows)])
    summary = encode_corpus(str(lmk_checkpoint), str(source), tmp_path / "out", shard_size=16, max_length=48,
                            show_progress_bar=False)
    expected = int(lmk_model.tokenizer.build_layout(rows, max_length=48).truncated.sum())
    assert 0 < expected < len(rows)
    assert summary["truncated"] == expected and summary["rows"] == 40
    np.testing.assert_allclose(read_output(tmp_path / "out")[1], lmk_model.encode(rows, max_length=48), atol=1e-5)


# ---- the ray engine ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ray_engine_resumes_and_equals_local(tmp_path, clean_run, lmk_checkpoint, jsonl):
    """On one local Ray cluster, two Ray Data actors finish runs that lost shards: parquet shards (the
    lost two rewritten, the others kept), and a landmark index that lost a shard and holds another
    twice (a worker killed after its commit, then retried): it ends with every row once, as a local run."""
    ray = pytest.importorskip("ray", reason="the `scale` extra is not installed (pip install -e '.[scale]'); Ray tests need it")
    import shutil

    ray.init(include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}})
    try:
        _ray_resumes_shards(tmp_path, clean_run, lmk_checkpoint, jsonl)
        _ray_resumes_the_index(tmp_path, lmk_checkpoint, jsonl, shutil)
    finally:
        ray.shutdown()


def _ray_resumes_shards(tmp_path, clean_run, lmk_checkpoint, jsonl):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(clean_run[0], out)
    for lost in ("part-00001.parquet", "part-00003.parquet"):
        (out / lost).unlink()
    kept = {name: (out / name).stat().st_mtime_ns for name in ("part-00000.parquet", "part-00002.parquet")}
    summary = encode_corpus(str(lmk_checkpoint), str(jsonl), out, shard_size=SHARD_SIZE, batch_size=16,
                            engine="ray", num_workers=2, show_progress_bar=False)
    assert summary == {**clean_run[1], "shards_skipped": 2, "shards_written": 2}
    assert {name: (out / name).stat().st_mtime_ns for name in kept} == kept
    ids, vectors = read_output(out)
    clean_ids, clean_vectors = read_output(clean_run[0])
    assert ids == clean_ids
    np.testing.assert_allclose(vectors, clean_vectors, atol=1e-6, rtol=0)
    manifest = json.loads((out / "manifest.json").read_text())
    clean = json.loads((clean_run[0] / "manifest.json").read_text())
    assert manifest["complete"] and manifest["settings"] == clean["settings"]
    assert [(s["file"], s["rows"]) for s in manifest["shards"]] == [(s["file"], s["rows"]) for s in clean["shards"]]
    for shard in manifest["shards"]:
        assert shard["sha256"] == file_sha256(out / shard["file"])


def _ray_resumes_the_index(tmp_path, lmk_checkpoint, jsonl, shutil):
    from lmk_embed_tools.corpus import table

    options = {"output_value": "landmarks", "shard_size": SHARD_SIZE, "batch_size": 16, "show_progress_bar": False}
    local = encode_corpus(str(lmk_checkpoint), str(jsonl), tmp_path / "local", **options)
    out = shutil.copytree(tmp_path / "local", tmp_path / "index")
    documents = table.connect(out).open_table("documents")
    documents.delete("shard = 1")
    documents.add(documents.search().where("shard = 3").limit(None).to_arrow())
    summary = encode_corpus(str(lmk_checkpoint), str(jsonl), out, engine="ray", num_workers=2, **options)
    assert summary == {**local, "shards_skipped": 2, "shards_written": 2}
    clean, resumed = read_index(tmp_path / "local"), read_index(out)
    assert resumed["row"].to_pylist() == list(range(200)) and resumed["id"].to_pylist() == clean["id"].to_pylist()
    for column in ("embedding", "landmarks"):
        np.testing.assert_allclose(np.asarray(resumed[column].combine_chunks().flatten().flatten(), dtype=np.float32)
                                   if column == "landmarks" else np.asarray(resumed[column].to_pylist()),
                                   np.asarray(clean[column].combine_chunks().flatten().flatten(), dtype=np.float32)
                                   if column == "landmarks" else np.asarray(clean[column].to_pylist()), atol=1e-6)
    assert table.read_record(out)["complete"]


# ---- rows that name a text file ---------------------------------------------------------------------


def test_rows_naming_text_files(tmp_path, mamba2_checkpoint, lmk_checkpoint, lmk_model, texts):
    """A recurrent model streams each named file (vertical schedule); LMK reads it. Both equal
    encode() of the file's text; a missing file is named with its line."""
    from lmk_embed import RecurrentEmbedModel

    docs = tmp_path / "docs"
    docs.mkdir()
    rows = [" ".join(texts[i : i + 3]) for i in range(0, 12, 3)] + [""]  # a few documents and an empty one
    for i, text in enumerate(rows):
        (docs / f"{i}.txt").write_text(text, encoding="utf-8")
    source = write_jsonl(tmp_path / "index.jsonl", [{"id": i, "file": f"docs/{i}.txt"} for i in range(len(rows))])
    recurrent = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).eval()
    for checkpoint, model in ((mamba2_checkpoint, recurrent), (lmk_checkpoint, lmk_model)):
        out = tmp_path / f"out-{Path(checkpoint).name}"
        summary = encode_corpus(str(checkpoint), str(source), out, path_field="file", shard_size=3, batch_size=2,
                                show_progress_bar=False)
        assert summary["rows"] == len(rows) and summary["empty"] == 1
        ids, vectors = read_output(out)
        assert ids == list(range(len(rows)))
        if model is recurrent:  # streamed: exactly encode() of the paths; the text's schedule agrees within 1e-4
            paths = [docs / f"{i}.txt" for i in range(len(rows))]
            np.testing.assert_allclose(vectors, model.encode(paths, batch_size=2), atol=1e-5, rtol=0)
            np.testing.assert_allclose(vectors, model.encode(rows, batch_size=2), atol=1e-4, rtol=0)
        else:
            np.testing.assert_allclose(vectors, model.encode(rows, batch_size=2), atol=1e-5, rtol=0)
    (docs / "2.txt").unlink()
    with pytest.raises(CorpusInputError, match=r"index\.jsonl, line 3: field 'file' names 'docs/2\.txt', which is not a file"):
        encode_corpus(str(lmk_checkpoint), str(source), tmp_path / "out-missing", path_field="file",
                      show_progress_bar=False)
