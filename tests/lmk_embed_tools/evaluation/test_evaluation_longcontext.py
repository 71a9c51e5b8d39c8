"""Long-context evaluation: synthetic generators, metrics, the corpus cache, retrievers, analyses, CLI."""

import json
import re

import numpy as np
import pytest

from lmk_embed_tools.evaluation.analyses import attention_by_position, binned_attention, landmark_locality, locality_hits
from lmk_embed_tools.evaluation.cache import EmbeddingCache
from lmk_embed_tools.evaluation.longcontext import evaluate_jobs
from lmk_embed_tools.evaluation.metrics import score_run
from lmk_embed_tools.evaluation.retrievers import BM25Retriever, DenseRetriever, late_interaction_scores
from lmk_embed_tools.evaluation.synthetic import NEEDLES, haystack_sentences, needle_task, passkey_task, token_counter
from lmk_embed_tools.retrieval_data import RetrievalData
from tests import helpers


@pytest.fixture(scope="module")
def count_tokens(minilm_path):
    return token_counter(minilm_path)


@pytest.fixture(scope="module")
def haystack():
    import pydoc

    import collections
    import json as json_module
    import textwrap

    return haystack_sentences([pydoc.render_doc(m, renderer=pydoc.plaintext) for m in (json_module, textwrap, collections)])


# ---- generators ---------------------------------------------------------------------------------------


def _person(query: str) -> str:
    return re.search(r"([A-Z][a-z]+ [A-Z][a-z]+)", query).group(1)


@pytest.mark.parametrize("length", [256, 2048])
def test_passkey_documents_hold_the_key_at_the_asked_depth_and_the_query_names_the_person(count_tokens, length):
    task = passkey_task(length, count_tokens, seed=3, num_documents=20, num_queries=10)
    assert len(task.documents) == 20 and len(task.queries) == 10
    for query_id, query in task.queries.items():
        (doc_id,) = task.relevant[query_id]
        text, fact, person = task.documents[doc_id], task.facts[doc_id], _person(query)
        assert query == f"what is the passkey for {person}?"
        key = re.search(r"pass key is (\d+)\.", fact).group(1)
        assert 4 <= len(key) <= 5 and f"{person}'s pass key is {key}." in text
        assert sum(person in other for other in task.documents.values()) == 1  # one right answer
        assert abs(text.index(fact) / len(text) - task.depths[doc_id]) < 0.1
    counts = count_tokens(list(task.documents.values()))
    assert all(abs(n - length) <= 0.05 * length for n in counts), counts
    assert sorted(task.depths.values())[0] < 0.1 and sorted(task.depths.values())[-1] > 0.9  # depths are varied


def test_generators_are_deterministic_per_seed(count_tokens, haystack):
    assert passkey_task(256, count_tokens, seed=1).documents == passkey_task(256, count_tokens, seed=1).documents
    assert passkey_task(256, count_tokens, seed=1).documents != passkey_task(256, count_tokens, seed=2).documents
    first = needle_task(512, count_tokens, haystack, seed=1, num_documents=10, num_queries=5)
    again = needle_task(512, count_tokens, haystack, seed=1, num_documents=10, num_queries=5)
    assert (first.documents, first.queries) == (again.documents, again.queries)


@pytest.mark.parametrize("length", [256, 4096])
def test_needle_documents_hold_their_fact_in_prose_and_lengths_are_met(count_tokens, haystack, length):
    assert len(set(NEEDLES)) >= 20
    task = needle_task(length, count_tokens, haystack, seed=0, num_documents=30, num_queries=15)
    for query_id, query in task.queries.items():
        (doc_id,) = task.relevant[query_id]
        assert task.facts[doc_id] in task.documents[doc_id]
        assert sum(_person(query) in text for text in task.documents.values()) == 1
    assert len(set(task.queries.values())) == 15
    counts = count_tokens(list(task.documents.values()))
    assert all(abs(n - length) <= 0.05 * length for n in counts), counts
    assert all(sentence in haystack for sentence in haystack[:3]) and len(haystack) > 50


# ---- metrics ------------------------------------------------------------------------------------------


