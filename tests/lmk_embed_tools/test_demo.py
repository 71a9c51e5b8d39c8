"""The demo's command line: arguments that cannot work are refused with a message that names them."""

import pytest

from lmk_embed_tools import demo
def test_rescore_needs_a_positive_number_of_queries(capsys):
    with pytest.raises(SystemExit) as stop:
        demo.main(["rescore", "0"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "QUERIES: must be a positive integer, got 0" in err


def test_rescore_names_the_checkpoints_it_cannot_find(tmp_path):
    (tmp_path / "run-lmk" / "final").mkdir(parents=True)  # a folder without a checkpoint in it
    with pytest.raises(SystemExit, match=r"demo rescore needs the trained checkpoints.*run-lmk/final nor .*run-cls/final"):
        demo.main(["rescore", "50", "--out", str(tmp_path)])


def _row(model, scores, split="symbolic (out-of-domain)"):
    return {"model": model, "split": split, "max_length": 512, "ndcg_at_10": sum(scores.values()) / len(scores),
            "recall_at_1": 0.0, "per_query": {"ndcg_at_10": scores, "recall_at_1": {q: 0.0 for q in scores}}}


def test_compare_prints_the_paired_difference_of_each_trained_row(tmp_path, capsys):
    import json

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps([_row("trained LMK", {"a": 0.5, "b": 0.5, "c": 0.75}), _row("base", {"a": 0.0, "b": 0.0, "c": 0.0})]))
    new.write_text(json.dumps([_row("trained LMK", {"a": 1.0, "b": 1.0, "c": 1.0}), _row("base", {"a": 1.0, "b": 1.0, "c": 1.0})]))
    assert demo.main(["compare", str(new), str(old)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    # the queries gained 0.5, 0.5 and 0.25: no resample's mean lies below 0.25 or above 0.5; the base is not a trained row
    assert lines == ["  trained LMK@512, symbolic (out-of-domain): 1.0000 vs 0.5833; +0.4167, 95% CI +0.2500 to +0.5000"]


def test_compare_refuses_files_it_cannot_pair(tmp_path):
    import json

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    with pytest.raises(SystemExit, match=r"demo compare: the new results file .*new.json does not exist"):
        demo.main(["compare", str(new), str(old)])
    new.write_text(json.dumps([_row("trained LMK", {"a": 1.0, "b": 1.0})]))
    old.write_text(json.dumps([_row("trained CLS", {"a": 1.0, "b": 1.0})]))
    with pytest.raises(SystemExit, match=r"no trained row of .*new.json has a row of the same model"):
        demo.main(["compare", str(new), str(old)])
    old.write_text(json.dumps([_row("trained LMK", {"a": 1.0, "z": 1.0})]))
    with pytest.raises(SystemExit, match=r"scored on different queries"):
        demo.main(["compare", str(new), str(old)])


def test_validate_scores_each_run_on_the_validation_split_against_the_base_and_the_first(tmp_path, lmk_checkpoint,
                                                                                          monkeypatch, capsys):
    import json
    import shutil

    from lmk_embed_tools.training import corpora

    runs = []
    for name in ("recipe", "candidate"):  # the same checkpoint twice: the candidate must differ from the first by 0
        shutil.copytree(lmk_checkpoint, tmp_path / name / "run-lmk" / "final")
        runs.append(str(tmp_path / name))
    pages = {"systems": [corpora.DocItem("systems", "m", f"m.f{k}", kind="function", synopsis=f"summary line number {k}",
                                         text=f"page {k} body " * 30) for k in range(6)]}
    built = []
    monkeypatch.setattr(corpora, "build_corpus", lambda cache_dir: built.append(cache_dir) or pages)
    assert demo.main(["validate", *runs, "--out", str(tmp_path / "validation")]) == 0
    assert built == [tmp_path / "corpora"]
    rows = json.loads((tmp_path / "validation" / "results" / "validation.json").read_text())
    assert [(r["model"], r["max_length"]) for r in rows] == [
        (demo.BASE_ROW, 256), (demo.BASE_ROW, 512), ("trained LMK, recipe", 512), ("trained LMK, candidate", 512)]
    assert {r["split"] for r in rows} == {"systems (validation)"} and all(len(r["per_query"]["ndcg_at_10"]) == 6 for r in rows)
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("  trained LMK, candidate: "))
    assert "against trained LMK, recipe@512" in line and "+0.0000, 95% CI +0.0000 to +0.0000, within noise" in line
    assert next(line for line in out.splitlines() if line.startswith("  trained LMK, recipe: ")).count("against") == 1
    assert "Verdict" not in out  # the demo's verdicts need rows named "trained LMK"; these rows are named by run


def test_validate_names_a_run_without_a_checkpoint(tmp_path):
    (tmp_path / "ablation-x" / "run-lmk" / "final").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"demo validate: .*ablation-x holds no trained LMK checkpoint"):
        demo.main(["validate", str(tmp_path / "ablation-x")])


def test_an_ablation_is_set_against_the_recipes_run_on_the_same_queries_only():
    from lmk_embed_tools.demo import against_recipe

    def row(model, split, scores):
        per_query = {"ndcg_at_10": scores, "recall_at_1": scores}
        return {"model": model, "split": split, "max_length": 512, "ndcg_at_10": sum(scores.values()) / len(scores),
                "recall_at_1": 0.0, "per_query": per_query}

    ablation = [row("trained LMK, x=1 (5 steps)", "a", {"q1": 1.0, "q2": 0.5}),
                row("trained LMK, x=1 (5 steps)", "b", {"q1": 1.0}),
                row("trained LMK, x=1 (5 steps)", "c", {"q1": 1.0})]
    recipe = [row("trained LMK", "a", {"q1": 0.5, "q2": 0.5}), row("trained LMK", "b", {"q9": 1.0}),
              row("trained CLS", "c", {"q1": 0.0})]
    (line,) = against_recipe(ablation, recipe)  # b: other queries; c: no trained LMK row
    assert line.startswith("  a: 0.7500 vs 0.5000; +0.2500")
