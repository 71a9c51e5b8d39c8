"""Parity with the LMK paper's reference code (its FlagEmbedding fork), fixed splitter.

The reference layout is rebuilt here from the code's description, with the backbone's original
tokenizer and nothing of ours:

    text.strip() (lower-cased where the tokenizer lower-cases), tokenized without special tokens,
    cut into chunks of g, laid out as ([CLS] c1 [SEP] c2 [SEP] ... cn [SEP])[:max_length];
    pooled = mean of the final states where input_ids == sep_token_id.

Where the layout fits, ours is identical and so are the vectors. Where it does not, the reference
cuts mid-chunk (possibly dropping the last landmark) while we end on a landmark: the layouts share
every position but the last, and the vectors differ slightly (bounds below, measured in the README).
Literal special tokens in a text are the one documented exception: we keep them as text.
"""

import inspect
import json
import pydoc
import textwrap

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from lmk_embed import LMKModel
from lmk_embed.tokenization_lmk import LMKTokenizer
from tests.helpers import stdlib_texts

MAX_LENGTH = 512

CJK = [
    "Python 的标准库非常庞大，提供了各种各样的功能。json 模块用于编码和解码 JSON 数据。",
    "textwrap モジュールは、テキストの折り返しと詰め込みのための便利な関数を提供します。",
    "파이썬 표준 라이브러리는 매우 광범위하며 다양한 기능을 제공합니다.",
]


def parity_texts() -> list[str]:
    """Real texts: stdlib paragraphs and whole pydoc pages, source code, CJK, stray whitespace."""
    import collections

    pages = [pydoc.render_doc(m, renderer=pydoc.plaintext) for m in (json, textwrap, collections)]
    code = [inspect.getsource(textwrap.dedent), inspect.getsource(textwrap.TextWrapper._split), inspect.getsource(json.decoder)]
    return [*stdlib_texts(12), *pages, *code, *CJK, "".join(CJK) * 12, "  Leading and TRAILING whitespace.\n\n"]


def reference_ids(tokenizer, text: str, g: int, max_length: int) -> list[int]:
    """The reference code's fixed-splitter layout, from its description."""
    text = text.strip()
    if getattr(tokenizer, "do_lower_case", False):
        text = text.lower()
    content = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = [tokenizer.cls_token_id]
    for start in range(0, len(content), g):
        ids += content[start : start + g] + [tokenizer.sep_token_id]
    return ids[:max_length]


@pytest.fixture(scope="module")
def original_tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="module")
def texts():
    return parity_texts()


@pytest.mark.parametrize("g", [8, 32, 100])
def test_layout_is_the_reference_layout_where_the_text_fits(minilm_path, original_tokenizer, texts, g):
    ours = LMKTokenizer.from_pretrained(minilm_path)
    batch = ours.build_layout(texts, pooling="lmk", granularity=g, splitter="fixed", max_length=MAX_LENGTH)
    sep = original_tokenizer.sep_token_id
    fitting = truncated = 0
    for row, text in enumerate(texts):
        ids = batch.input_ids[row][batch.attention_mask[row] == 1].tolist()
        full = reference_ids(original_tokenizer, text, g, 10**9)
        reference = full[:MAX_LENGTH]
        if len(full) <= MAX_LENGTH:
            fitting += 1
            assert not batch.truncated[row]
            assert ids == reference, (g, text[:60])
            # The positions we pool are exactly the reference's `input_ids == sep_token_id`.
            assert np.flatnonzero(batch.landmark_mask[row]).tolist() == [i for i, t in enumerate(reference) if t == sep]
        else:
            truncated += 1
            assert batch.truncated[row]
            # Same positions but the last, where we put a landmark and the reference may cut mid-chunk.
            assert len(ids) >= MAX_LENGTH - 1 and ids[-1] == sep
            assert ids[:-1] == reference[: len(ids) - 1], (g, text[:60])
    assert fitting >= 15 and truncated >= 4  # both cases are really exercised


def test_vectors_equal_the_reference_pooling(minilm_path, minilm_lmk_checkpoint, original_tokenizer, texts):
    """Our LMK vectors (g=32, 512 tokens) against the reference pooling on MiniLM itself."""
    backbone = AutoModel.from_pretrained(minilm_path).eval()
    model = LMKModel.from_pretrained(minilm_lmk_checkpoint).eval()
    ours = model.encode(texts, batch_size=4, max_length=MAX_LENGTH, granularity=32, splitter="fixed", convert_to_tensor=True)
    sep = original_tokenizer.sep_token_id
    fitting_diff, truncated_gap = [], []
    with torch.inference_mode():
        for row, text in enumerate(texts):
            ids = torch.tensor([reference_ids(original_tokenizer, text, 32, MAX_LENGTH)])
            hidden = backbone(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
            reference = torch.nn.functional.normalize(hidden[ids[0] == sep].mean(0), dim=-1)
            if len(reference_ids(original_tokenizer, text, 32, 10**9)) <= MAX_LENGTH:
                fitting_diff.append(float((ours[row] - reference).abs().max()))
            else:
                truncated_gap.append(1 - float(ours[row] @ reference))
    assert len(fitting_diff) >= 15 and len(truncated_gap) >= 4
    assert max(fitting_diff) <= 1e-5
    # Truncated: only the tail differs (1 - cos measured: median 3.4e-4, max 6.6e-4; see the README).
    print("max abs diff where it fits:", max(fitting_diff), "1 - cos where truncated:", sorted(truncated_gap))
    assert np.median(truncated_gap) <= 1e-3 and max(truncated_gap) <= 5e-3, truncated_gap


def test_literal_special_tokens(minilm_path, original_tokenizer):
    """A literal "[SEP]" in the text. MiniLM lower-cases, so the reference turns it into "[sep]",
    plain text, as we do. For a case-preserving tokenizer the reference would make it a landmark
    and pool it; we keep it as text: the one documented difference."""
    ours = LMKTokenizer.from_pretrained(minilm_path)
    text = "split here [SEP] and go on"
    ids = ours(text, granularity=32)["input_ids"]
    sep = original_tokenizer.sep_token_id
    assert ids == reference_ids(original_tokenizer, text, 32, MAX_LENGTH) and ids.count(sep) == 1
    assert original_tokenizer.convert_tokens_to_ids(["[", "sep", "]"]) == ids[3:6]
    case_preserving = original_tokenizer(text, add_special_tokens=False)["input_ids"]  # what the reference tokenizes then
    assert case_preserving.count(sep) == 1  # the literal would become a real landmark there
