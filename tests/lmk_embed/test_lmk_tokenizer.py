"""Algorithm 1 layouts: hand-worked examples, a loop reference, truncation, splitters, literal specials."""

import random
import re

import numpy as np
import pytest
from transformers import AutoTokenizer

from lmk_embed.tokenization_lmk import LMKTokenizer, reference_layout as loop_reference
from tests.helpers import SAMPLE_TEXT, stdlib_texts

CLS, SEP, PAD = 101, 102, 0


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return LMKTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="module")
def bert(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


def reference_layout(content: list[int], g: int, max_length: int | None, boundaries=()) -> tuple[list[int], list[int]]:
    """The shipped loop reference with MiniLM's CLS and SEP (the landmark)."""
    return loop_reference(content, g, max_length, CLS, SEP, sentence_ends=boundaries)


def test_hand_worked_fixed_layout(tokenizer):
    out = tokenizer("a b c d e", granularity=2)
    a, b, c, d, e = 1037, 1038, 1039, 1040, 1041
    assert out["input_ids"] == [CLS, a, b, SEP, c, d, SEP, e, SEP]
    assert out["landmark_mask"] == [0, 0, 0, 1, 0, 0, 1, 0, 1]
    assert out["attention_mask"] == [1] * 9
    assert reference_layout([a, b, c, d, e], 2, None) == (out["input_ids"], [3, 6, 8])  # the reference, by hand
    assert reference_layout([a, b, c, d, e], 2, 6) == ([CLS, a, b, SEP, c, SEP], [3, 5])


def test_text_shorter_than_g_and_empty_text(tokenizer):
    assert tokenizer("a b", granularity=8)["input_ids"] == [CLS, 1037, 1038, SEP]
    empty = tokenizer("", granularity=8)
    assert empty["input_ids"] == [CLS, SEP] and empty["landmark_mask"] == [0, 1]


def test_batch_is_right_padded(tokenizer):
    out = tokenizer(["a b c", ""], granularity=2, return_tensors="pt")
    assert out["input_ids"].tolist() == [[CLS, 1037, 1038, SEP, 1039, SEP], [CLS, SEP, PAD, PAD, PAD, PAD]]
    assert out["attention_mask"].tolist() == [[1] * 6, [1, 1, 0, 0, 0, 0]]
    assert out["landmark_mask"].tolist() == [[0, 0, 0, 1, 0, 1], [0, 1, 0, 0, 0, 0]]


@pytest.mark.parametrize("g", [1, 2, 3, 7, 32])
@pytest.mark.parametrize("max_length", [None, 3, 4, 5, 9, 17, 64])
def test_matches_loop_reference_with_truncation(tokenizer, bert, g, max_length):
    texts = stdlib_texts(12) + ["", "x"]
    batch = tokenizer.build_layout(texts, granularity=g, max_length=max_length)
    for row, text in enumerate(texts):
        content = bert(text, add_special_tokens=False)["input_ids"]
        ids, landmarks = reference_layout(content, g, max_length)
        length = int(batch.attention_mask[row].sum())
        assert batch.input_ids[row, :length].tolist() == ids
        assert np.flatnonzero(batch.landmark_mask[row]).tolist() == landmarks
        assert batch.truncated[row] == (max_length is not None and len(reference_layout(content, g, None)[0]) > max_length)
        if max_length is not None:
            assert length <= max_length
        assert batch.input_ids[row, length - 1] == SEP  # always ends with a landmark


def test_budget_formula(tokenizer):
    """max_length counts the landmarks: n' = m - ceil(m / (g + 1)) content tokens with m = max_length - 1."""
    text = " ".join(["word"] * 5000)
    for g in (1, 8, 32, 128):
        for max_length in (3, 100, 512, 1001):
            m = max_length - 1
            kept = m - -(-m // (g + 1))
            with pytest.warns(UserWarning, match="truncated"):
                out = tokenizer(text, granularity=g, max_length=max_length)
            assert len(out["input_ids"]) == 1 + kept + -(-kept // g) <= max_length


def test_content_ids_equal_backbone_ids_through_autotokenizer(lmk_checkpoint, bert):
    """Guards the transformers 5.23 custom-tokenizer trap (vocabulary rebuilt, text split into characters)."""
    loaded = AutoTokenizer.from_pretrained(lmk_checkpoint, trust_remote_code=True)
    assert type(loaded).__name__ == "LMKTokenizer"
    out = loaded(SAMPLE_TEXT, granularity=10_000, max_length=None)
    assert out["input_ids"][1:-1] == bert(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    assert out["input_ids"][1:3] == [1996, 1046]  # "the json", not characters


def test_literal_special_tokens_are_plain_text(tokenizer, bert):
    text = "before [SEP] middle [CLS] </s> <|endoftext|> after"
    out = tokenizer(text, granularity=1000)
    ids = out["input_ids"]
    assert ids.count(SEP) == 1 and ids[-1] == SEP and ids.count(CLS) == 1 and ids[0] == CLS
    assert out["landmark_mask"] == [0] * (len(ids) - 1) + [1]
    assert ids[1:-1] == bert(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    # The backend's own state is left as it was.
    assert bert(text, add_special_tokens=False)["input_ids"].count(SEP) == 1


def test_literal_eos_is_plain_text_for_a_tokenizer_without_sep(bpe_tokenizer_dir):
    tok = LMKTokenizer.from_pretrained(bpe_tokenizer_dir)
    eos = tok.eos_token_id
    assert tok.sep_token_id is None and tok.landmark_token_id == eos
    out = tok("text with <|endoftext|> inside", granularity=1000)
    assert out["input_ids"].count(eos) == 2  # the opening BOS (same token here) and the landmark only
    assert out["landmark_mask"][-1] == 1 and sum(out["landmark_mask"]) == 1


def test_sentence_splitter_hand_worked(tokenizer):
    text = "One two three. Four five! Six"
    out = tokenizer(text, splitter="sentence", granularity=2, return_landmark_spans=True)
    tokens = tokenizer.convert_ids_to_tokens(out["input_ids"])
    assert tokens == ["[CLS]", "one", "two", "[SEP]", "three", ".", "[SEP]", "four", "five", "[SEP]", "!", "[SEP]",
                      "six", "[SEP]"]
    assert [text[s:e] for s, e in out["landmark_spans"]] == ["One two", "three.", "Four five", "!", "Six"]


def test_sentence_splitter_matches_loop_reference(tokenizer, bert):
    texts = stdlib_texts(20)
    g = 16
    batch = tokenizer.build_layout(texts, splitter="sentence", granularity=g, max_length=200)
    for row, text in enumerate(texts):
        enc = bert(text, add_special_tokens=False, return_offsets_mapping=True)
        ends = [m.end() for m in re.finditer(r"[.!?]+[\"')\]]*(?=\s|$)|\n[ \t]*\n", text)]
        starts = [s for s, _ in enc["offset_mapping"]]
        boundaries = {i for i in range(len(starts) - 1) if any(starts[i] < end <= starts[i + 1] for end in ends)}
        ids, landmarks = reference_layout(enc["input_ids"], g, 200, boundaries)
        length = int(batch.attention_mask[row].sum())
        assert batch.input_ids[row, :length].tolist() == ids
        assert np.flatnonzero(batch.landmark_mask[row]).tolist() == landmarks


def test_variable_splitter_is_seeded_and_varies(minilm_path):
    first = LMKTokenizer.from_pretrained(minilm_path, lmk_seed=7)
    second = LMKTokenizer.from_pretrained(minilm_path, lmk_seed=7)
    draws = [first.build_layout(["a b c"], splitter="variable").granularity for _ in range(40)]
    assert draws == [second.build_layout(["a b c"], splitter="variable").granularity for _ in range(40)]
    assert set(draws) == {32, 64, 128, 256}
    other = LMKTokenizer.from_pretrained(minilm_path, lmk_seed=8)
    assert draws != [other.build_layout(["a"], splitter="variable").granularity for _ in range(40)]


def test_landmark_spans_cover_their_chunks(tokenizer):
    texts = stdlib_texts(6)
    batch = tokenizer.build_layout(texts, granularity=8, max_length=None, with_spans=True)
    for row, text in enumerate(texts):
        spans = batch.spans[row]
        assert len(spans) == int(batch.landmark_mask[row].sum())
        assert spans[0][0] == 0 and spans[-1][1] == len(text.rstrip())
        assert all(s1 <= s2 for (_, s1), (s2, _) in zip(spans, spans[1:]))


def test_prompt_is_prepended_and_spans_exclude_it(tokenizer, bert):
    out = tokenizer("fox jumps", prompt="query: ", granularity=1000, return_landmark_spans=True)
    assert out["input_ids"][1:-1] == bert("query: fox jumps", add_special_tokens=False)["input_ids"]
    assert out["landmark_spans"] == [(0, 9)]


@pytest.mark.parametrize(
    "pooling, ids, mask",
    [
        ("cls", [CLS, 1037, 1038, 1039, SEP], [1, 0, 0, 0, 0]),
        ("mean", [CLS, 1037, 1038, 1039, SEP], [1, 1, 1, 1, 1]),
        ("latent_attention", [CLS, 1037, 1038, 1039, SEP], [1, 1, 1, 1, 1]),
        ("mean@k", [CLS, 1037, 1038, 1039, SEP], [0, 0, 1, 1, 0]),
        ("multi_cls", [CLS, 1037, 1038, CLS, 1039, SEP], [1, 0, 0, 1, 0, 0]),
    ],
)
def test_baseline_layouts(tokenizer, pooling, ids, mask):
    out = tokenizer("a b c", pooling=pooling, granularity=2)
    assert out["input_ids"] == ids and out["landmark_mask"] == mask


def test_multi_cls_truncation_budget(tokenizer):
    text = " ".join(["word"] * 100)
    with pytest.warns(UserWarning):
        out = tokenizer(text, pooling="multi_cls", granularity=4, max_length=20)
    ids = out["input_ids"]
    assert len(ids) <= 20 and ids[0] == CLS and ids[-1] == SEP and ids.count(CLS) == sum(out["landmark_mask"])


def test_one_rust_pass_is_vectorised_for_random_batches(tokenizer, bert):
    """Random mixes of lengths and granularities agree with the loop reference."""
    rng = random.Random(0)
    words = SAMPLE_TEXT.split()
    texts = [" ".join(rng.choices(words, k=rng.randint(0, 60))) for _ in range(30)]
    for g in (1, 5, 13):
        batch = tokenizer.build_layout(texts, granularity=g, max_length=40)
        for row, text in enumerate(texts):
            ids, _ = reference_layout(bert(text, add_special_tokens=False)["input_ids"], g, 40)
            assert batch.input_ids[row, : len(ids)].tolist() == ids
            assert batch.attention_mask[row].sum() == len(ids)


def test_long_texts_are_cut_before_tokenizing_without_changing_tokens(tokenizer, bert):
    """With a budget, only a safe prefix of a long text is tokenized: same tokens, still flagged."""
    text = " ".join(stdlib_texts(40)) * 5
    batch = tokenizer.build_layout([text], granularity=16, max_length=300)
    ids, _ = reference_layout(bert(text, add_special_tokens=False)["input_ids"], 16, 300)
    assert batch.input_ids[0].tolist() == ids and batch.truncated[0]
    few_long_words = ("x" * 200 + " ") * 500  # 1 token per 201 chars: the prefix is too short, so all is read
    batch = tokenizer.build_layout([few_long_words], granularity=16, max_length=300)
    assert int(batch.attention_mask[0].sum()) == 300 and batch.truncated[0]


def test_a_long_text_is_tokenized_in_pieces_as_in_one_pass(tokenizer):
    """Past `_PIECE_CHARS` a text is read in pieces cut at safe places (the Rust pass holds words per
    character): the same ids and offsets as one pass, a run without a safe cut included, and the
    layout of a text over the threshold built from them."""
    from lmk_embed.encoding import _PIECE_CHARS, content_backend, encode_content, encode_long_content

    backend = content_backend(tokenizer)
    text = " ".join(stdlib_texts(40)) * 3 + " " + "y" * 9000 + "\n\n tail [SEP] end "
    whole = backend.encode(text, add_special_tokens=False)
    for piece_chars in (1000, 4096, 1 << 16):
        pieced = encode_long_content(backend, text, piece_chars)
        assert pieced.ids.tolist() == whole.ids and pieced.offsets.tolist() == [list(o) for o in whole.offsets]
    assert len(text) > _PIECE_CHARS and isinstance(encode_content(tokenizer, [text])[0].ids, np.ndarray)
    counted = encode_long_content(backend, text, 1000, max_tokens=500)  # a budget: read until it is passed
    assert 500 < len(counted.ids) < len(whole.ids) and counted.ids.tolist() == whole.ids[:len(counted.ids)]
    budget = encode_content(tokenizer, [text, "short"], max_tokens=2000)
    assert 2000 < len(budget[0].ids) < len(whole.ids) and len(budget[1].ids) == 1
    batch = tokenizer.build_layout([text, "short"], granularity=16, max_length=None, with_spans=True)
    ids, _ = reference_layout(whole.ids, 16, None)
    assert batch.input_ids[0].tolist() == ids and batch.spans[0][-1][1] == len(text.rstrip())


def test_checkpoint_tokenizer_holds_exactly_the_backbone_vocabulary(minilm_lmk_checkpoint, minilm_path, bert):
    """No option of ours becomes a special token: a checkpoint converted with the default landmark
    ("sep") must not split "separate" as `sep ara ##te` for tools that read tokenizer.json as is."""
    import json

    from tokenizers import Tokenizer

    def added(folder):
        return json.loads((folder / "tokenizer.json").read_text())["added_tokens"]

    assert added(minilm_lmk_checkpoint) == added(minilm_path)
    text = "Separate the sepal from the petal; a [SEP] token separates segments."
    plain = Tokenizer.from_file(str(minilm_lmk_checkpoint / "tokenizer.json"))
    backbone = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    assert plain.encode(text).ids == backbone.encode(text).ids
    loaded = AutoTokenizer.from_pretrained(minilm_lmk_checkpoint, trust_remote_code=True)
    assert loaded.tokenize(text) == bert.tokenize(text)
    assert "separate" in loaded.tokenize(text)
    assert not any(key.endswith("_token") and key.startswith(("lmk_", "rec_")) for key in loaded.init_kwargs)


def test_landmark_option_is_read_from_the_tokenizer_config(minilm_path):
    assert LMKTokenizer.from_pretrained(minilm_path, lmk_landmark="[CLS]").landmark_token_id == CLS
    assert LMKTokenizer.from_pretrained(minilm_path).landmark_token_id != CLS  # default: the SEP token
