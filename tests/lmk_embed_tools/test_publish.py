"""Model cards and push.py: staging with refusals, fresh-code shipping, offline validation, the upload
calls (against a recording stand-in for HfApi), card snippets that run, metadata round trips."""

import json
import re
import shutil
import types

import pytest
from huggingface_hub import ModelCard

import lmk_embed
from lmk_embed_tools import push
from lmk_embed_tools.model_cards import build_card, check_card, record_results, write_card
from tests.helpers import run_fresh_python

RESULTS = [{"dataset": "Python stdlib docs (held-out modules)", "dataset_type": "python-stdlib-docs", "split": "test",
            "metric": "ndcg_at_10", "value": 0.6123, "max_length": 512}]
EXTRAPOLATION = {"dataset": "Python stdlib docs (held-out modules)", "metric": "ndcg_at_10",
                 "points": {"128": 0.51, "256": 0.58, "512": 0.61}}


@pytest.fixture
def lmk_copy(lmk_checkpoint, tmp_path):
    folder = shutil.copytree(lmk_checkpoint, tmp_path / "lmk")
    record_results(folder, RESULTS, EXTRAPOLATION)
    write_card(folder, model_id="our-org/tiny-lmk")
    return folder


@pytest.fixture
def recurrent_copy(mamba2_checkpoint, tmp_path):
    folder = shutil.copytree(mamba2_checkpoint, tmp_path / "mamba2")
    write_card(folder, model_id="our-org/tiny-mamba2")
    return folder


class RecordingHfApi:
    """Stands in for huggingface_hub.HfApi: records every call and keeps the remote's files in `remote`
    (path -> bytes), applying `upload_folder`'s documented semantics: files matching `delete_patterns`
    are deleted from the remote unless they are being uploaded in the same commit."""

    def __init__(self, remote=None):
        self.calls = []
        self.remote = dict(remote or {})

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        import fnmatch
        from pathlib import Path

        folder = Path(kwargs["folder_path"])
        files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        for name in list(self.remote):
            if name not in files and any(fnmatch.fnmatch(name, pattern) for pattern in kwargs.get("delete_patterns") or []):
                del self.remote[name]
        self.remote.update(files)
        self.calls.append(("upload_folder", kwargs["repo_id"], dict(kwargs, files=sorted(files))))
        return types.SimpleNamespace(oid="c0ffee" * 6 + "abcd")

    def create_tag(self, repo_id, **kwargs):
        self.calls.append(("create_tag", repo_id, kwargs))


# ---- stage + validate ------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["lmk_copy", "recurrent_copy"])
def test_stage_and_validate(which, request, tmp_path):
    folder = request.getfixturevalue(which)
    (folder / "training_args.bin.txt").write_text("not allow-listed")
    report = push.stage(folder, tmp_path / "staged")
    assert "README.md" in report.files and "model.safetensors" in report.files and "st_module.py" in report.files
    assert report.left_out == ["training_args.bin.txt"] and not report.refreshed_code
    diffs = push.validate(report.folder, folder)
    assert set(diffs) == {"automodel_path", "sentence_transformers_path", "automodel_id", "sentence_transformers_id"}
    assert max(diffs.values()) <= 1e-5


def _point_auto_model_at(folder, reference):
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"]["AutoModel"] = reference
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def test_a_checkpoint_no_user_can_load_fails_the_push(lmk_copy, tmp_path, capsys):
    """config.json's auto_map names a file the checkpoint does not ship: a user's AutoModel fails,
    so the push must too, naming the file on its first line."""
    _point_auto_model_at(lmk_copy, "modeling_missing.LMKModel")
    api = RecordingHfApi()
    from lmk_embed_tools import cli

    code = cli.main(["push", str(lmk_copy), "our-org/tiny-lmk", "--dry-run", "--stage-dir", str(tmp_path / "staged")])
    err = capsys.readouterr().err
    assert code == 1 and api.calls == []
    first = err.splitlines()[0]
    assert first.startswith("push: validation failed") and "modeling_missing.py" in first and "Traceback" not in first


