"""Recurrent embedders: the SSD scan, vertical = horizontal = transformers' own forward at EOS,
streaming, gradients through the carried state, xLSTM, instructions, bad input."""

import copy
import io
import pathlib
import warnings

import numpy as np
import pytest
import torch
from transformers import Mamba2Model

import lmk_embed.ssd as ssd
from lmk_embed.configuration_recurrent import RecurrentEmbedConfig
from lmk_embed.modeling_recurrent import RecurrentEmbedModel
from lmk_embed.ssd import ssd_chunked, ssd_reference
from lmk_embed.tokenization_recurrent import RecurrentEmbedTokenizer
from tests.helpers import SAMPLE_TEXT, stdlib_texts, tiny_mamba2_config

Q, V = 16, 40  # Mamba2 chunk size and a block size that is not a multiple of it (see conftest)


@pytest.fixture(scope="module")
def model(mamba2_checkpoint):
    return RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).eval()


def reference_eos_states(model, ids_rows):
    """transformers' own Mamba2Model full forward, one sequence at a time, state at the last token."""
    reference = Mamba2Model(model.config.backbone_config).eval()
    reference.load_state_dict(model.backbone.state_dict())
    with torch.no_grad():
        return torch.stack([reference(torch.tensor([ids])).last_hidden_state[0, -1] for ids in ids_rows])