def test_metrics_are_mtebs_and_pytrec_evals_on_hand_made_qrels():
    import pytrec_eval

    relevant = {"q1": {"d1": 1}, "q2": {"d2": 1}}
    run = {"q1": {"d1": 0.9, "d2": 0.5, "d3": 0.1}, "q2": {"d1": 0.9, "d3": 0.8, "d2": 0.7}}  # d2 third for q2
    scores = score_run(run, relevant)
    assert scores["ndcg_at_1"] == pytest.approx(0.5)
    assert scores["recall_at_1"] == pytest.approx(0.5) and scores["recall_at_10"] == pytest.approx(1.0)
    assert scores["mrr_at_10"] == pytest.approx((1 + 1 / 3) / 2)
    assert scores["ndcg_at_10"] == pytest.approx((1 + 1 / np.log2(4)) / 2)
    reference = pytrec_eval.RelevanceEvaluator(relevant, {"ndcg_cut.1,10", "recall.1,10"}).evaluate(run)
    for ours, theirs in [("ndcg_at_1", "ndcg_cut_1"), ("ndcg_at_10", "ndcg_cut_10"), ("recall_at_10", "recall_10")]:
        assert scores[ours] == pytest.approx(np.mean([reference[q][theirs] for q in relevant]), abs=1e-5)


def test_runner_gives_the_numbers_of_a_full_mteb_run(minilm_path):
    """The untouched MiniLM as a plain SentenceTransformer (a tiny random model ties every score)."""
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.evaluation import evaluate_retrieval

    model = SentenceTransformer(str(minilm_path), device="cpu")
    texts = helpers.stdlib_texts(24)
    documents = {f"d{i}": t for i, t in enumerate(texts)}
    queries = {f"q{i}": " ".join(t.split()[:6]) for i, t in enumerate(texts) if i % 2 == 0}
    relevant = {f"q{i}": {f"d{i}": 1} for i in range(0, len(texts), 2)}
    model.max_seq_length = 64
    full = evaluate_retrieval(model, queries, documents, relevant)
    (row,) = evaluate_jobs([DenseRetriever(model, "base", progress=False)],
                           [("stdlib", 64, RetrievalData("stdlib", queries, documents, relevant))], progress=False)
    for metric in ("ndcg_at_1", "ndcg_at_10", "recall_at_10", "mrr_at_10"):
        assert row[metric] == pytest.approx(full[metric], abs=1e-4), metric


# ---- retrievers and cache -----------------------------------------------------------------------------


def test_bm25_finds_the_passkey_document(count_tokens):
    task = passkey_task(512, count_tokens, num_documents=30, num_queries=15)
    (row,) = evaluate_jobs([BM25Retriever()], [("passkey", 512, task)], progress=False)
    assert row["ndcg_at_1"] == 1.0 and row["effective_max_length"] is None


def test_cache_hit_returns_the_same_vectors_and_a_changed_setting_or_document_misses(lmk_model, tmp_path):
    documents = {f"d{i}": t for i, t in enumerate(helpers.stdlib_texts(6))}
    cache = EmbeddingCache(tmp_path)
    retriever = DenseRetriever(lmk_model, "tiny", progress=False)
    first = retriever.corpus_vectors(documents, 64, cache)
    again = retriever.corpus_vectors(documents, 64, cache)
    assert (cache.hits, cache.misses) == (1, 1) and np.array_equal(first, again)
    fresh = lmk_model.encode_document(list(documents.values()), max_length=64)
    assert np.allclose(again, fresh / np.linalg.norm(fresh, axis=1, keepdims=True), atol=1e-6)
    retriever.corpus_vectors(documents, 32, cache)  # another max length
    DenseRetriever(lmk_model, "tiny", progress=False, granularity=4).corpus_vectors(documents, 64, cache)
    retriever.corpus_vectors({**documents, "d0": documents["d0"] + " changed"}, 64, cache)
    assert (cache.hits, cache.misses) == (1, 4)


def test_a_config_edit_misses_the_cache(lmk_checkpoint, tmp_path):
    from lmk_embed import LMKModel

    documents = {f"d{i}": t for i, t in enumerate(helpers.stdlib_texts(6))}
    cache = EmbeddingCache(tmp_path)
    model = LMKModel.from_pretrained(lmk_checkpoint).eval()
    before = DenseRetriever(model, "tiny", progress=False).corpus_vectors(documents, 64, cache)
    model.config.granularity = 4  # the same weights, another default (an edited config.json)
    after = DenseRetriever(model, "tiny", progress=False).corpus_vectors(documents, 64, cache)
    assert (cache.hits, cache.misses) == (0, 2) and not np.allclose(before, after)