def test_validation_loads_in_a_clean_process(lmk_copy, tmp_path, monkeypatch):
    """The staged folder is loaded as a user loads it: the classes come from its files, and neither
    this repository nor the installed `lmk_embed` can fill a gap in them."""
    staged = push.stage(lmk_copy, tmp_path / "staged").folder
    # The static check of the metadata off: the clean load alone must catch a missing file.
    monkeypatch.setattr(push, "check_staged_code", lambda folder: None)
    _point_auto_model_at(staged, "modeling_missing.LMKModel")
    with pytest.raises(push.PushError) as caught:
        push.validate(staged, lmk_copy)
    first = str(caught.value).splitlines()[0]
    assert "AutoModel.from_pretrained(" in first and "in a clean process" in first and "modeling_missing.py" in first

    # A code file that imports the project's package works only where the project is installed.
    (staged / "modeling_extra.py").write_text("from lmk_embed.modeling_lmk import LMKModel  # noqa: F401\n")
    _point_auto_model_at(staged, "modeling_extra.LMKModel")
    with pytest.raises(push.PushError) as caught:
        push.validate(staged, lmk_copy)
    assert "in a clean process" in str(caught.value).splitlines()[0] and "lmk_embed" in str(caught.value).splitlines()[0]


def test_staged_code_must_equal_the_shipped_files(lmk_copy, tmp_path):
    staged = push.stage(lmk_copy, tmp_path / "staged").folder
    (staged / "encoding.py").write_text((staged / "encoding.py").read_text() + "\n# edited\n")
    with pytest.raises(push.PushError, match=r"encoding\.py differs from the shipped"):
        push.validate(staged, lmk_copy)
    shutil.copyfile(push.Path(lmk_embed.__file__).parent / "encoding.py", staged / "encoding.py")
    modules = json.loads((staged / "modules.json").read_text())
    modules[0]["type"] = "st_missing.EmbedderModule"
    (staged / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(push.PushError, match=r"modules\.json type 'st_missing\.EmbedderModule' needs st_missing\.py"):
        push.validate(staged, lmk_copy)


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("pytorch_model.bin", b"weights", "pickled weights"),
        ("extra/optimizer.pt", b"state", "pickled weights"),
        (".env", b"SECRET=1", "environment files"),
        ("notes.md", b"token: hf_" + b"a1B2c3D4e5" * 4, "looks like a Hugging Face token"),
        ("deploy.txt", b"-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n", "private key"),
        ("big.json", b"0" * (2 * 2**20), "over --max-file-mb=1"),
    ],
)
def test_stage_refusals(lmk_copy, tmp_path, name, content, reason, capsys):
    (lmk_copy / name).parent.mkdir(parents=True, exist_ok=True)
    (lmk_copy / name).write_bytes(content)
    with pytest.raises(push.PushError, match=re.escape(reason)):
        push.stage(lmk_copy, tmp_path / "staged", max_file_mb=1)
    assert push.main([str(lmk_copy), "our-org/x", "--max-file-mb", "1", "--stage-dir", str(tmp_path / "s2")]) == 1
    assert reason in capsys.readouterr().err


def test_large_weights_are_fine_and_adapters_are_refused(lmk_copy, tmp_path):
    weights = (lmk_copy / "model.safetensors").stat().st_size / 2**20
    assert weights > 1
    report = push.stage(lmk_copy, tmp_path / "staged", max_file_mb=1)  # weights are exempt from the size limit
    assert "model.safetensors" in report.files
    (lmk_copy / "adapter_config.json").write_text("{}")
    with pytest.raises(push.PushError, match="LoRA adapter"):
        push.stage(lmk_copy, tmp_path / "staged")


def test_stale_shipped_code_is_replaced_by_the_current_source(lmk_copy, tmp_path):
    stale = lmk_copy / "modeling_lmk.py"
    stale.write_text(stale.read_text().replace("def masked_mean", "def masked_mean_renamed_long_ago"))
    (lmk_copy / "encoding.py").unlink()
    report = push.stage(lmk_copy, tmp_path / "staged")
    assert set(report.refreshed_code) == {"modeling_lmk.py", "encoding.py"}
    current = (push.Path(lmk_embed.__file__).parent / "modeling_lmk.py").read_text()
    assert (report.folder / "modeling_lmk.py").read_text() == current
    assert max(push.validate(report.folder, lmk_copy).values()) <= 1e-5


def test_validation_failure_stops_the_push(lmk_copy, tmp_path):
    report = push.stage(lmk_copy, tmp_path / "staged")
    (report.folder / "README.md").write_text("---\nmodel-index: [{results: [{task: 3}]}]\n---\nbroken\n")
    with pytest.raises(push.PushError, match="validation failed"):
        push.validate(report.folder, lmk_copy)


# ---- dry run and upload -------------------------------------------------------------------------


def test_dry_run_uploads_nothing(lmk_copy, tmp_path, capsys):
    api = RecordingHfApi()
    code = push.main([str(lmk_copy), "our-org/tiny-lmk", "--dry-run", "--stage-dir", str(tmp_path / "staged")], api=api)
    out = capsys.readouterr().out
    assert code == 0 and api.calls == []
    assert "Dry run: would upload to our-org/tiny-lmk@main" in out
    size = (tmp_path / "staged" / "model.safetensors").stat().st_size
    assert re.search(rf"{size:,d}\s+model.safetensors", out)