def padded_batch(lengths, vocab_size, low=1):
    """Random ids [b, max(lengths)] from [low, vocab_size), and the attention mask of `lengths`."""
    ids = torch.randint(low, vocab_size, (len(lengths), max(lengths)))
    return ids, (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long()


def last_states_row_by_row(backbone, ids, lengths, **kwargs):
    """The backbone's own full forward on each row's real tokens: the final-layer state at its last token."""
    return torch.stack([backbone(ids[i : i + 1, :n], **kwargs).last_hidden_state[0, -1] for i, n in enumerate(lengths)])


# ---- the scan --------------------------------------------------------------------------------


@pytest.mark.parametrize("t, chunk", [(1, 4), (15, 4), (16, 16), (37, 8), (50, 64)])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("groups", [1, 2])  # one group takes all heads in one product: another layout
def test_chunked_scan_equals_the_recurrence(t, chunk, with_state, groups):
    torch.manual_seed(t)
    b, h, p, g, n = 2, 4, 8, groups, 6
    x, B, C = torch.randn(b, t, h, p), torch.randn(b, t, g, n), torch.randn(b, t, g, n)
    dt, A, D = torch.rand(b, t, h) * 0.5, -torch.rand(h) * 2, torch.randn(h)
    state = torch.randn(b, h, p, n) if with_state else None
    y_ref, s_ref = ssd_reference(x, dt, A, B, C, D, state)
    y, s = ssd_chunked(x, dt, A, B, C, D, chunk, state)
    torch.testing.assert_close(y, y_ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s, s_ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("decay, spans, log_space", [
    (1.0, [64], False),  # every chunk of 64 within the factored form's range
    (3.0, [64, 32], False),  # chunks of 64 would not be: halved to 32
    (8.0, [64, 32], True),  # nor would chunks of 32: the log-space form
])
def test_chunked_scan_holds_for_strong_decay(monkeypatch, decay, spans, log_space):
    """Strong decay (a log decay up to -`decay` per token) takes the scan off its factored form:
    every path must still equal the recurrence."""
    seen, fallbacks = [], []
    chunk_cumsum, fallback = ssd._chunk_cumsum, ssd._ssd_chunked_log_space
    monkeypatch.setattr(ssd, "_chunk_cumsum", lambda log_decay, q: seen.append(q) or chunk_cumsum(log_decay, q))
    monkeypatch.setattr(ssd, "_ssd_chunked_log_space", lambda *a: fallbacks.append(1) or fallback(*a))
    torch.manual_seed(0)
    b, t, h, p, g, n = 2, 150, 4, 8, 2, 6
    x, B, C = torch.randn(b, t, h, p), torch.randn(b, t, g, n), torch.randn(b, t, g, n)
    dt, A, D = 0.5 + torch.rand(b, t, h) * 0.5, -torch.full((h,), decay), torch.randn(h)
    state = torch.randn(b, h, p, n)
    y_ref, s_ref = ssd_reference(x, dt, A, B, C, D, state)
    y, s = ssd_chunked(x, dt, A, B, C, D, 64, state)
    assert seen == spans and bool(fallbacks) == log_space
    torch.testing.assert_close(y, y_ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s, s_ref, atol=2e-5, rtol=1e-4)


def test_ssd_scan_off_cuda_is_the_chunked_scan_of_the_discretised_step():
    """`ssd_scan`, what the Mamba2 mixer calls, discretises the raw time step as transformers does
    (softplus of dt + bias, clamped) and then, off CUDA, is `ssd_chunked` bit for bit; both equal
    the per-token recurrence to float32 rounding."""
    torch.manual_seed(0)
    b, t, h, p, g, n = 2, 37, 4, 8, 2, 6
    x, B, C = torch.randn(b, t, h, p), torch.randn(b, t, g, n), torch.randn(b, t, g, n)
    raw_dt, dt_bias, A, D = torch.randn(b, t, h), torch.randn(h), -torch.rand(h) * 2, torch.randn(h)
    state, limit = torch.randn(b, h, p, n), (0.02, 0.3)
    y, s = ssd.ssd_scan(x, raw_dt, A, B, C, D, dt_bias, limit, 8, kernel_chunk_size=16, initial_state=state)
    dt = torch.clamp(torch.nn.functional.softplus(raw_dt + dt_bias), min=limit[0], max=limit[1])
    y_chunked, s_chunked = ssd_chunked(x, dt, A, B, C, D, 8, state)
    assert torch.equal(y, y_chunked) and torch.equal(s, s_chunked)
    y_ref, s_ref = ssd_reference(x, dt, A, B, C, D, state)
    torch.testing.assert_close(y, y_ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s, s_ref, atol=2e-5, rtol=1e-4)


# ---- exactness against transformers' Mamba2Model ----------------------------------------------


@pytest.mark.parametrize("length", [1, Q - 1, Q, V, V + 1, 3 * V + 17])
def test_vertical_horizontal_and_reference_agree(model, length):
    torch.manual_seed(length)
    ids = torch.randint(1, 600, (1, length))
    expected = reference_eos_states(model, ids.tolist())
    with torch.no_grad():
        vertical = model(ids, schedule="vertical").embeddings
        horizontal = model(ids, schedule="horizontal").embeddings
    assert (vertical - expected).abs().max() <= 1e-4
    assert (horizontal - expected).abs().max() <= 1e-4


def test_vertical_in_bfloat16_follows_transformers_in_bfloat16(mamba2_checkpoint):
    """Loaded with dtype=torch.bfloat16 (the projections' fast path on CPUs with bf16 instructions),
    the vertical schedule gives transformers' own bf16 forward to bf16 rounding, and stays near float32."""
    model32 = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).eval()
    model16 = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint, dtype=torch.bfloat16).eval()
    assert model16.backbone.layers[0].mixer.in_proj.weight.dtype == torch.bfloat16
    reference = copy.deepcopy(model16.backbone)
    torch.manual_seed(3)
    ids = torch.randint(1, 600, (1, 3 * V + 17))
    with torch.no_grad():
        vertical = model16(ids, schedule="vertical").embeddings
        expected = reference(ids).last_hidden_state[:, -1].float()
        full = model32(ids, schedule="vertical").embeddings
    assert vertical.dtype == torch.float32
    cosine = torch.nn.functional.cosine_similarity
    assert cosine(vertical, expected).min() >= 0.999
    assert cosine(vertical, full).min() >= 0.999


