"""Fine-tuning: data validation, the LMK per-batch granularity, losses, LoRA/QLoRA, saving, resume, DDP."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.helpers import REPO_ROOT, run_fresh_python
from lmk_embed_tools.training import TrainConfig, train
from lmk_embed_tools.training.data import load_training_rows, stdlib_training_rows, to_training_dataset
from lmk_embed_tools.training.recipe import write_rows as write_jsonl

TOPICS = ["json parsing", "regular expressions", "file paths", "dates and times", "random numbers", "zip archives",
          "http requests", "csv files", "command line arguments", "sorting lists", "hash functions", "sockets",
          "threads", "unit tests", "logging messages", "text wrapping"]


def toy_rows(count=16, negatives=1):
    rows = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        rows.append({
            "query": f"how do I work with {topic}",
            "positive": f"This module is the standard way to handle {topic} in Python programs.",
            "negatives": [f"Unrelated notes about {TOPICS[(i + k + 3) % len(TOPICS)]} and nothing else." for k in range(negatives)],
        })
    return rows


@pytest.fixture
def toy_jsonl(tmp_path):
    return write_jsonl(toy_rows(), tmp_path / "toy.jsonl")


def run_config(checkpoint, tmp_path, **overrides):
    settings = dict(model=str(checkpoint), output_dir=str(tmp_path / "run"), train_data=str(overrides.pop("data")),
                    eval_data=None, per_device_train_batch_size=4, max_steps=4, save_steps=1000, logging_steps=1,
                    learning_rate=1e-3, query_max_length=32, passage_max_length=64)
    settings.update(overrides)
    return TrainConfig(**settings)


# ---- data -----------------------------------------------------------------------------------


def test_empty_rows_are_dropped_and_counted(tmp_path, caplog):
    rows = toy_rows(6)
    rows[1]["query"] = "   "
    rows[2]["positive"] = ""
    rows[3]["negatives"] = ["fine", ""]
    path = write_jsonl(rows, tmp_path / "data.jsonl")
    with caplog.at_level("INFO"):
        kept, report = load_training_rows(path)
    assert report.rows_read == 6 and report.dropped_empty == 3 and report.rows_kept == 3 == len(kept)
    assert "dropped 3 with an empty query/positive/negative" in caplog.text


def test_bad_rows_are_reported_by_line_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(r) for r in toy_rows(3)]
    lines.insert(1, json.dumps({"query": 3, "positive": "p"}))
    lines.append("{not json")
    lines.append(json.dumps({"query": "q", "positive": "p", "negatives": ["n"], "teacher_scores": [1.0]}))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as error:
        load_training_rows(path)
    assert "line 5: not valid JSON" in str(error.value)
    path.write_text("\n".join(lines[:4] + lines[5:]) + "\n")
    with pytest.raises(ValueError) as error:
        load_training_rows(path)
    message = str(error.value)
    assert "2 bad rows" in message and "line 2: `query` must be a string" in message
    assert "line 5: `teacher_scores` has 1 values; expected 1 + 1 negatives" in message


def test_schema_and_empty_sources(tmp_path):
    missing = write_jsonl([{"question": "q", "positive": "p"}], tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match=r"missing required field\(s\) \['query'\]"):
        load_training_rows(missing)
    empty = write_jsonl([{"query": "", "positive": "p"}, {"query": "q", "positive": " "}], tmp_path / "empty.jsonl")
    with pytest.raises(ValueError, match="no valid rows"):
        load_training_rows(empty)
    with pytest.raises(ValueError, match="Unsupported"):
        load_training_rows(tmp_path / "x.txt") if (tmp_path / "x.txt").write_text("x") else None


def test_csv_parquet_and_dataset_sources(tmp_path):
    import datasets

    rows = toy_rows(5, negatives=2)
    frame = {"query": [r["query"] for r in rows], "positive": [r["positive"] for r in rows],
             "negatives": [r["negatives"] for r in rows], "id": list(range(5))}
    dataset = datasets.Dataset.from_dict(frame)
    dataset.to_parquet(str(tmp_path / "d.parquet"))
    csv_frame = dict(frame, negatives=[json.dumps(n) for n in frame["negatives"]])
    datasets.Dataset.from_dict(csv_frame).to_csv(str(tmp_path / "d.csv"), index=False)
    for source in (dataset, tmp_path / "d.parquet", tmp_path / "d.csv"):
        kept, report = load_training_rows(source)
        assert len(kept) == 5 and kept[0]["negatives"] == rows[0]["negatives"] and report.ignored_columns == ["id"]
    bad = datasets.Dataset.from_dict(dict(frame, query=[1.0, 2.0, 3.0, 4.0, 5.0]))  # arrow columns have one type
    with pytest.raises(ValueError, match="5 bad rows:\n  row 1: `query` must be a string"):
        load_training_rows(bad)


def test_negative_counts_and_teacher_scores(tmp_path):
    rows = toy_rows(4, negatives=3)
    for row in rows:
        row["teacher_scores"] = [5.0, 1.0, 0.5, 0.1]
    rows[0]["negatives"], rows[0]["teacher_scores"] = rows[0]["negatives"][:1], [5.0, 1.0]
    kept, report = load_training_rows(write_jsonl(rows, tmp_path / "d.jsonl"))  # each row's own: nothing cut
    assert [len(r["negatives"]) for r in kept] == [1, 3, 3, 3] and report.negatives_cut == 0
    grouped = to_training_dataset(kept)  # a batch never mixes counts: one dataset per count
    assert sorted(grouped) == ["negatives_1", "negatives_3"] and grouped["negatives_3"].num_rows == 3
    assert grouped["negatives_1"].column_names == ["query", "positive", "negative_1", "label"]
    kept, report = load_training_rows(tmp_path / "d.jsonl", num_negatives=1)
    assert all(len(r["negatives"]) == 1 and len(r["teacher_scores"]) == 2 for r in kept) and report.negatives_cut == 3
    kept, report = load_training_rows(tmp_path / "d.jsonl", num_negatives=2)
    assert len(kept) == 3 and report.dropped_few_negatives == 1
    dataset = to_training_dataset(kept)
    assert dataset.column_names == ["query", "positive", "negative_1", "negative_2", "label"]


def test_recurrent_instructions_go_on_queries_only():
    dataset = to_training_dataset(
        [dict(r, teacher_scores=None, task="Find code") for r in toy_rows(2)],
        query_prefix=lambda task: f"Instruct: {task}\nQuery: ",
    )
    assert dataset[0]["query"].startswith("Instruct: Find code\nQuery: how do I")
    assert not dataset[0]["positive"].startswith("Instruct")


def test_stdlib_dataset_is_split_by_module(monkeypatch):
    from lmk_embed_tools.training.data import stdlib_doc_items

    secret = "hf_" + "Zq9" * 12
    monkeypatch.setenv("LMK_EMBED_TEST_SECRET", secret)  # pydoc renders os.environ defaults (cgi, os)
    stdlib_doc_items.cache_clear()
    rows, (queries, corpus, relevant) = stdlib_training_rows(num_negatives=1, max_members_per_module=3)
    texts = [r["positive"] for r in rows] + [n for r in rows for n in r["negatives"]] + list(corpus.values())
    assert not any(secret in text or "LMK_EMBED_TEST_SECRET" in text for text in texts)
    assert not any(" at 0x" in text for text in texts)  # no run-dependent object addresses
    assert len(rows) > 100 and len(queries) > 20
    train_texts = {r["positive"] for r in rows}
    assert not train_texts & set(corpus.values())
    held_modules = {name.split(".")[0] for name in queries}
    assert all(relevant[q] == {q} for q in queries)
    assert all(r["query"] not in r["positive"] for r in rows)
    assert held_modules and len(held_modules) < 60


# ---- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [("lora_r", 0), ("temperature", 0.0), ("finetune", "half"), ("loss", "triplet"), ("warmup_ratio", 1.5),
     ("per_device_train_batch_size", -2), ("granularities", [32, 0]), ("splitter", "paragraph"), ("max_steps", 0),
     ("eval_data", "mteb"), ("dropout", 1.0), ("attention_dropout", -0.1), ("lora_layers", [-1]), ("lora_layers", []),
     ("passage_long_input", "pages"), ("passage_window_length", 256), ("window_distill_weight", 1.0), ("window_teacher", "base"),
     ("window_distill_weight", -1.0), ("landmark_distill_weight", 1.0), ("maxsim_weight", -1.0),
     ("maxsim_weight", True)],
)
def test_bad_config_values_name_the_field(tmp_path, field, value):
    with pytest.raises(ValueError, match=f"`{field}`"):
        TrainConfig(model="x", output_dir=str(tmp_path), **{field: value})


def test_config_file_round_trip_and_unknown_fields(tmp_path):
    config = TrainConfig(model="m", output_dir=str(tmp_path), lora_r=8, granularities=[32, 64])
    path = config.to_yaml(tmp_path / "run.yaml")
    assert TrainConfig.from_yaml(path) == config
    path.write_text(yaml.safe_dump({"model": "m", "output_dir": "o", "lora_rank": 4}))
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['lora_rank'\]"):
        TrainConfig.from_yaml(path)


# ---- training ---------------------------------------------------------------------------------


def test_lora_layers_and_dropout_override(minilm_lmk_checkpoint, tmp_path, toy_jsonl):
    from lmk_embed_tools.training.finetune import load_sentence_transformer, model_family

    family, backbone_type = model_family(str(minilm_lmk_checkpoint))
    config = run_config(minilm_lmk_checkpoint, tmp_path, data=toy_jsonl, lora_layers=[4, 5], dropout=0.0)
    st, embedder = load_sentence_transformer(config, family, backbone_type)
    adapted = {name.split(".layer.")[1].split(".")[0] for name, p in st.named_parameters() if p.requires_grad}
    assert adapted == {"4", "5"}
    assert all(m.p == 0.0 for m in embedder.modules() if isinstance(m, torch.nn.Dropout))

    config = run_config(minilm_lmk_checkpoint, tmp_path, data=toy_jsonl)
    st, embedder = load_sentence_transformer(config, family, backbone_type)  # defaults: every layer, the checkpoint's dropout
    adapted = {name.split(".layer.")[1].split(".")[0] for name, p in st.named_parameters() if p.requires_grad}
    assert adapted == {str(i) for i in range(6)}
    assert {m.p for m in embedder.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}

    # Hidden-state dropout on, attention-probability dropout off: BERT's attention reads `self.dropout.p`.
    config = run_config(minilm_lmk_checkpoint, tmp_path, data=toy_jsonl, dropout=0.2, attention_dropout=0.0)
    st, embedder = load_sentence_transformer(config, family, backbone_type)
    probabilities = {name.rsplit(".", 2)[-2] + "." + name.rsplit(".", 1)[-1]: m.p
                     for name, m in embedder.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert probabilities == {"self.dropout": 0.0, "output.dropout": 0.2, "embeddings.dropout": 0.2}


def test_set_dropout_reaches_a_float_attention_attribute():
    from lmk_embed_tools.training.finetune import set_dropout

    class Attention(torch.nn.Module):  # ModernBERT's layout: a float read at call time, an output Dropout
        def __init__(self):
            super().__init__()
            self.attention_dropout, self.out_drop = 0.1, torch.nn.Dropout(0.1)

    model = torch.nn.Sequential(Attention(), torch.nn.Dropout(0.1))
    set_dropout(model, 0.3, attention=0.0)
    assert (model[0].attention_dropout, model[0].out_drop.p, model[1].p) == (0.0, 0.3, 0.3)
    set_dropout(model, None, attention=0.05)  # None leaves the hidden dropout as it is
    assert (model[0].attention_dropout, model[0].out_drop.p, model[1].p) == (0.05, 0.3, 0.3)


@pytest.mark.slow
def test_loss_decreases(minilm_lmk_checkpoint, tmp_path, toy_jsonl):
    config = run_config(minilm_lmk_checkpoint, tmp_path, data=toy_jsonl, finetune="full", learning_rate=5e-5,
                        max_steps=12, num_train_epochs=100)
    result = train(config)
    losses = [entry["loss"] for entry in result["log_history"] if "loss" in entry]
    assert len(losses) == 12 and np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3])


def test_variable_splitter_draws_g_per_batch(lmk_checkpoint, tmp_path, toy_jsonl):
    config = run_config(lmk_checkpoint, tmp_path, data=toy_jsonl, splitter="variable", granularities=[2, 3, 5, 7],
                        max_steps=12, num_train_epochs=100)
    result = train(config)
    drawn = result["granularities_drawn"]
    assert len(drawn) >= 12 and set(drawn) <= {2, 3, 5, 7} and len(set(drawn)) >= 3
    # Each batch uses its draw for every column: landmarks every g content tokens.
    from lmk_embed_tools.training.finetune import EmbeddingDataCollator

    st = result["model"]
    st.train()
    collator = EmbeddingDataCollator(preprocess_fn=st.preprocess, embedder=st.transformers_model,
                                     query_max_length=32, passage_max_length=64)
    features = [{"query": "a b c d e f g h i j", "positive": "k l m n o p q r s t u v w x y z"}]
    for _ in range(6):
        batch = collator(features)
        g = collator.drawn[-1]
        assert int(batch["query_landmark_mask"].sum()) == -(-10 // g)
        assert int(batch["positive_landmark_mask"].sum()) == -(-16 // g)
    config_saved = json.loads((result["final_dir"] / "config.json").read_text())
    assert config_saved["splitter"] == "variable" and config_saved["granularities"] == [2, 3, 5, 7]


def test_side_by_side_runs_equal_runs_one_at_a_time(lmk_checkpoint, tmp_path, toy_jsonl):
    from safetensors.torch import load_file

    from lmk_embed_tools.training import train_side_by_side

    configs = {name: run_config(lmk_checkpoint, tmp_path / name, data=toy_jsonl, finetune="full", seed=seed)
               for name, seed in (("a", 0), ("b", 1))}
    runs = train_side_by_side(configs, threads_per_run=1)
    assert set(runs) == {"a", "b"} and all(run["global_step"] == 4 and "model" not in run for run in runs.values())
    assert "loss" in (Path(configs["a"].output_dir) / "train.log").read_text()  # the worker's output went to its log

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = train(run_config(lmk_checkpoint, tmp_path / "alone", data=toy_jsonl, finetune="full", seed=0))
    finally:
        torch.set_num_threads(threads)
    weights = {name: load_file(Path(path) / "model.safetensors")
               for name, path in (("a", runs["a"]["final_dir"]), ("b", runs["b"]["final_dir"]), ("alone", alone["final_dir"]))}
    assert all(torch.equal(weights["a"][key], weights["alone"][key]) for key in weights["alone"])
    assert not all(torch.equal(weights["a"][key], weights["b"][key]) for key in weights["a"])  # another seed, other weights


def test_side_by_side_names_the_failed_run_and_bad_arguments(lmk_checkpoint, tmp_path, toy_jsonl):
    from lmk_embed_tools.training import train_side_by_side

    good = run_config(lmk_checkpoint, tmp_path / "good", data=toy_jsonl, max_steps=1)
    broken = run_config(lmk_checkpoint, tmp_path / "broken", data=tmp_path / "missing.jsonl")
    with pytest.raises(RuntimeError, match=r"'broken' failed; its output is in .*broken.*train\.log"):
        train_side_by_side({"good": good, "broken": broken}, threads_per_run=1)
    assert "missing.jsonl" in (tmp_path / "broken" / "run" / "train.log").read_text()  # the traceback is in the log
    with pytest.raises(ValueError, match="output_dir"):
        train_side_by_side({"one": good, "two": good}, threads_per_run=1)
    with pytest.raises(ValueError, match="threads_per_run"):
        train_side_by_side({"good": good}, threads_per_run=0)
    with pytest.raises(ValueError, match="configs"):
        train_side_by_side({})


@pytest.mark.slow
def test_side_by_side_workers_stop_when_the_caller_is_killed(lmk_checkpoint, tmp_path, toy_jsonl):
    import dataclasses

    import psutil

    config = run_config(lmk_checkpoint, tmp_path, data=toy_jsonl, max_steps=1_000_000)
    driver = ("import json, sys; from lmk_embed_tools.training import TrainConfig, train_side_by_side; "
              "train_side_by_side({'long': TrainConfig(**json.loads(sys.stdin.read()))}, threads_per_run=1)")
    caller = subprocess.Popen([sys.executable, "-c", driver], stdin=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT)
    caller.stdin.write(json.dumps(dataclasses.asdict(config)))
    caller.stdin.close()
    log = Path(config.output_dir) / "train.log"

    def training_started() -> bool:  # the trainer's progress bar is in the worker's log
        return log.is_file() and ("it/s" in log.read_text() or "s/it" in log.read_text())

    workers = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not training_started():
            time.sleep(0.5)
        workers = [p for p in psutil.Process(caller.pid).children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]
        assert workers, "no training worker was started"
        caller.send_signal(signal.SIGKILL)
        caller.wait()
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, "the training worker went on after its caller was killed"
    finally:
        caller.kill()
        for worker in workers:
            if worker.is_running():
                worker.kill()


def test_lora_adapter_round_trip(minilm_lmk_checkpoint, tmp_path, toy_jsonl):
    from sentence_transformers import SentenceTransformer

    config = run_config(minilm_lmk_checkpoint, tmp_path, data=toy_jsonl, finetune="lora", save_mode="adapter",
                        lora_target_modules=["query", "value"])
    result = train(config)
    assert (result["final_dir"] / "adapter_model.safetensors").is_file()
    texts = ["how do I parse json", "A module for zip archives.", ""]
    trained = result["model"].encode(texts)
    base = SentenceTransformer(str(minilm_lmk_checkpoint), trust_remote_code=True)
    untouched = base.encode(texts)
    base.load_adapter(str(result["final_dir"]))
    assert np.abs(base.encode(texts) - trained).max() <= 1e-6
    assert np.abs(untouched - trained).max() > 1e-4  # the adapter did change the model


@pytest.mark.slow
def test_merged_checkpoint_passes_the_contract(minilm_lmk_checkpoint, tmp_path, toy_jsonl):
    from tests.lmk_embed.test_packaging import check_contract

    from lmk_embed import LMKModel

    result = train(run_config(minilm_lmk_checkpoint, tmp_path, data=toy_jsonl, finetune="lora", save_mode="merged"))
    final = result["final_dir"]
    assert not (final / "adapter_config.json").exists() and (final / "run_config.yaml").is_file()
    texts = ["how do I parse json", "A module for zip archives."]
    merged = LMKModel.from_pretrained(final).encode(texts)
    assert np.abs(merged - result["model"].encode(texts)).max() <= 1e-5
    untouched = LMKModel.from_pretrained(minilm_lmk_checkpoint).encode(texts)
    assert np.abs(merged - untouched).max() > 1e-4  # the adapter really was merged in
    check_contract(final, tmp_path / "contract", ["query", "value"])


def test_distillation_loss_is_infonce_plus_weighted_kl(minilm_lmk_checkpoint):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss, MultipleNegativesRankingLoss

    from lmk_embed_tools.training.finetune import InfoNCEWithDistillation

    st = SentenceTransformer(str(minilm_lmk_checkpoint), trust_remote_code=True)
    features = [st.preprocess(["q one", "q two"]), st.preprocess(["p one", "p two"]), st.preprocess(["n one", "n two"])]
    labels = torch.tensor([[3.0, 0.5], [2.0, 1.0]])
    combined = InfoNCEWithDistillation(st, 0.02, 0.5, 1.0, False)(features, labels)
    infonce = MultipleNegativesRankingLoss(st, scale=50)(features, labels)
    kl = DistillKLDivLoss(st, student_temperature=0.02, teacher_temperature=1.0)(features, labels)
    torch.testing.assert_close(combined, infonce + 0.5 * kl, atol=1e-4, rtol=1e-4)


def test_training_with_teacher_scores_and_gradcache(lmk_checkpoint, tmp_path):
    rows = toy_rows(8)
    for row in rows:
        row["teacher_scores"] = [4.0, 0.0]
    path = write_jsonl(rows, tmp_path / "scores.jsonl")
    result = train(run_config(lmk_checkpoint, tmp_path, data=path, max_steps=2))
    assert result["global_step"] == 2
    with pytest.raises(ValueError, match="gradcache"):
        train(run_config(lmk_checkpoint, tmp_path / "b", data=path, loss="gradcache"))
    plain = write_jsonl(toy_rows(8), tmp_path / "plain.jsonl")
    result = train(run_config(lmk_checkpoint, tmp_path / "c", data=plain, loss="gradcache", gradcache_mini_batch_size=2,
                              max_steps=2))
    assert result["global_step"] == 2


def test_rows_with_different_negative_counts_train_in_batches_of_one_count(lmk_checkpoint, tmp_path):
    """Pairs without negatives and rows with a hard negative in one file: nothing cut, every batch from one
    count, through the long-page loss (max-sim over landmarks) as the demo trains its window rows."""
    rows = toy_rows(8, negatives=0) + toy_rows(8, negatives=1)
    path = write_jsonl(rows, tmp_path / "mixed.jsonl")
    result = train(run_config(lmk_checkpoint, tmp_path, data=path, max_steps=4, maxsim_weight=1.0))
    assert result["global_step"] == 4 and all(math.isfinite(e["loss"]) for e in result["log_history"] if "loss" in e)


@pytest.mark.parametrize("which", ["lmk_checkpoint", "mamba2_checkpoint"])
def test_bf16_and_gradient_checkpointing(which, request, tmp_path, toy_jsonl):
    checkpoint = request.getfixturevalue(which)
    result = train(run_config(checkpoint, tmp_path, data=toy_jsonl, finetune="full", bf16=True,
                              gradient_checkpointing=True, max_steps=2))
    assert result["global_step"] == 2
    backbone = result["model"].transformers_model.backbone
    assert backbone.is_gradient_checkpointing
    losses = [entry["loss"] for entry in result["log_history"] if "loss" in entry]
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_frozen_input_embeddings_stay_while_the_layers_train(mamba2_checkpoint, tmp_path, toy_jsonl):
    from safetensors.torch import load_file

    result = train(run_config(mamba2_checkpoint, tmp_path, data=toy_jsonl, finetune="full", freeze_input_embeddings=True,
                              max_steps=2))
    before, after = load_file(mamba2_checkpoint / "model.safetensors"), load_file(result["final_dir"] / "model.safetensors")
    embeddings = [name for name in before if name.endswith("embeddings.weight")]
    assert len(embeddings) == 1
    assert torch.equal(before[embeddings[0]], after[embeddings[0]])
    assert any(not torch.equal(before[name], after[name]) for name in before if "in_proj" in name)
    with pytest.raises(ValueError, match="freeze_input_embeddings"):
        run_config(mamba2_checkpoint, tmp_path, data=toy_jsonl, freeze_input_embeddings=True)  # LoRA trains none


def test_qlora_one_step_on_cpu(lmk_checkpoint, tmp_path, toy_jsonl):
    """The tiny ModernBERT's widths are multiples of 32, which bitsandbytes' CPU 4-bit kernels need."""
    result = train(run_config(lmk_checkpoint, tmp_path, data=toy_jsonl, finetune="qlora", max_steps=2))
    assert result["global_step"] == 2
    embedder = result["model"].transformers_model
    assert any(type(m).__name__ == "Linear4bit" for m in embedder.modules())
    assert (result["final_dir"] / "model.safetensors").is_file()  # merged into the unquantised base


def test_qlora_refused_up_front_where_the_cpu_cannot(mamba2_checkpoint, tmp_path, toy_jsonl):
    with pytest.raises(ValueError, match="multiples of 32") as error:
        train(run_config(mamba2_checkpoint, tmp_path, data=toy_jsonl, finetune="qlora"))
    assert "in_proj (64->328)" in str(error.value)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_recurrent_lora_training_under_the_vertical_schedule(mamba2_checkpoint, tmp_path, toy_jsonl):
    from lmk_embed.modeling_recurrent import RecurrentEmbedModel

    result = train(run_config(mamba2_checkpoint, tmp_path, data=toy_jsonl, schedule="vertical", block_size=8,
                              learning_rate=1e-2))
    trainable = [n for n, p in result["model"].named_parameters() if p.requires_grad]
    assert trainable and all("in_proj" in n and "lora_" in n for n in trainable)
    merged = RecurrentEmbedModel.from_pretrained(result["final_dir"])
    assert merged.config.schedule == "vertical"
    texts = ["how do I parse json", "zip archives"]
    assert np.abs(merged.encode(texts) - result["model"].encode(texts)).max() <= 1e-4


def test_resuming_a_finished_run_keeps_it_as_it_is(lmk_checkpoint, tmp_path, toy_jsonl):
    """The trainer would take one step past max_steps (at learning rate 0) and rewrite final/."""
    import dataclasses

    config = run_config(lmk_checkpoint, tmp_path, data=toy_jsonl, max_steps=3, save_steps=3)
    assert train(config)["global_step"] == 3
    final = tmp_path / "run" / "final" / "model.safetensors"
    before = final.read_bytes(), final.stat().st_mtime_ns
    result = train(dataclasses.replace(config, resume_from_checkpoint="last"))
    assert result["global_step"] == 3 and result["final_dir"] == tmp_path / "run" / "final"
    assert (final.read_bytes(), final.stat().st_mtime_ns) == before
    assert not (tmp_path / "run" / "checkpoints" / "checkpoint-4").exists()
    extended = train(dataclasses.replace(config, resume_from_checkpoint="last", max_steps=5))  # a larger max_steps extends it
    assert extended["global_step"] == 5


# ---- processes --------------------------------------------------------------------------------


def write_cli_config(tmp_path, checkpoint, data, **overrides):
    settings = dict(model=str(checkpoint), output_dir=str(tmp_path / "run"), train_data=str(data), eval_data="none",
                    per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1, query_max_length=16,
                    passage_max_length=32)
    settings.update(overrides)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.mark.slow
def test_resume_after_sigkill(lmk_checkpoint, tmp_path):
    data = write_jsonl(toy_rows(64), tmp_path / "d.jsonl")
    config = write_cli_config(tmp_path, lmk_checkpoint, data, max_steps=3000, save_steps=10, save_total_limit=None)
    command = [sys.executable, "-m", "lmk_embed_tools.cli", "train", "--config", str(config)]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "run" / "checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline and not list(checkpoints.glob("checkpoint-*/trainer_state.json")):
        assert process.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    complete = sorted(int(p.parent.name.split("-")[1]) for p in checkpoints.glob("checkpoint-*/trainer_state.json"))
    assert complete and not (tmp_path / "run" / "final").exists()
    last = complete[-1]
    target = last + 12
    result = subprocess.run(command + ["--resume_from_checkpoint", "last", "--max_steps", str(target)], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # logging_steps=1: a resumed run logs only the steps after the checkpoint, a restarted one all of them.
    assert result.stdout.count("{'loss'") == target - last
    state = json.loads((checkpoints / f"checkpoint-{target}" / "trainer_state.json").read_text())
    assert state["global_step"] == target
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_two_process_ddp_with_gloo(lmk_checkpoint, tmp_path):
    data = write_jsonl(toy_rows(32), tmp_path / "d.jsonl")
    config = write_cli_config(tmp_path, lmk_checkpoint, data, max_steps=3, save_steps=1000, ddp_backend="gloo",
                              gather_across_devices=True)
    torchrun = Path(sys.executable).with_name("torchrun")
    result = subprocess.run([str(torchrun), "--nproc_per_node", "2", "-m", "lmk_embed_tools.cli", "train", "--config",
                             str(config)], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
                            capture_output=True, text=True, timeout=600)
    # Both ranks' own lines first: torchrun's summary at the end names only the first rank to fail.
    ranks = [line for line in result.stderr.splitlines() if line.startswith(("[rank0]", "[rank1]"))]
    assert result.returncode == 0, "\n".join(ranks[-60:]) + "\n" + result.stderr[-2000:]
    state = json.loads(next((tmp_path / "run" / "checkpoints").glob("checkpoint-*/trainer_state.json")).read_text())
    assert state["global_step"] == 3
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    report = run_fresh_python(f"""
    import json
    from transformers import AutoModel
    print(json.dumps({{"shape": list(AutoModel.from_pretrained({str(tmp_path / 'run' / 'final')!r},
                                                     trust_remote_code=True).encode(["x"]).shape)}}))
    """, cwd=tmp_path)
    assert report["shape"] == [1, 32]


def test_a_missing_or_misspelt_field_is_an_error_with_file_line_and_field(tmp_path):
    rows = [{"query": "q1", "positive": "p1"}, {"query": "q2", "positve": "p2"}, {"query": "q3", "positive": ""}]
    path = write_jsonl(rows, tmp_path / "typo.jsonl")
    with pytest.raises(ValueError) as error:
        load_training_rows(path)
    message = str(error.value)
    assert str(path) in message and "line 2: missing field `positive`" in message and "positve" in message
    # An empty value is data: counted and dropped, not an error.
    kept, report = load_training_rows(write_jsonl([rows[0], rows[2]], tmp_path / "empty.jsonl"))
    assert len(kept) == 1 and report.dropped_empty == 1


def test_teacher_embeddings_are_validated(tmp_path):
    good = [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]
    rows = [dict(toy_rows(1)[0], teacher_embeddings=good),
            dict(toy_rows(1)[0], teacher_embeddings=good[:2]),
            dict(toy_rows(1)[0], teacher_embeddings=[[0.1], [0.2, 0.3], [0.4]]),
            dict(toy_rows(1)[0], teacher_embeddings=good, teacher_scores=[1.0, 0.0])]
    with pytest.raises(ValueError) as error:
        load_training_rows(write_jsonl(rows, tmp_path / "v.jsonl"))
    message = str(error.value)
    assert "3 bad rows" in message and "line 2: `teacher_embeddings` has 2 vectors" in message
    assert "line 3: `teacher_embeddings` must be a list of equally long lists" in message
    assert "line 4: give `teacher_scores` or `teacher_embeddings`, not both" in message


def test_embedding_distillation_loss_is_infonce_plus_cosine_distance(minilm_lmk_checkpoint):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from lmk_embed_tools.training.finetune import InfoNCEWithEmbeddingDistillation

    st = SentenceTransformer(str(minilm_lmk_checkpoint), trust_remote_code=True)
    texts = [["q one", "q two"], ["p one", "p two"], ["n one", "n two"]]
    features = [st.preprocess(column) for column in texts]
    teacher = torch.nn.functional.normalize(torch.randn(2, 3, 384), dim=-1)
    combined = InfoNCEWithEmbeddingDistillation(st, 0.02, 0.5, False)(features, teacher.reshape(2, -1))
    infonce = MultipleNegativesRankingLoss(st, scale=50)(features, None)
    student = torch.stack([st(f)["sentence_embedding"] for f in features], dim=1)
    distance = 1 - torch.nn.functional.cosine_similarity(student, teacher, dim=-1).mean()
    torch.testing.assert_close(combined, infonce + 0.5 * distance, atol=1e-4, rtol=1e-4)
    # The student's own vectors as the teacher's: no distillation term left.
    same = InfoNCEWithEmbeddingDistillation(st, 0.02, 0.5, False)(features, student.detach().reshape(2, -1))
    torch.testing.assert_close(same, infonce, atol=1e-4, rtol=1e-4)


def test_training_with_teacher_embeddings(lmk_checkpoint, tmp_path):
    rows = toy_rows(8)
    generator = torch.Generator().manual_seed(0)
    for row in rows:
        row["teacher_embeddings"] = torch.nn.functional.normalize(torch.randn(3, 32, generator=generator), dim=-1).tolist()
    result = train(run_config(lmk_checkpoint, tmp_path, data=write_jsonl(rows, tmp_path / "v.jsonl"), max_steps=2))
    assert result["global_step"] == 2
    losses = [entry["loss"] for entry in result["log_history"] if "loss" in entry]
    assert all(np.isfinite(losses))


# ---- batches grouped by length ------------------------------------------------------------------


def grouped_batches(lengths, batch_size, drop_last=False, epoch=0, seed=0, duplicate_of=None):
    """`LengthGroupedBatchSampler` batches over rows whose positive has `lengths[i]` characters;
    `duplicate_of` {i: j} makes row i's positive equal to row j's."""
    from datasets import Dataset

    from lmk_embed_tools.training.finetune import LengthGroupedBatchSampler

    positives = ["x" * length + f"#{i:03d}" for i, length in enumerate(lengths)]  # length + 4 characters
    for i, j in (duplicate_of or {}).items():
        positives[i] = positives[j]
    dataset = Dataset.from_dict({"query": [f"q{i:03d}" for i in range(len(lengths))], "positive": positives,
                                 "label": [[0.0]] * len(lengths)})
    sampler = LengthGroupedBatchSampler(dataset, batch_size=batch_size, drop_last=drop_last, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler), positives, len(sampler)


def test_length_grouped_batches_hold_every_row_once_and_similar_lengths():
    lengths = [(i * 37) % 101 for i in range(64)]  # distinct lengths, shuffled
    batches, _, count = grouped_batches(lengths, batch_size=4)
    assert count == len(batches) == 16
    assert sorted(i for batch in batches for i in batch) == list(range(64))  # no row lost or repeated
    # One mega-batch (64 < 4 x 50 rows): each batch is a run of 4 consecutive lengths in sorted order.
    ranks = {length: rank for rank, length in enumerate(sorted(lengths, reverse=True))}
    for batch in batches:
        batch_ranks = sorted(ranks[lengths[i]] for i in batch)
        assert batch_ranks == list(range(batch_ranks[0], batch_ranks[0] + 4)) and batch_ranks[0] % 4 == 0
    # The batch order is shuffled (not longest first), reproducibly per epoch, and differs between epochs.
    assert [max(lengths[i] for i in batch) for batch in batches] != sorted(
        (max(lengths[i] for i in batch) for batch in batches), reverse=True)
    assert grouped_batches(lengths, batch_size=4)[0] == batches
    assert grouped_batches(lengths, batch_size=4, epoch=1)[0] != batches


def test_length_grouped_batches_never_hold_a_text_twice_and_respect_drop_last():
    lengths = [10] * 6 + [50] * 5
    batches, positives, _ = grouped_batches(lengths, batch_size=4, duplicate_of={1: 0, 2: 0, 3: 0})
    assert sorted(i for batch in batches for i in batch) == list(range(11))
    for batch in batches:
        texts = [positives[i] for i in batch]
        assert len(texts) == len(set(texts)) and len(batch) <= 4
    kept, _, count = grouped_batches(lengths, batch_size=4, drop_last=True)
    assert count == len(kept) == 2 and all(len(batch) == 4 for batch in kept)


def test_training_grouped_by_length_pads_less(lmk_checkpoint, tmp_path, monkeypatch):
    rows = toy_rows(16)
    for i, row in enumerate(rows):  # half the passages short, half ten times as long
        row["positive"] = row["positive"] if i % 2 else " ".join([row["positive"]] * 10)
    data = write_jsonl(rows, tmp_path / "mixed.jsonl")
    from lmk_embed_tools.training import finetune

    collate = finetune.EmbeddingDataCollator.__call__
    widths = []  # the padded width of every passage batch

    def counting(self, features):
        batch = collate(self, features)
        widths.append(batch["positive_input_ids"].shape[1])
        return batch

    monkeypatch.setattr(finetune.EmbeddingDataCollator, "__call__", counting)
    short_batches = {}
    for grouped in (False, True):
        widths.clear()
        result = train(run_config(lmk_checkpoint, tmp_path / str(grouped), data=data, group_by_length=grouped,
                                  num_negatives=0, max_steps=4, passage_max_length=256))
        assert result["global_step"] == 4 and len(widths) == 4
        short_batches[grouped] = sum(width < max(widths) / 2 for width in widths)  # long passages are ~10x wider
    # Grouped, the 4 batches of one epoch are 2 of short passages and 2 of long ones; random batches mix them.
    assert short_batches[True] == 2 and short_batches[False] < 2