def test_a_dry_run_without_stage_dir_leaves_no_staging_folder(lmk_copy, tmp_path, monkeypatch):
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert push.main([str(lmk_copy), "our-org/tiny-lmk", "--dry-run"], api=RecordingHfApi()) == 0
    assert list((tmp_path / "tmp").iterdir()) == []


def test_upload_calls(lmk_copy, tmp_path):
    api = RecordingHfApi()
    code = push.main([str(lmk_copy), "our-org/tiny-lmk", "--private", "--revision", "v1-branch", "--tag", "v1.0",
                      "--commit-message", "First release", "--stage-dir", str(tmp_path / "staged")], api=api)
    assert code == 0
    names = [call[0] for call in api.calls]
    assert names == ["create_repo", "create_branch", "upload_folder", "create_tag"]
    assert api.calls[0] == ("create_repo", "our-org/tiny-lmk", {"repo_type": "model", "private": True, "exist_ok": True})
    assert api.calls[1][2] == {"branch": "v1-branch", "repo_type": "model", "exist_ok": True}
    upload = api.calls[2][2]
    assert upload["repo_id"] == "our-org/tiny-lmk" and upload["revision"] == "v1-branch"
    assert upload["commit_message"] == "First release" and upload["folder_path"] == str(tmp_path / "staged")
    assert {"README.md", "model.safetensors", "config.json", "modules.json", "st_module.py", "modeling_lmk.py",
            "ndcg_vs_max_length.png", "eval_results.json"} <= set(upload["files"])
    assert not any(name.endswith((".bin", ".pt")) for name in upload["files"])
    assert upload["delete_patterns"] == ["*"]
    assert api.calls[3] == ("create_tag", "our-org/tiny-lmk", {"tag": "v1.0", "revision": "v1-branch",
                                                                "repo_type": "model", "exist_ok": True})


def test_second_push_leaves_no_stale_files(lmk_copy, tmp_path):
    """A remote left with an old single weight file and a stale adapter must mirror the new staged folder."""
    staged = push.stage(lmk_copy, tmp_path / "staged").folder
    stale = {"model-00001-of-00002.safetensors": b"old shard", "adapter_config.json": b"{}",
             "adapter_model.safetensors": b"old adapter", "1_Normalize/config.json": b"{}"}
    api = RecordingHfApi(remote=stale)
    push.upload(staged, "our-org/tiny-lmk", api=api)
    local = {str(p.relative_to(staged)): p.read_bytes() for p in staged.rglob("*") if p.is_file()}
    assert api.remote == local


def test_stage_dir_overlapping_the_checkpoint_is_refused(lmk_copy):
    """Staging empties its folder first: pointing it at the checkpoint (or a folder holding it) must not delete it."""
    for stage_dir in (lmk_copy, lmk_copy.parent, lmk_copy / "staged"):
        with pytest.raises(push.PushError, match="overlaps the checkpoint"):
            push.stage(lmk_copy, stage_dir)
    assert (lmk_copy / "model.safetensors").is_file()


def test_token_never_comes_from_a_flag():
    options = {action.dest for action in push.build_parser()._actions}
    assert not {"token", "hf_token"} & options


# ---- cards ------------------------------------------------------------------------------------------


def test_card_metadata_round_trip(lmk_copy):
    card = check_card(lmk_copy / "README.md")
    data = card.data
    assert data.library_name == "sentence-transformers" and data.pipeline_tag == "sentence-similarity"
    assert {"sentence-transformers", "landmark-pooling", "custom_code"} <= set(data.tags)
    assert data.license == "apache-2.0" and data.language == ["en"]
    result = data.eval_results[0]
    assert (result.metric_type, result.metric_value, result.dataset_name) == ("ndcg_at_10", 0.6123, RESULTS[0]["dataset"])
    assert str(ModelCard.load(lmk_copy / "README.md")) == str(card)
    headings = re.findall(r"^## (.+)$", card.text, re.M)
    assert headings == ["Model details", "Usage", "Training", "Evaluation", "Limitations", "Citation"]
    assert "![nDCG@10 against max length](ndcg_vs_max_length.png)" in card.text
    assert (lmk_copy / "ndcg_vs_max_length.png").read_bytes()[:4] == b"\x89PNG"
    assert "arXiv:2601.21525" in card.text and "passkey" in card.text
    assert "Doshi, Meet and Trivedi, Aashka" in card.text and "Joshi, Sachindra" in card.text
    assert "others" not in card.text.split("## Citation")[1]