def test_max_over_landmarks_beats_mean_pooling_on_a_single_relevant_sentence():
    e = np.eye(4, dtype=np.float32)
    query = e[:1]
    needle_doc = e.copy()  # one landmark is the answer, three are unrelated
    diffuse_doc = np.tile(0.8 * e[0] + 0.6 * e[1], (4, 1))  # every landmark half-relevant
    landmarks = [needle_doc, diffuse_doc]
    max_scores = late_interaction_scores(query, landmarks, "max")[0]
    mean_scores = late_interaction_scores(query, landmarks, "mean")[0]
    assert max_scores.argmax() == 0 and mean_scores.argmax() == 1
    assert max_scores == pytest.approx([1.0, 0.8]) and mean_scores == pytest.approx([0.5, 0.8])
    hybrid = late_interaction_scores(query, landmarks, "hybrid", alpha=0.5)[0]
    assert hybrid == pytest.approx([0.75, 0.8])


# ---- analyses -----------------------------------------------------------------------------------------


def test_binned_attention_on_a_constructed_matrix():
    attention = torch_tensor([[0.5, 0.25, 0.25, 0.0], [0.1, 0.2, 0.3, 0.4], [1, 0, 0, 0], [0, 0, 0, 1]])
    mask = torch_tensor([[1, 1, 1, 1]])
    pooled = torch_tensor([[0, 1, 0, 1]])
    (mass,) = binned_attention(attention[None, None], mask, pooled, bins=2)
    assert np.allclose(mass, [[0.3, 0.7], [0.0, 1.0]])


def torch_tensor(values):
    import torch

    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize("pooling", ["lmk", "cls"])
def test_attention_mass_of_each_pooled_token_sums_to_one(lmk_model, pooling):
    texts = helpers.stdlib_texts(4)
    result = attention_by_position(lmk_model, texts, max_length=96, bins=8, pooling=pooling)
    assert np.allclose(result["row_sums"], 1.0, atol=1e-4)
    assert sum(result["mass"]) == pytest.approx(1.0, abs=1e-4)
    layout = lmk_model.tokenizer(texts, pooling=pooling, max_length=96)
    assert len(result["row_sums"]) == sum(sum(m) for m in layout["landmark_mask"])  # every pooled token, no other


def test_locality_hits_on_a_constructed_case():
    rng = np.random.default_rng(0)
    chunks = rng.normal(size=(6, 16))
    left = locality_hits(chunks + 0.01 * rng.normal(size=chunks.shape), chunks, k_values=(1,))
    assert all(left["left"][1]) and not any(left["right"][1]) and all(left["either"][1])
    right = locality_hits(np.roll(chunks, -1, axis=0), chunks, k_values=(1, 6))  # landmark i looks like chunk i+1
    assert all(right["right"][1]) and not any(right["left"][1]) and len(right["right"][1]) == 5
    assert all(right["left"][6])  # k = n: everything is a hit


def test_landmark_locality_runs_on_a_tiny_model(lmk_model):
    result = landmark_locality(lmk_model, helpers.stdlib_texts(3), k_values=(1, 2), max_length=64)
    assert result["landmarks"] > 3
    for side in ("left", "right", "either"):
        assert 0.0 <= result["hits"][side]["1"] <= result["hits"][side]["2"] <= 1.0
    assert result["hits"]["either"]["1"] >= result["hits"]["left"]["1"]


# ---- the commands -------------------------------------------------------------------------------------


@pytest.fixture()
def small_pages(monkeypatch):
    """The stdlib corpus, cut to three pages (rendering all of them takes seconds)."""
    from lmk_embed_tools import evaluation_jobs
    from lmk_embed_tools.training.stdlib_corpus import ModulePage

    pages = [ModulePage(f"m{i}", " ".join(text.split()[:5]), text) for i, text in
             enumerate(["\n".join(helpers.stdlib_texts(60)[i::3]) for i in range(3)])]
    monkeypatch.setattr(evaluation_jobs, "stdlib_pages", lambda: pages)


