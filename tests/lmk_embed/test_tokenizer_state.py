"""The tokenizer a model uses: shared Rust backends are never reconfigured, concurrent encodes agree
with sequential ones, and the lazily loaded tokenizer comes from where the model was loaded
(revision, cache_dir, subfolder)."""

import json
import os
import shutil
import threading

import numpy as np
import pytest
from transformers import AutoModel, AutoTokenizer

from lmk_embed_tools.push import install_in_hub_cache
from tests.helpers import SAMPLE_TEXT

# Literal special tokens and long texts: the paths where settings on the backend would matter.
TEXTS = [
    "How do I parse JSON in Python?",
    "a literal [SEP] and [CLS] stay plain text [SEP]",
    SAMPLE_TEXT,
    "word " * 300,
    "",
]


def backend_settings(tokenizer):
    backend = tokenizer.backend_tokenizer
    return backend.truncation, backend.padding, backend.encode_special_tokens


@pytest.fixture(scope="module")
def lmk(minilm_lmk_checkpoint):
    from lmk_embed import LMKModel

    return LMKModel.from_pretrained(minilm_lmk_checkpoint).eval()


def test_encoding_leaves_the_shared_backend_settings_alone(lmk, mamba2_checkpoint):
    from lmk_embed import RecurrentEmbedModel

    # MiniLM's tokenizer.json truncates and pads at 128: settings that belong to the backend's user.
    before = backend_settings(lmk.tokenizer)
    assert before[0] is not None and before[1] is not None and before[2] is False
    lmk.encode(TEXTS)
    lmk.tokenizer(TEXTS, granularity=8)
    assert backend_settings(lmk.tokenizer) == before
    # ...and the backend's own encode still applies them.
    assert len(lmk.tokenizer.backend_tokenizer.encode("word " * 300).ids) == before[0]["max_length"]

    recurrent = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).eval()
    before = backend_settings(recurrent.tokenizer)
    recurrent.encode(["text with a literal <|endoftext|> inside", "short"])
    assert backend_settings(recurrent.tokenizer) == before


def test_tokens_added_after_first_use_are_seen(minilm_path):
    from lmk_embed.tokenization_lmk import LMKTokenizer

    tokenizer = LMKTokenizer.from_pretrained(minilm_path)
    before = tokenizer("a zyxwvut b", granularity=8)["input_ids"]
    tokenizer.add_tokens(["zyxwvut"])
    after = tokenizer("a zyxwvut b", granularity=8)["input_ids"]
    assert after != before and tokenizer.convert_tokens_to_ids("zyxwvut") in after


def concurrent_results(encode, rounds: int = 4, threads: int = 2):
    barrier = threading.Barrier(threads)
    results, errors = [], []

    def work():
        try:
            barrier.wait()
            for _ in range(rounds):
                results.append(encode())
        except Exception as error:  # re-raised in the main thread below
            errors.append(error)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return results


def test_two_threads_encode_like_sequential_calls(lmk, mamba2_checkpoint):
    from lmk_embed import RecurrentEmbedModel

    texts = TEXTS[:3] * 2
    sequential = lmk.encode(texts, batch_size=2)
    results = concurrent_results(lambda: lmk.encode(texts, batch_size=2))
    assert len(results) == 8
    for result in results:
        np.testing.assert_allclose(result, sequential, atol=1e-5, rtol=0)
    assert backend_settings(lmk.tokenizer)[2] is False

    recurrent = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).eval()
    texts = ["plain text <|endoftext|> with a literal EOS", "another short text", SAMPLE_TEXT[:300]]
    sequential = recurrent.encode(texts, batch_size=1)
    for result in concurrent_results(lambda: recurrent.encode(texts, batch_size=1), rounds=2):
        np.testing.assert_allclose(result, sequential, atol=1e-5, rtol=0)


# ---- where the lazily loaded tokenizer comes from ---------------------------------------------


def uncased_off(checkpoint, folder):
    """A copy of `checkpoint` whose tokenizer keeps case: capitalised words become other tokens."""
    shutil.copytree(checkpoint, folder)
    tokenizer_json = json.loads((folder / "tokenizer.json").read_text())
    tokenizer_json["normalizer"]["lowercase"] = False
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["do_lower_case"] = False
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


QUERY = ["How Do I Parse JSON In Python?"]


def test_tokenizer_follows_the_revision(minilm_lmk_checkpoint, tmp_path):
    repo = "our-org/two-revisions"
    cache = os.environ["HF_HUB_CACHE"]  # the offline cache the tests run against
    dev = install_in_hub_cache(uncased_off(minilm_lmk_checkpoint, tmp_path / "dev"), repo, cache)
    main = install_in_hub_cache(minilm_lmk_checkpoint, repo, cache)  # refs/main -> main
    refs = os.path.join(cache, "models--our-org--two-revisions", "refs")
    with open(os.path.join(refs, "dev"), "w") as handle:
        handle.write(dev)
    assert main != dev

    for revision in ("dev", dev):
        model = AutoModel.from_pretrained(repo, revision=revision, trust_remote_code=True)
        expected = AutoTokenizer.from_pretrained(repo, revision=revision, trust_remote_code=True)
        assert model.tokenizer.tokenize(QUERY[0]) == expected.tokenize(QUERY[0])
        assert model.tokenizer.backend_tokenizer.normalizer.lowercase is False
    on_main = AutoModel.from_pretrained(repo, trust_remote_code=True)
    assert on_main.tokenizer.tokenize(QUERY[0]) != model.tokenizer.tokenize(QUERY[0])
    assert np.abs(model.encode(QUERY) - on_main.encode(QUERY)).max() > 1e-3


def test_tokenizer_follows_cache_dir_and_subfolder(minilm_lmk_checkpoint, tmp_path):
    cache = tmp_path / "own-cache"
    install_in_hub_cache(minilm_lmk_checkpoint, "our-org/own-cache", cache)
    model = AutoModel.from_pretrained("our-org/own-cache", cache_dir=str(cache), trust_remote_code=True)
    reference = AutoModel.from_pretrained(minilm_lmk_checkpoint, trust_remote_code=True)
    np.testing.assert_allclose(model.encode(QUERY), reference.encode(QUERY), atol=1e-6, rtol=0)

    repo = tmp_path / "repo"  # a folder with the checkpoint in a subfolder only
    uncased_off(minilm_lmk_checkpoint, repo / "cased")
    model = AutoModel.from_pretrained(str(repo), subfolder="cased", trust_remote_code=True)
    assert model.tokenizer.backend_tokenizer.normalizer.lowercase is False