@pytest.mark.parametrize("block_size", [V, 7, 16, 1000])
def test_mixed_length_batch(model, block_size):
    torch.manual_seed(1)
    lengths = [3 * V + 17, 2, V + 1, Q, 1]
    rows = [torch.randint(1, 600, (n,)).tolist() for n in lengths]
    ids = torch.zeros(len(rows), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    with torch.no_grad():
        vertical = model(ids, mask, schedule="vertical", block_size=block_size).embeddings
        horizontal = model(ids, mask, schedule="horizontal").embeddings
    expected = reference_eos_states(model, rows)
    assert (vertical - expected).abs().max() <= 1e-4
    assert (horizontal - expected).abs().max() <= 1e-4


def test_finished_sequences_leave_the_batch(model, monkeypatch):
    """Blocks only run on unfinished rows, and never past the longest remaining one."""
    shapes = []
    step = model.block_step
    monkeypatch.setattr(model, "block_step", lambda ids, state: shapes.append(tuple(ids.shape)) or step(ids, state))
    ids = torch.randint(1, 600, (3, 100))
    mask = (torch.arange(100)[None] < torch.tensor([[100], [45], [10]])).long()
    with torch.no_grad():
        model(ids, mask, schedule="vertical", block_size=40)
    assert shapes == [(3, 40), (2, 40), (1, 20)]


def test_auto_schedule(model, monkeypatch):
    """Mamba2 on CPU: `auto` always runs our scan (one block when T <= V), in training too; the
    backbone's own torch forward, the slow path, never runs."""
    calls = []
    step = model.block_step
    monkeypatch.setattr(model, "block_step", lambda ids, state: calls.append(1) or step(ids, state))
    monkeypatch.setattr(model.backbone, "forward", lambda *a, **k: pytest.fail("the backbone's own forward ran"))
    with torch.no_grad():
        model(torch.randint(1, 600, (1, V)))
        assert len(calls) == 1  # T <= V: one block
        model(torch.randint(1, 600, (1, V + 1)))
        assert len(calls) == 3  # two blocks
    model.train()
    try:
        model(torch.randint(1, 600, (2, 8))).embeddings.sum().backward()
    finally:
        model.eval().zero_grad(set_to_none=True)
    assert len(calls) == 4


def test_final_states_match_transformers_cache(model):
    """The carried per-layer states equal the ones transformers' own cache holds."""
    ids = torch.randint(1, 600, (2, 2 * V + 5))
    with torch.no_grad():
        _, ours = model.block_step(ids[:, :V], None)
        _, ours = model.block_step(ids[:, V:], ours)
        theirs = model.backbone(ids, use_cache=True).cache_params
    for layer, state in enumerate(ours.layers):
        torch.testing.assert_close(state.ssm_state, theirs.layers[layer].recurrent_states[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(state.conv_state, theirs.layers[layer].conv_states[0][..., 1:], atol=1e-6, rtol=0)


def test_encode_agrees_with_reference_on_text(model):
    texts = [SAMPLE_TEXT * 4, "short", "", SAMPLE_TEXT]
    tokenizer = model.tokenizer
    rows = [tokenizer(t)["input_ids"] for t in texts]
    expected = torch.nn.functional.normalize(reference_eos_states(model, rows), dim=-1).numpy()
    for schedule in ("auto", "vertical", "horizontal"):
        got = model.encode(texts, schedule=schedule, batch_size=3)
        assert np.abs(got - expected).max() <= 1e-4


# ---- gradients through the carried state -------------------------------------------------------


def test_one_training_step_vertical_matches_horizontal(mamba2_checkpoint):
    torch.manual_seed(0)
    ids = torch.randint(1, 600, (3, 3 * V + 5))
    mask = (torch.arange(ids.shape[1])[None] < torch.tensor([[3 * V + 5], [V + 2], [9]])).long()
    params = {}
    for schedule in ("horizontal", "vertical"):
        model = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        embeddings = torch.nn.functional.normalize(model(ids, mask, schedule=schedule).embeddings, dim=-1)
        loss = (embeddings @ torch.linspace(-1, 1, embeddings.shape[1])).square().mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        params[schedule] = ({n: p.detach().clone() for n, p in model.named_parameters()}, grads)
    (p_h, g_h), (p_v, g_v) = params["horizontal"], params["vertical"]
    assert g_h.keys() == g_v.keys() and len(g_h) > 10
    assert any(g.abs().sum() > 0 for n, g in g_v.items() if "A_log" in n)  # reaches the carried SSM state
    for name in g_h:
        scale = g_h[name].abs().max().item() + 1e-8
        assert (g_v[name] - g_h[name]).abs().max().item() <= 1e-4 * max(scale, 1.0), name
        assert (p_v[name] - p_h[name]).abs().max().item() <= 1e-5 * max(scale, 1.0), name


# ---- streaming ----------------------------------------------------------------------------------


def random_pieces(text, rng):
    cuts = sorted(rng.choice(len(text), size=min(40, len(text)), replace=False).tolist())
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("tokenizer_kind", ["bpe", "wordpiece"])
def test_incremental_tokenization_equals_full(tokenizer_kind, bpe_tokenizer_dir, minilm_path, monkeypatch):
    import lmk_embed.tokenization_recurrent as module

    monkeypatch.setattr(module, "STREAM_MIN_CHARS", 50)  # force many cuts
    source = bpe_tokenizer_dir if tokenizer_kind == "bpe" else minilm_path
    tokenizer = RecurrentEmbedTokenizer.from_pretrained(source, eos_token="<|endoftext|>" if tokenizer_kind == "bpe" else "[SEP]")
    rng = np.random.default_rng(0)
    text = "\n\n".join(stdlib_texts(30)) + "  double  spaces,\ttabs\n and trailing "
    full = tokenizer.build_batch([text]).input_ids[0, :-1].tolist()
    streamed = np.concatenate(list(tokenizer.stream_content_ids(random_pieces(text, rng)))).tolist()
    assert streamed == full


def test_streaming_matches_encoding_the_concatenated_text(model, tmp_path, monkeypatch):
    import lmk_embed.tokenization_recurrent as module

    monkeypatch.setattr(module, "STREAM_MIN_CHARS", 64)
    text = "\n".join(stdlib_texts(8))  # about 24k characters: hundreds of blocks of V tokens
    rng = np.random.default_rng(1)
    expected = model.encode(text, schedule="vertical", block_size=V)
    assert np.abs(model.encode(text, schedule="horizontal") - expected).max() <= 1e-4
    from_iterator = model.encode_stream(iter(random_pieces(text, rng)), block_size=V)
    path = tmp_path / "doc.txt"
    path.write_text(text, encoding="utf-8")
    from_path = model.encode(pathlib.Path(path), block_size=V)
    mixed = model.encode(["short", pathlib.Path(path), text], block_size=V)
    assert np.abs(from_iterator - expected).max() <= 1e-4
    assert np.abs(from_path - expected).max() <= 1e-4
    assert np.abs(mixed[1] - expected).max() <= 1e-4
    assert np.abs(mixed[2] - expected).max() <= 1e-4
    assert np.abs(mixed[0] - model.encode("short")).max() <= 1e-4


def test_a_configured_horizontal_schedule_still_streams_but_an_asked_one_is_refused(model, tmp_path, monkeypatch):
    """The config's schedule is a default for batches of texts; a streamed document reads vertically
    unless the call itself asks for "horizontal", which cannot stream."""
    path = tmp_path / "doc.txt"
    path.write_text("\n".join(stdlib_texts(3)), encoding="utf-8")
    expected = model.encode(pathlib.Path(path), block_size=V)
    monkeypatch.setattr(model.config, "schedule", "horizontal")
    np.testing.assert_allclose(model.encode(pathlib.Path(path), block_size=V), expected, atol=1e-6)
    with pytest.raises(ValueError, match="`schedule='horizontal'` cannot stream"):
        model.encode(pathlib.Path(path), schedule="horizontal")


def test_streaming_never_holds_the_whole_document(model, monkeypatch):
    """Peak pending tokens stay below a block (+ one tokenized piece), however long the stream."""
    import lmk_embed.tokenization_recurrent as module

    monkeypatch.setattr(module, "STREAM_MIN_CHARS", 200)
    seen = []
    step = model.block_step
    monkeypatch.setattr(model, "block_step", lambda ids, state: seen.append(ids.shape[1]) or step(ids, state))
    pieces = (f"piece number {i} of a long stream. " for i in range(400))
    model.encode_stream(pieces, block_size=V)
    assert len(seen) > 40 and max(seen) <= V


def test_empty_stream_is_the_empty_text(model):
    np.testing.assert_allclose(model.encode_stream(iter([])), model.encode(""), atol=1e-5)
    assert model.encode(iter([])).shape == (0, model.config.embedding_dim)  # no texts


def test_stream_bad_pieces_and_missing_file(model):
    with pytest.raises(TypeError, match="piece 1"):
        model.encode_stream(iter(["ok", 3]))
    with pytest.raises(FileNotFoundError):
        model.encode(pathlib.Path("/nonexistent/doc.txt"))
    with pytest.raises(ValueError, match="horizontal"):
        model.encode(pathlib.Path(__file__), schedule="horizontal")


def test_streaming_truncation_warns_once(model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vector = model.encode_stream(iter(["word "] * 5000), max_length=50)
    assert sum("truncated" in str(w.message) for w in caught) == 1
    np.testing.assert_allclose(vector, model.encode("word " * 5000, max_length=50), atol=1e-4)


# ---- EOS, instructions -----------------------------------------------------------------------


def test_eos_is_appended_once(model):
    tokenizer = model.tokenizer
    eos = tokenizer.eos_token_id
    plain = tokenizer("some text")["input_ids"]
    assert plain[-1] == eos and plain.count(eos) == 1
    assert tokenizer("some text<|endoftext|>")["input_ids"] == plain
    inside = tokenizer("a <|endoftext|> b")["input_ids"]
    assert inside.count(eos) == 1 and inside[-1] == eos  # literal EOS inside the text is plain text
    np.testing.assert_allclose(model.encode("some text<|endoftext|>"), model.encode("some text"), atol=1e-6)


def test_instructions_on_queries_only(model):
    assert model.config.query_prompt() == f"Instruct: {model.config.default_task}\nQuery: "
    np.testing.assert_allclose(model.encode_document(["doc"]), model.encode(["doc"]), atol=1e-6)
    np.testing.assert_allclose(
        model.encode_query(["q"], task="Find code"), model.encode(["q"], prompt="Instruct: Find code\nQuery: "), atol=1e-6
    )
    assert not np.allclose(model.encode_query(["q"]), model.encode(["q"]))


def test_sentence_transformers_prompts(mamba2_checkpoint):
    import json

    config = json.loads((mamba2_checkpoint / "config_sentence_transformers.json").read_text())
    assert config["prompts"]["query"].startswith("Instruct: ") and config["prompts"]["query"].endswith("\nQuery: ")
    assert config["prompts"]["document"] == ""


# ---- real release shapes ------------------------------------------------------------------------


@pytest.mark.parametrize("time_step_limit", [(0.0, float("inf")), (0.02, 0.3)])
def test_codestral_shaped_mamba2_vertical_matches_transformers(time_step_limit):
    """Mamba-Codestral-7B's layout at toy width: 8 groups, head_dim 64, conv bias, fp32 residual,
    gate applied before the norm (its `norm_before_gate: false`), and a time-step clamp."""
    torch.manual_seed(0)
    backbone = tiny_mamba2_config(
        vocab_size=300, hidden_size=256, num_heads=8, head_dim=64, n_groups=8, state_size=16, expand=2,
        use_conv_bias=True, use_bias=False, residual_in_fp32=True, norm_before_gate=False,
        time_step_limit=time_step_limit, chunk_size=Q,
    )
    model = RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict(), block_size=V)).eval()
    for module in model.backbone.modules():  # non-zero conv biases, so that use_conv_bias matters
        if isinstance(module, torch.nn.Conv1d) and module.bias is not None:
            torch.nn.init.normal_(module.bias, std=0.5)
    lengths = [3 * V + 17, V + 1, Q, 1]
    ids, mask = padded_batch(lengths, 300)
    with torch.no_grad():
        vertical = model(ids, mask, schedule="vertical").embeddings
        expected = last_states_row_by_row(model.backbone, ids, lengths)
    assert (vertical - expected).abs().max() <= 1e-4


# ---- xLSTM ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("qk_dim_factor", [1.0, 0.5])
def test_xlstm_vertical_matches_horizontal_and_reference(qk_dim_factor):
    from transformers import xLSTMConfig

    torch.manual_seed(0)
    backbone = xLSTMConfig(
        vocab_size=300, hidden_size=64, num_heads=4, num_blocks=2, qk_dim_factor=qk_dim_factor, chunk_size=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    model = RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict(), block_size=V)).eval()
    lengths = [3 * V + 17, V + 1, Q, 1]
    ids, mask = padded_batch(lengths, 300, low=3)
    with torch.no_grad():
        vertical = model(ids, mask, schedule="vertical").embeddings
        horizontal = model(ids, mask, schedule="horizontal").embeddings
        expected = last_states_row_by_row(model.backbone, ids, lengths, use_cache=False)
    assert (vertical - expected).abs().max() <= 1e-4
    assert (horizontal - expected).abs().max() <= 1e-4


# ---- the state interface ------------------------------------------------------------------------


def test_every_carried_backbone_has_its_own_block_step():
    from lmk_embed.modeling_recurrent import STATE_CARRIERS, StateCarrier

    assert set(STATE_CARRIERS) == {"mamba2", "xlstm", "rwkv", "rwkv7"}
    for model_type, carrier in STATE_CARRIERS.items():
        assert issubclass(carrier, StateCarrier) and carrier.block_step is not StateCarrier.block_step, model_type


def test_a_family_added_to_the_carriers_needs_no_other_change(monkeypatch):
    """The model asks only its `StateCarrier`: registering one for GPT-2 (its KV cache as the carried
    state) makes the vertical schedule run, and equal the horizontal one."""
    from dataclasses import dataclass

    from transformers import DynamicCache, GPT2Config

    import lmk_embed.modeling_recurrent as recurrent

    @dataclass
    class CacheState:
        cache: DynamicCache

    class Gpt2Carrier(recurrent.StateCarrier):
        @staticmethod
        def block_step(model, input_ids, state):
            cache = DynamicCache() if state is None else state.cache
            output = model.backbone(input_ids=input_ids, past_key_values=cache, use_cache=True)
            return output.last_hidden_state, CacheState(output.past_key_values)

    monkeypatch.setitem(recurrent.STATE_CARRIERS, "gpt2", Gpt2Carrier)
    torch.manual_seed(0)
    backbone = GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=256)
    model = RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict())).eval()
    ids = torch.randint(0, 100, (1, 23))
    with torch.no_grad():
        vertical = model(ids, schedule="vertical", block_size=5).embeddings
        horizontal = model(ids, schedule="horizontal").embeddings
    torch.testing.assert_close(vertical, horizontal, atol=1e-5, rtol=1e-4)