def test_evaluate_command_writes_json_table_plots_and_card_records(lmk_checkpoint, tmp_path, small_pages):
    import shutil

    from lmk_embed_tools import cli
    out, checkpoint = tmp_path / "out", shutil.copytree(lmk_checkpoint, tmp_path / lmk_checkpoint.name)
    status = cli.main([
        "evaluate", str(checkpoint), "bm25", "--task", "passkey", "needle", "stdlib", "--max-lengths", "64", "128",
        "--queries", "4", "--documents", "8", "--multi-vector", "--out", str(out), "--record",
    ])
    assert status == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    models = {r["model"] for r in rows}
    assert models == {lmk_checkpoint.name, f"{lmk_checkpoint.name} multi-vector max",
                      f"{lmk_checkpoint.name} multi-vector hybrid", "BM25"}
    assert {(r["split"], r["max_length"]) for r in rows} == {(t, n) for t in ("passkey", "needle", "stdlib") for n in (64, 128)}
    assert all(r["vectors_per_document"] > 1 for r in rows if "multi-vector" in r["model"])
    assert (out / "results_ndcg_at_1.png").stat().st_size > 0 and "mean" in (out / "results.txt").read_text()
    assert any((out / "cache").glob("*.npz"))
    recorded = json.loads((checkpoint / "eval_results.json").read_text())
    assert len(recorded["results"]) == 6 and {b["model"] for b in recorded["baselines"]} >= {"BM25"}
    # A length curve per task, the other rows beside it, for the card's plot.
    curves = {curve["dataset"]: curve for curve in recorded["extrapolation"]}
    assert set(curves) == {"passkey", "needle", "stdlib"}
    own = {(r["split"], str(r["max_length"])): r["ndcg_at_10"] for r in rows if r["model"] == lmk_checkpoint.name}
    assert all(curve["points"] == {n: own[(task, n)] for n in ("64", "128")} for task, curve in curves.items())
    assert "BM25" in curves["passkey"]["baselines"] and lmk_checkpoint.name not in curves["passkey"]["baselines"]
    from lmk_embed_tools.model_cards import check_card, generator, write_card

    card = write_card(checkpoint)
    check_card(card)
    assert (checkpoint / generator.PLOT_FILE).stat().st_size > 1000
    assert "nDCG@10 against the maximum input length: passkey, needle, stdlib" in card.read_text()


def test_evaluate_compare_gives_paired_intervals_from_per_query_scores(lmk_checkpoint, tmp_path, small_pages, capsys):
    from lmk_embed_tools import cli
    from lmk_embed_tools.evaluation.table import paired_bootstrap

    out, name = tmp_path / "out", lmk_checkpoint.name
    argv = ["evaluate", str(lmk_checkpoint), "bm25", "--task", "stdlib", "--max-lengths", "64", "128", "--out", str(out),
            "--compare", f"{name}@128", "BM25@64", "--compare", f"{name}@128", f"{name}@64"]
    assert cli.main(argv) == 0
    report = json.loads((out / "results.json").read_text())
    rows = {(r["model"], r["max_length"]): r for r in report["rows"]}
    for row in rows.values():  # each query scored alone by mteb's scorer: their mean is the split's score
        for metric in ("ndcg_at_10", "ndcg_at_1"):
            assert abs(np.mean(list(row["per_query"][metric].values())) - row[metric]) < 1e-4
    first, second = report["comparisons"]
    assert (first["task"], first["row"], first["rival"]) == ("stdlib", f"{name}@128", "BM25@64")
    mine, theirs = rows[(name, 128)]["per_query"]["ndcg_at_10"], rows[("BM25", 64)]["per_query"]["ndcg_at_10"]
    queries = sorted(mine)
    expected = paired_bootstrap([mine[q] for q in queries], [theirs[q] for q in queries])
    assert (first["difference"], first["low"], first["high"]) == pytest.approx(expected)
    assert first["low"] <= first["difference"] <= first["high"] and second["rival"] == f"{name}@64"
    assert f"stdlib: {name}@128 - BM25@64: nDCG@10 {expected[0]:+.3f}" in capsys.readouterr().out
    for bad, named in [(f"{name}@100", "--max-lengths"), ("nobody@64", "not a row"), (name, "NAME@LENGTH")]:
        assert cli.main([*argv[:-3], "--compare", bad, "BM25@64"]) == 2
        assert named in capsys.readouterr().err