SPLIT_RESULTS = [  # as demo.py records them: one dataset type for every split, two metrics each
    {"dataset": split, "dataset_type": "python-package-docs", "split": "test", "metric": metric, "value": value, "max_length": 512}
    for split, values in [("stdlib held-out modules (in-domain)", (0.8123, 0.7011)),
                          ("scientific (out-of-domain)", (0.9029, 0.8342)),
                          ("symbolic (out-of-domain)", (0.9270, 0.8710))]
    for metric, value in zip(("ndcg_at_10", "recall_at_1"), values)
]


def test_model_index_files_each_split_under_its_own_dataset(lmk_copy):
    rows = SPLIT_RESULTS + [dict(SPLIT_RESULTS[2], value=0.8811, max_length=256)]  # one split at a second length
    record_results(lmk_copy, rows)
    write_card(lmk_copy)
    results = ModelCard.load(lmk_copy / "README.md").data.eval_results
    found = sorted((r.dataset_name, r.metric_type, r.metric_value, r.metric_args["max_length"]) for r in results)
    recorded = json.loads((lmk_copy / "eval_results.json").read_text())["results"]
    assert found == sorted((r["dataset"], r["metric"], r["value"], r["max_length"]) for r in recorded)
    by_dataset = {}
    for result in results:
        by_dataset.setdefault(result.dataset_name, set()).add(result.dataset_type)
    assert all(len(kinds) == 1 for kinds in by_dataset.values())
    assert len({kind for kinds in by_dataset.values() for kind in kinds}) == 3  # three datasets, three types
    scores = {(r.dataset_name, r.metric_type, r.metric_args["max_length"]): r.metric_value for r in results}
    assert scores[("scientific (out-of-domain)", "ndcg_at_10", 512)] == 0.9029
    assert scores[("symbolic (out-of-domain)", "ndcg_at_10", 512)] == 0.9270
    assert scores[("scientific (out-of-domain)", "ndcg_at_10", 256)] == 0.8811
    assert scores[("stdlib held-out modules (in-domain)", "ndcg_at_10", 512)] == 0.8123
    check_card(lmk_copy / "README.md")


def test_a_card_that_disagrees_with_its_results_file_is_refused(lmk_copy):
    record_results(lmk_copy, SPLIT_RESULTS)
    write_card(lmk_copy)
    record_results(lmk_copy, [dict(row, value=0.5) if row["dataset"].startswith("symbolic") else row for row in SPLIT_RESULTS])
    with pytest.raises(ValueError, match="model-index does not match eval_results.json"):
        check_card(lmk_copy / "README.md")
    write_card(lmk_copy)
    check_card(lmk_copy / "README.md")


def test_recurrent_card(recurrent_copy):
    card = check_card(recurrent_copy / "README.md")
    assert "mamba2" in card.data.tags and card.data.eval_results is None
    assert "arXiv:2604.18199" in card.text and "No evaluation results are recorded" in card.text
    assert "Grantner, Tobias and Sallinger, Emanuel and Flechl, Martin" in card.text


def test_card_refreshes_when_results_change(lmk_copy):
    record_results(lmk_copy, [dict(RESULTS[0], value=0.7)])
    write_card(lmk_copy)
    assert check_card(lmk_copy / "README.md").data.eval_results[0].metric_value == 0.7