# ---- bad input --------------------------------------------------------------------------------------


def test_bad_schedule_and_block_size(model):
    with pytest.raises(ValueError, match="`schedule`"):
        model.encode(["x"], schedule="diagonal")
    for bad in (0, -1):
        with pytest.raises(ValueError, match="`block_size`"):
            model.encode(["x"], block_size=bad)
    with pytest.raises(ValueError, match="`schedule`"):
        RecurrentEmbedConfig(backbone_config=tiny_mamba2_config().to_dict(), schedule="diagonal")
    with pytest.raises(ValueError, match="`block_size`"):
        RecurrentEmbedConfig(backbone_config=tiny_mamba2_config().to_dict(), block_size=0)


def test_vertical_needs_a_stateful_backbone():
    from transformers import GPT2Config

    backbone = GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=256)
    model = RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict())).eval()
    ids = torch.randint(0, 100, (1, 10))
    with pytest.raises(ValueError, match="carries recurrent state"):
        model(ids, schedule="vertical")
    assert model(ids, schedule="auto", block_size=4).embeddings.shape == (1, 32)  # auto falls back


def test_lmk_bad_input_list_applies(model):
    with pytest.raises(TypeError, match="`texts`"):
        model.encode(None)
    with pytest.raises(TypeError, match=r"`texts\[1\]`"):
        model.encode(["a", 5])
    assert model.encode([]).shape == (0, 64)
    with pytest.raises(ValueError, match="`max_length`"):
        model.encode(["x"], max_length=1)
    vector = model.encode("")
    assert np.isfinite(vector).all() and abs(np.linalg.norm(vector) - 1) < 1e-5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.encode("lorem ipsum " * 90_000, max_length=300)
    assert sum("truncated" in str(w.message) for w in caught) == 1