def test_a_pair_on_two_tasks_is_also_compared_over_both_tasks_queries():
    from lmk_embed_tools.evaluation.longcontext import POOLED, paired_comparisons
    from lmk_embed_tools.evaluation.table import paired_bootstrap

    rng = np.random.default_rng(0)

    def row(model, length, split, queries):
        scores = {q: float(v) for q, v in zip(queries, rng.random(len(queries)))}
        return {"model": model, "max_length": length, "split": split, "per_query": {"ndcg_at_10": scores}}

    first, second = [f"a{i}" for i in range(7)], [f"b{i}" for i in range(5)]
    rows = [row(m, n, split, qs) for split, qs in (("one", first), ("two", second)) for m, n in (("x", 64), ("y", 32))]
    rows.append(row("x", 128, "one", first))  # on one task only (and asked twice): no pooled entry for it
    found = paired_comparisons(rows, [(("x", 64), ("y", 32)), (("x", 128), ("y", 32)), (("x", 128), ("y", 32))])
    per_task = [c for c in found if c["task"] != POOLED]
    (pooled,) = [c for c in found if c["task"] == POOLED]
    assert [(c["task"], c["row"]) for c in per_task] == [("one", "x@64"), ("one", "x@128"), ("two", "x@64")]
    assert (pooled["row"], pooled["rival"], pooled["tasks"], pooled["queries"]) == ("x@64", "y@32", ["one", "two"], 12)
    by = {(r["model"], r["split"]): r["per_query"]["ndcg_at_10"] for r in rows if r["max_length"] != 128}
    mine = [by["x", t][q] for t, qs in (("one", first), ("two", second)) for q in sorted(qs)]
    theirs = [by["y", t][q] for t, qs in (("one", first), ("two", second)) for q in sorted(qs)]
    assert pooled["difference"] == pytest.approx(np.mean(np.subtract(mine, theirs)))
    assert (pooled["low"], pooled["high"]) == pytest.approx(paired_bootstrap(mine, theirs)[1:])


def test_evaluate_reads_a_beir_folder_and_names_a_bad_task(tmp_path, capsys):
    from lmk_embed_tools import cli
    folder = tmp_path / "tiny-beir"
    (folder / "qrels").mkdir(parents=True)
    docs = {"a": "zebras graze on the savanna", "b": "compilers translate source code", "c": "tides follow the moon"}
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in docs.items()))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{k}", "text": v.split()[0]}) + "\n" for k, v in docs.items()))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{k}\t{k}\t1\n" for k in docs))
    assert cli.main(["evaluate", "bm25", "--task", str(folder), "--max-lengths", "128", "--out", str(tmp_path / "o")]) == 0
    (row,) = json.loads((tmp_path / "o" / "results.json").read_text())["rows"]
    assert row["split"] == "tiny-beir" and row["ndcg_at_1"] == 1.0
    assert cli.main(["evaluate", "bm25", "--task", "no-such-task", "--out", str(tmp_path / "o")]) == 2
    assert "no-such-task" in capsys.readouterr().err


@pytest.mark.parametrize("analysis", ["attention", "locality"])
def test_analyze_commands_write_png_and_json(lmk_checkpoint, tmp_path, small_pages, analysis):
    from lmk_embed_tools import cli
    out = tmp_path / analysis
    extra = ["--pooling", "lmk", "cls"] if analysis == "attention" else ["--k", "1", "3"]
    assert cli.main(["analyze", analysis, str(lmk_checkpoint), "--max-length", "96", "--texts", "2", "--out", str(out), *extra]) == 0
    result = json.loads((out / f"{analysis}.json").read_text())
    assert len(result) == (2 if analysis == "attention" else 1)
    assert (out / f"{analysis}.png").stat().st_size > 0


def test_evaluate_runs_a_recurrent_checkpoint_with_the_vertical_schedule(mamba2_checkpoint, tmp_path):
    from lmk_embed_tools import cli
    out = tmp_path / "recurrent"
    assert cli.main(["evaluate", str(mamba2_checkpoint), "--task", "passkey", "--max-lengths", "32", "96", "--queries", "2",
                     "--documents", "4", "--schedule", "vertical", "--out", str(out), "--no-cache"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert [(r["max_length"], r["effective_max_length"]) for r in data["rows"]] == [(32, 32), (96, 96)]
    assert data["settings"]["schedule"] == "vertical" and not (out / "cache").exists()