def test_invalid_metadata_is_rejected(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("---\nlibrary_name: transformers\npipeline_tag: fill-mask\nlicense: mit\ntags: [x]\n---\n# x\n")
    with pytest.raises(ValueError, match="library_name"):
        check_card(path)


def test_card_with_training_run(lmk_copy):
    from lmk_embed_tools.training import TrainConfig

    TrainConfig(model="x", output_dir="y", finetune="lora", max_steps=150, splitter="variable",
                granularities=[16, 32]).to_yaml(lmk_copy / "run_config.yaml")
    text = build_card(lmk_copy).text
    assert "| Fine-tuning | lora (r=16, alpha=16" in text and "| Steps | 150 |" in text
    assert "Splitter while training | `variable` over [16, 32]" in text


@pytest.mark.slow
@pytest.mark.parametrize("which", ["lmk_copy", "recurrent_copy"])
def test_card_snippets_run(which, request, tmp_path):
    folder = request.getfixturevalue(which)
    text = (folder / "README.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", text, re.S)
    # The serving snippet needs a running server: tests/lmk_embed_tools/serve runs that client.
    snippets = [snippet for snippet in snippets if "base_url=" not in snippet]
    assert len(snippets) == 3
    codes = [re.sub(r'model_id = ".*?"', f"model_id = {str(folder)!r}", snippet) for snippet in snippets]
    assert all(code != snippet for code, snippet in zip(codes, snippets))
    # One fresh process; each snippet runs in a namespace of its own, as if pasted alone.
    driver = (f"import json\nsnippets = json.loads({json.dumps(json.dumps(codes))})\n"
              "for number, code in enumerate(snippets):\n"
              "    exec(compile(code, f'<card snippet {number}>', 'exec'), {'__name__': '__main__'})\n"
              "print(json.dumps({'ran': len(snippets)}))\n")
    report = run_fresh_python(driver, cwd=tmp_path, env_extra={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert report == {"ran": 3}


def test_card_shows_the_base_row_beside_its_own(lmk_copy):
    baselines = [{"model": "base MiniLM (mean)", "dataset": "scientific (out-of-domain)", "metric": "ndcg_at_10",
                  "value": 0.8901, "max_length": 256}]
    record_results(lmk_copy, baselines=baselines)
    text = build_card(lmk_copy).text
    assert "| base MiniLM (mean) | scientific (out-of-domain) | ndcg_at_10 | 0.8901 | 256 |" in text
    assert "0.6123" in text  # its own results are kept


def test_card_plots_can_be_drawn_from_threads(tmp_path):
    # demo.py writes two cards at once; unguarded, matplotlib's shared mathtext parser failed on the
    # log-axis tick labels in every trial of this test.
    from concurrent.futures import ThreadPoolExecutor

    from lmk_embed_tools.model_cards import generator

    curve = {"dataset": "toy", "metric": "ndcg_at_10", "points": {"128": 0.5, "256": 0.6, "512": 0.7}}
    panels = [curve, {**curve, "dataset": "other", "baselines": {"base": {"128": 0.4, "512": 0.45}}}]
    folders = [tmp_path / str(i) for i in range(8)]
    for folder in folders:
        folder.mkdir()
    with ThreadPoolExecutor(4) as pool:  # one curve (a dict) and a list of panels with baselines alike
        drawn = pool.map(lambda i: generator._plot(folders[i], generator._curves(curve if i % 2 else panels)), range(8))
        assert list(drawn) == [generator.PLOT_FILE] * 8
    assert all((folder / generator.PLOT_FILE).stat().st_size > 1000 for folder in folders)


# ---- the card must describe what is pushed --------------------------------------------------------


def _train_on(folder):
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    first = sorted(tensors)[0]
    tensors[first] = tensors[first] * 1.01
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_a_card_without_its_results_file_is_refused(lmk_copy, tmp_path):
    (lmk_copy / "eval_results.json").unlink()  # the card still shows its figures
    with pytest.raises(push.PushError, match="the card reports results but the checkpoint has no eval_results.json"):
        push.validate(push.stage(lmk_copy, tmp_path / "staged").folder, lmk_copy, repo_id="our-org/tiny-lmk")


def test_a_card_of_other_weights_is_refused_and_not_rewritten_from_stale_results(lmk_copy, tmp_path):
    _train_on(lmk_copy)
    with pytest.raises(push.PushError, match="the card was written for other weights"):
        push.validate(push.stage(lmk_copy, tmp_path / "staged").folder, lmk_copy, repo_id="our-org/tiny-lmk")
    with pytest.raises(ValueError, match="holds results of other weights"):
        write_card(lmk_copy, model_id="our-org/tiny-lmk")
    (lmk_copy / "eval_results.json").unlink()
    write_card(lmk_copy, model_id="our-org/tiny-lmk")
    assert "0.6123" not in (lmk_copy / "README.md").read_text()
    push.validate(push.stage(lmk_copy, tmp_path / "staged-2").folder, lmk_copy, repo_id="our-org/tiny-lmk")


def test_the_card_must_name_the_repository_pushed_to(lmk_copy, tmp_path, capsys):
    from lmk_embed_tools import cli

    stage_dir = str(tmp_path / "staged")
    assert push.main([str(lmk_copy), "our-org/other-name", "--dry-run", "--stage-dir", stage_dir]) == 1
    assert "the card's snippets load ['our-org/tiny-lmk'], not 'our-org/other-name'" in capsys.readouterr().err
    write_card(lmk_copy)  # no --model-id: the placeholder
    assert push.main([str(lmk_copy), "our-org/tiny-lmk", "--dry-run", "--stage-dir", stage_dir]) == 1
    assert "the placeholder" in capsys.readouterr().err
    for bad in ("no slash", "a/b/c", "org/"):
        assert cli.main(["card", str(lmk_copy), "--model-id", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "`model_id` must look like org/name" in err and "Traceback" not in err