def test_tokenizer_without_eos(tmp_path, bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    bare.eos_token = None
    bare.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no EOS"):
        RecurrentEmbedTokenizer.from_pretrained(tmp_path)("x")


def test_converter_drops_the_lm_head(mamba2_checkpoint):
    from safetensors import safe_open

    with safe_open(mamba2_checkpoint / "model.safetensors", "pt") as handle:
        keys = list(handle.keys())
    assert keys and all(k.startswith("backbone.") for k in keys) and not any("lm_head" in k for k in keys)


def test_bfloat16_vertical(mamba2_checkpoint):
    fp32 = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).eval()
    bf16 = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint, dtype=torch.bfloat16).eval()
    text = SAMPLE_TEXT * 3
    a, b = fp32.encode(text, schedule="vertical"), bf16.encode(text, schedule="vertical")
    assert b.dtype == np.float32 and float(a @ b) > 0.98


def test_long_texts_are_tokenized_piecewise_with_the_same_ids(model, monkeypatch):
    import lmk_embed.tokenization_recurrent as module
    from lmk_embed.encoding import encode_content

    tokenizer = model.tokenizer
    text = "\n\n".join(stdlib_texts(40)) + "<|endoftext|>"
    expected = np.asarray(encode_content(tokenizer, [text[: -len("<|endoftext|>")]])[0].ids).tolist()
    monkeypatch.setattr(module, "LONG_TEXT_CHARS", 300)
    monkeypatch.setattr(module, "STREAM_MIN_CHARS", 100)
    batch = tokenizer.build_batch([text, "short"])
    assert batch.input_ids[0, : batch.lengths[0] - 1].tolist() == expected
    assert batch.input_ids[0, batch.lengths[0] - 1] == tokenizer.eos_token_id
    cut = tokenizer.build_batch([text], max_length=200)
    assert cut.truncated[0] and cut.input_ids[0, :199].tolist() == expected[:199]


def test_rwkv_vertical_matches_horizontal():
    from transformers import RwkvConfig

    torch.manual_seed(0)
    backbone = RwkvConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                          intermediate_size=64, context_length=1024, bos_token_id=0, eos_token_id=0)
    model = RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict(), block_size=7)).eval()
    lengths = [23, 7, 8, 1]
    ids, mask = padded_batch(lengths, 200)
    with torch.no_grad():
        vertical = model(ids, mask, schedule="vertical").embeddings
        expected = last_states_row_by_row(model.backbone, ids, lengths)
    assert (vertical - expected).abs().max() <= 1e-4

