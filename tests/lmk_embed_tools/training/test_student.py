"""The recurrent student of MiniLM: its teacher vectors, its initialisation, its training path."""

import json
import pathlib

import numpy as np
import pytest
import torch

from lmk_embed_tools.training import student


@pytest.fixture(scope="module")
def teacher(minilm_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


def reference_window_mean(teacher, text: str, content: int, first_window_weight: float = 0.0) -> np.ndarray:
    """Direct computation: the text's token ids cut into runs of `content`, each run framed by
    [CLS] ... [SEP] and mean-pooled by the bare BERT, the runs' unit vectors averaged and normalised,
    then b x the first run's unit vector plus (1 - b) x that mean, normalised."""
    tokenizer, bert = teacher.tokenizer, teacher[0].auto_model
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    vectors = []
    for start in range(0, len(ids), content):
        run = [tokenizer.cls_token_id, *ids[start:start + content], tokenizer.sep_token_id]
        with torch.no_grad():
            states = bert(input_ids=torch.tensor([run])).last_hidden_state[0]
        vector = states.mean(0).numpy()
        vectors.append(vector / np.linalg.norm(vector))
    mean = np.mean(vectors, axis=0)
    mixed = first_window_weight * vectors[0] + (1 - first_window_weight) * mean / np.linalg.norm(mean)
    return mixed / np.linalg.norm(mixed)


def test_a_long_page_gets_the_mean_of_its_window_vectors(teacher):
    short = "json: JSON encoder and decoder."
    long = " ".join(f"Section {i}: the parser reads token {i * 7} and writes record {i * 3}." for i in range(60))
    window = 64
    found = student.teacher_page_vectors(teacher, [short, long], window=window)
    assert len(teacher.tokenizer(long, add_special_tokens=False)["input_ids"]) > 4 * window  # several windows
    np.testing.assert_allclose(found[0], teacher.encode(short, normalize_embeddings=True), atol=1e-5)
    np.testing.assert_allclose(found[1], reference_window_mean(teacher, long, window - 2), atol=1e-5)
    assert teacher.max_seq_length == 256  # the teacher's own setting is restored


def test_a_long_pages_target_weighs_its_first_window(teacher):
    short = "json: JSON encoder and decoder."
    long = " ".join(f"Section {i}: the parser reads token {i * 7} and writes record {i * 3}." for i in range(60))
    found = student.teacher_page_vectors(teacher, [short, long], window=64, first_window_weight=0.75)
    np.testing.assert_allclose(found[0], teacher.encode(short, normalize_embeddings=True), atol=1e-5)  # one window
    np.testing.assert_allclose(found[1], reference_window_mean(teacher, long, 62, first_window_weight=0.75), atol=1e-5)
    first = student.teacher_page_vectors(teacher, [long], window=64, first_window_weight=1.0)[0]
    mean = student.teacher_page_vectors(teacher, [long], window=64)[0]
    assert float(first @ mean) < 0.99  # the weight moves the target
    for bad in (-0.1, 1.5, True, "half"):
        with pytest.raises(ValueError, match="first_window_weight"):
            student.teacher_page_vectors(teacher, [short], first_window_weight=bad)


def test_rows_are_cut_to_what_the_student_reads(teacher):
    rows = [{"query": "word " * 100, "positive": "page " * 900, "negatives": []}]
    student.add_student_teacher_embeddings(rows, teacher, query_max_length=16, passage_max_length=512,
                                           first_window_weight=0.75)
    count = lambda text: len(teacher.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert count(rows[0]["query"]) == 15 and count(rows[0]["positive"]) == 511  # less the student's EOS
    vectors = np.asarray(rows[0]["teacher_embeddings"])
    assert vectors.shape == (2, 384)
    page = student.teacher_page_vectors(teacher, [rows[0]["positive"]], first_window_weight=0.75)[0]
    np.testing.assert_allclose(vectors[1], page, atol=1e-5)


def test_the_student_starts_from_the_teachers_tokenizer_and_word_embeddings(minilm_path, tmp_path):
    from transformers import AutoModel, AutoTokenizer, Mamba2Model

    sizes = {"num_hidden_layers": 1, "state_size": 16, "head_dim": 64}
    folder = student.init_student(minilm_path, tmp_path / "s", init="teacher-embeddings", **sizes)
    backbone, tokenizer = Mamba2Model.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    teacher_embeddings = AutoModel.from_pretrained(minilm_path).get_input_embeddings().weight
    assert torch.equal(backbone.get_input_embeddings().weight, teacher_embeddings)
    assert tokenizer.eos_token == "[SEP]" and backbone.config.eos_token_id == tokenizer.sep_token_id
    assert tokenizer("a b")["input_ids"] == AutoTokenizer.from_pretrained(minilm_path)("a b")["input_ids"]
    # mamba_ssm's scale, not transformers' default (in_proj std 0.1): nn.Linear's std 1/sqrt(3 x 384),
    # out_proj's kaiming-uniform std 1/sqrt(3 x 768) over sqrt(layers).
    four_layers = {**sizes, "num_hidden_layers": 4}
    mixer = Mamba2Model.from_pretrained(student.init_student(minilm_path, tmp_path / "d", init="teacher-embeddings",
                                                             **four_layers)).layers[0].mixer
    assert mixer.in_proj.weight.std().item() == pytest.approx((3 * 384) ** -0.5, rel=0.02)
    assert mixer.out_proj.weight.std().item() == pytest.approx((3 * 768) ** -0.5 / 2, rel=0.02)
    fresh = Mamba2Model.from_pretrained(student.init_student(minilm_path, tmp_path / "r", init="random", **sizes))
    assert not torch.equal(fresh.get_input_embeddings().weight, teacher_embeddings)
    with pytest.raises(ValueError, match="`init`"):
        student.init_student(minilm_path, tmp_path / "x", init="pretrained", **sizes)
    with pytest.raises(ValueError, match="`head_dim`"):
        student.init_student(minilm_path, tmp_path / "x", init="random", num_hidden_layers=1, state_size=16, head_dim=100)
    with pytest.raises(ValueError, match="`frequency_texts`"):
        student.init_student(minilm_path, tmp_path / "x", init="static-bag", **sizes)


def test_sif_weights_are_a_over_a_plus_the_token_frequency(teacher):
    tokenizer = teacher.tokenizer
    the, cat = tokenizer.convert_tokens_to_ids(["the", "cat"])
    vocab = tokenizer.vocab_size
    weights = student.sif_weights(tokenizer, ["the the cat", "the"], vocab, smoothing=1e-3)
    total = vocab + 4  # add-one counts, then 3 x "the" and 1 x "cat"
    assert weights[the].item() == pytest.approx(1e-3 / (1e-3 + 4 / total))
    assert weights[cat].item() == pytest.approx(1e-3 / (1e-3 + 2 / total))
    assert weights[tokenizer.unk_token_id].item() == pytest.approx(1e-3 / (1e-3 + 1 / total))


def test_a_static_bag_student_embeds_the_weighted_sum_of_its_static_vectors():
    """transformers' own Mamba2 forward of a tiny student set by `static_bag_student`: the EOS states of
    texts have the cosines of the texts' SIF-weighted bags of unit static vectors (the principal
    directions rotate the bag, so only cosines can be compared), and a random student does not. One
    Adam step at the recipe's learning rate moves each parameter by about that rate, so the bag's
    gains must be small for training to start from it: after one step on a random loss every EOS
    vector keeps a cosine above 0.9 to its start (with rows at unit norm and a dt slope of 100, it
    fell to 0.27)."""
    from transformers import Mamba2Config, Mamba2Model

    torch.manual_seed(0)
    width, vocab, eos = 16, 40, 0
    config = Mamba2Config(vocab_size=vocab, hidden_size=width, num_hidden_layers=2, state_size=8, head_dim=8,
                          num_heads=4, expand=2, n_groups=1, chunk_size=8, eos_token_id=eos, pad_token_id=eos)
    # static vectors of rank D - 2: the principal directions keep all of them
    static = (torch.randn(vocab, width - 2) @ torch.randn(width - 2, width)).double()
    weights = torch.rand(vocab, dtype=torch.float64) * 0.999 + 1e-3
    texts = [torch.randint(1, vocab, (n,)).tolist() + [eos] for n in (3, 9, 17, 30, 30)]

    def eos_states(model):
        return torch.stack([model(input_ids=torch.tensor([t])).last_hidden_state[0, -1] for t in texts])

    def eos_cosines(model):
        with torch.no_grad():
            states = eos_states(model).double()
        states = states / states.norm(dim=1, keepdim=True)
        return states @ states.T

    def bag_student():
        model = Mamba2Model(config)
        student.static_bag_student(model, static, weights, eos)
        return model

    units = static / static.norm(dim=1, keepdim=True)
    bags = torch.stack([(weights[t[:-1], None] * units[t[:-1]]).sum(0) for t in texts])
    bags = bags / bags.norm(dim=1, keepdim=True)
    expected = bags @ bags.T
    assert (expected - torch.eye(len(texts), dtype=torch.float64)).abs().max() > 0.1  # the texts differ
    torch.testing.assert_close(eos_cosines(bag_student()), expected, atol=0.03, rtol=0)
    assert (eos_cosines(Mamba2Model(config)) - expected).abs().max() > 0.05

    model = bag_student()
    before = eos_states(model).detach()
    loss = (eos_states(model) * torch.randn_like(before)).sum()
    loss.backward()
    torch.optim.Adam(model.parameters(), lr=student.STUDENT_RECIPE["learning_rate"]).step()
    with torch.no_grad():
        after = eos_states(model)
    assert torch.nn.functional.cosine_similarity(before, after, dim=1).min() > 0.9


@pytest.fixture(scope="module")
def trained(tmp_path_factory, minilm_path, teacher):
    """A one-layer student trained for 3 steps in bfloat16 with transformers' Mamba2 forward disabled:
    (train_student's result, what each training forward saw)."""
    from transformers.models.mamba2 import modeling_mamba2

    from lmk_embed.modeling_recurrent import RecurrentEmbedModel
    from lmk_embed_tools.training.recipe import write_rows

    folder = tmp_path_factory.mktemp("student")
    texts = [f"{name}: functions for {topic}." for name, topic in
             [("json", "JSON"), ("csv", "CSV files"), ("zipfile", "ZIP archives"), ("re", "regular expressions"),
              ("math", "mathematics"), ("time", "time access"), ("heapq", "heap queues"), ("glob", "path patterns")]]
    rows = [{"query": text.split(":")[1], "positive": text * 3, "negatives": []} for text in texts]
    student.add_student_teacher_embeddings(rows, teacher, query_max_length=16, passage_max_length=48,
                                           first_window_weight=student.PAGE_FIRST_WINDOW_WEIGHT)
    train_file = write_rows(rows, folder / "train.jsonl")
    seen = []
    forward = RecurrentEmbedModel.forward

    def recording_forward(self, *args, **kwargs):
        if self.training:
            seen.append(torch.is_autocast_enabled("cpu"))
        return forward(self, *args, **kwargs)

    def fallback(*args, **kwargs):
        raise AssertionError("training fell back to transformers' Mamba2 forward")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling_mamba2.Mamba2Mixer, "forward", fallback)
        patch.setattr(RecurrentEmbedModel, "forward", recording_forward)
        result = student.train_student(
            minilm_path, train_file, folder, size={"num_hidden_layers": 1, "state_size": 16, "head_dim": 64}, steps=3,
            bf16=True, teacher_id="sentence-transformers/all-MiniLM-L6-v2", logging_steps=1,
            recipe={"per_device_train_batch_size": 4, "query_max_length": 16, "passage_max_length": 48})
    return result, seen


def test_training_runs_on_the_chunked_scan_in_bfloat16(trained):
    result, seen = trained
    assert result["global_step"] == 3
    assert seen and all(seen)  # every training forward under bfloat16 autocast, none through the fallback
    losses = [entry["loss"] for entry in result["log_history"] if "loss" in entry]
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_the_trained_student_changed_and_is_a_checkpoint_of_the_family(trained, minilm_path):
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    final = pathlib.Path(trained[0]["final_dir"])
    init = load_file(final.parent.parent / "init" / "model.safetensors")
    after = load_file(final / "model.safetensors")
    changed = [name for name in init if not torch.equal(init[name], after[name])]
    assert len(changed) > len(init) // 2 and all(torch.isfinite(v.float()).all() for v in after.values())
    config = json.loads((final / "config.json").read_text())
    assert config["distilled_from"] == "sentence-transformers/all-MiniLM-L6-v2"
    model = AutoModel.from_pretrained(final, trust_remote_code=True).eval()
    texts = ["json: JSON encoder and decoder.", "zipfile: read and write ZIP files."]
    st = SentenceTransformer(str(final), trust_remote_code=True, device="cpu")
    np.testing.assert_allclose(st.encode_document(texts), model.encode_document(texts), atol=1e-5)


def test_the_student_streams_a_file_as_it_encodes_the_joined_text(trained, tmp_path):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(trained[0]["final_dir"], trust_remote_code=True).eval()
    pieces = [f"Paragraph {i}: the reader keeps a constant state while it reads token after token.\n" for i in range(300)]
    path = tmp_path / "long.txt"
    path.write_text("".join(pieces), encoding="utf-8")
    expected = model.encode("".join(pieces))
    np.testing.assert_allclose(model.encode(path), expected, atol=1e-4)
    np.testing.assert_allclose(model.encode_stream(iter(pieces)), expected, atol=1e-4)


def test_the_card_says_what_the_student_is(trained):
    from lmk_embed_tools.model_cards.generator import build_card

    text = str(build_card(trained[0]["final_dir"], model_id="org/student"))
    assert "distilled from `sentence-transformers/all-MiniLM-L6-v2`" in text
    assert "Unlike the paper's models" in text
