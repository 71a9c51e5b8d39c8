"""`lmk-embed export-onnx` and `backend="onnx"`: the graphs written into a checkpoint, the same vectors as
the torch encode() (within 1e-4) through AutoModel and SentenceTransformer, extended position tables at
1k-4k tokens, int8, the missing-onnxruntime error, the recurrent refusal, encode-corpus --backend onnx,
and push staging, scanning and validating the graphs (its clean process loads them by path and by model
id from a Hub-cache layout, offline, from another working directory)."""

import json
import shutil
import sys

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from lmk_embed import LMKModel  # noqa: E402
from lmk_embed.modeling_lmk import LMKOnnxModel  # noqa: E402
from lmk_embed.onnx_backend import FP32_FILE, QUANTIZED_FILES  # noqa: E402
from lmk_embed_tools import cli, push  # noqa: E402
from lmk_embed_tools.model_cards import write_card  # noqa: E402
from tests.helpers import SAMPLE_TEXT, tiny_encoder_source  # noqa: E402

INT8_FILE = QUANTIZED_FILES["int8"]
TEXTS = ["How do I parse JSON in Python?", SAMPLE_TEXT, SAMPLE_TEXT * 4, "Zip archives.", ""]


@pytest.fixture(scope="module")
def exported(lmk_checkpoint, tmp_path_factory):
    """The tiny ModernBERT LMK checkpoint with both graphs, written by the command."""
    folder = shutil.copytree(lmk_checkpoint, tmp_path_factory.mktemp("onnx") / "lmk")
    assert cli.main(["export-onnx", str(folder), "--quantize", "int8"]) == 0
    return folder


@pytest.fixture(scope="module")
def torch_model(exported):
    return LMKModel.from_pretrained(exported).eval()


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """A tiny BERT (absolute positions, 512) extended to 4,096 by interpolation, then exported (fused)."""
    from lmk_embed_tools.training.convert import convert_to_lmk
    from lmk_embed_tools.onnx_export import export_onnx

    root = tmp_path_factory.mktemp("onnx-extended")
    folder = convert_to_lmk(tiny_encoder_source(root / "bert", "bert"), root / "lmk", granularity=32,
                            max_positions=4096, position_extension="interpolate")
    export_onnx(folder, quantize="int8")
    return folder


@pytest.fixture(scope="module")
def real_pages():
    """Real pages of several lengths: pydoc's pages of three standard-library modules (about 1k to 20k tokens)."""
    import argparse
    import json as json_module
    import textwrap

    from lmk_embed_tools.training.stdlib_corpus import render_page

    return [render_page(module) for module in (argparse, json_module, textwrap)]


def load_onnx(folder, **options):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder), trust_remote_code=True, backend="onnx", **options)


def test_export_writes_both_graphs_with_their_facts(exported):
    import onnx

    for name, quantization in ((FP32_FILE, "none"), (INT8_FILE, "int8")):
        graph = onnx.load(str(exported / name))
        facts = {prop.key: prop.value for prop in graph.metadata_props}
        assert facts["lmk_quantization"] == quantization and facts["lmk_pooling"] == "lmk"
        assert facts["lmk_fused"] == "none"  # ModernBERT: plain operators
        assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask", "landmark_mask"]
        assert [o.name for o in graph.graph.output] == ["embedding", "pooled", "last_hidden_state"]
        assert graph.opset_import[0].version == 17
        dims = [d.dim_param for d in graph.graph.input[0].type.tensor_type.shape.dim]
        assert dims == ["batch", "sequence"]


def test_onnx_encode_equals_torch_encode(exported, torch_model):
    model = load_onnx(exported)
    assert isinstance(model, LMKOnnxModel)
    assert model.max_positions() == torch_model.max_positions()
    windows = {"long_input": "windows", "window_length": 24, "max_length": None}
    for options in ({}, {"batch_size": 2}, {"max_length": 64, "granularity": 16}, {"normalize": False}, windows):
        difference = np.abs(model.encode(TEXTS, **options) - torch_model.encode(TEXTS, **options)).max()
        assert difference <= 1e-4, (options, difference)
    assert np.abs(model.encode_query(TEXTS[:2]) - torch_model.encode_query(TEXTS[:2])).max() <= 1e-4
    ours, theirs = model.encode(SAMPLE_TEXT, output_value="landmarks"), torch_model.encode(SAMPLE_TEXT, output_value="landmarks")
    assert ours["spans"] == theirs["spans"] and np.abs(ours["embeddings"] - theirs["embeddings"]).max() <= 1e-4
    ours, theirs = (m.encode(SAMPLE_TEXT * 4, output_value="landmarks", **windows) for m in (model, torch_model))
    assert ours["spans"] == theirs["spans"] and np.abs(ours["embeddings"] - theirs["embeddings"]).max() <= 1e-4
    assert model.encode([]).shape == (0, torch_model.config.embedding_dim)


def test_int8_graph_runs(exported, torch_model):
    vectors = load_onnx(exported, file_name=INT8_FILE, num_threads=1).encode(TEXTS)
    assert vectors.shape == (len(TEXTS), torch_model.config.embedding_dim) and np.isfinite(vectors).all()
    assert np.allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)


def test_extended_checkpoint_exports_and_matches_at_long_lengths(extended, real_pages):
    """The fused graph (attention unmasked when a run has no padding, the `Attention` op when it has)
    gives torch's vectors within 1e-5 on real pages at 1k-4k tokens, padded and unpadded alike, and
    the int8 graph within 0.99 cosine."""
    import onnx

    torch_model = LMKModel.from_pretrained(extended).eval()
    model, int8 = load_onnx(extended), load_onnx(extended, file_name=INT8_FILE)
    facts = {prop.key: prop.value for prop in onnx.load(str(extended / FP32_FILE)).metadata_props}
    assert facts["lmk_fused"] == "bert" and facts["lmk_max_positions"] == "4096"
    texts = [*real_pages, SAMPLE_TEXT]
    for max_length in (1024, 2048, 4096):
        for batch in (texts, real_pages[:1]):  # rows of several lengths (padded), and one row (unpadded)
            with pytest.warns(UserWarning, match="truncated"):
                theirs = torch_model.encode(batch, max_length=max_length)
            with pytest.warns(UserWarning, match="truncated"):
                ours = model.encode(batch, max_length=max_length)
            with pytest.warns(UserWarning, match="truncated"):
                quantized = int8.encode(batch, max_length=max_length)
            assert np.abs(ours - theirs).max() <= 1e-5, (max_length, len(batch))
            assert (quantized * theirs).sum(-1).min() >= 0.99, (max_length, len(batch))
    with pytest.raises(ValueError, match="4096"):
        model.encode(texts, max_length=4097)


def test_fused_attention_runs_unmasked_only_on_unpadded_batches(extended):
    """Each fused layer is an `If` on "no padded row": then `MultiHeadAttention` without a mask (the
    CPU flash kernel) after one merged QKV MatMul, else the masked `Attention` op; in the int8 graph
    both branches read quantised weights. Both graphs record the exporting CPU's features."""
    import onnx

    from lmk_embed.onnx_backend import cpu_features

    for name, product, attention in ((FP32_FILE, "MatMul", "Attention"), (INT8_FILE, "MatMulInteger", "QAttention")):
        graph = onnx.load(str(extended / name))
        assert not {"Attention", "MultiHeadAttention", "QAttention"} & {node.op_type for node in graph.graph.node}
        layers = [node for node in graph.graph.node if node.op_type == "If"]
        assert len(layers) == 2  # the tiny BERT's layers
        for layer in layers:
            branches = {attr.name: attr.g for attr in layer.attribute}
            unpadded, padded = branches["then_branch"].node, branches["else_branch"].node
            assert [node.op_type for node in unpadded][0] == product
            assert unpadded[-1].op_type == "MultiHeadAttention" and len(unpadded[-1].input) == 4  # no mask
            assert [node.op_type for node in padded] == [attention] and padded[0].input[3] != ""  # the mask
        facts = {prop.key: prop.value for prop in graph.metadata_props}
        assert facts["lmk_attention"] == "unmasked-when-unpadded"
        assert facts["lmk_tuned_cpu"] == ",".join(cpu_features() or ["unknown"])
        assert facts["lmk_quantization"] == ("int8" if name == INT8_FILE else "none")  # the key warn_if_int8_without_vnni reads


def test_layer_norm_and_gelu_stay_unfused_at_load(extended, tmp_path):
    """The fused graphs keep LayerNorm as Add, Add, LayerNormalization and the FFN's GELU as Add, Gelu,
    and a session made the runtime's way (`new_session`) keeps them so, where ONNX Runtime's own
    load-time optimisations would fuse them into SkipLayerNormalization and BiasGelu."""
    import onnx
    import onnxruntime as ort

    from lmk_embed.onnx_backend import make_session_options, new_session

    def op_types(path):
        return {node.op_type for node in onnx.load(str(path)).graph.node}

    slow = {"SkipLayerNormalization", "BiasGelu"}
    for name in (FP32_FILE, INT8_FILE):
        assert not slow & op_types(extended / name) and {"LayerNormalization", "Gelu"} <= op_types(extended / name)
        ours, default = make_session_options(ort, 1), make_session_options(ort, 1)
        ours.optimized_model_filepath = str(tmp_path / "ours.onnx")
        default.optimized_model_filepath = str(tmp_path / "default.onnx")
        new_session(ort, extended / name, ours)
        ort.InferenceSession(str(extended / name), default, providers=["CPUExecutionProvider"])
        assert not slow & op_types(tmp_path / "ours.onnx"), name
        if name == FP32_FILE:  # what the list keeps off (on the tiny BERT ONNX Runtime fuses only BiasGelu back)
            assert slow & op_types(tmp_path / "default.onnx")


def test_fused_graph_through_sentence_transformers_and_encode_corpus(extended, real_pages, tmp_path):
    import pyarrow.parquet as pq
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.corpus import encode_corpus

    texts = [*real_pages, SAMPLE_TEXT, "Zip archives."]
    torch_st = SentenceTransformer(str(extended), trust_remote_code=True, device="cpu")
    onnx_st = SentenceTransformer(str(extended), trust_remote_code=True, backend="onnx")
    for st in (torch_st, onnx_st):
        st.max_seq_length = 2048
    with pytest.warns(UserWarning, match="truncated"):
        theirs = torch_st.encode(texts)
    with pytest.warns(UserWarning, match="truncated"):
        assert np.abs(onnx_st.encode(texts) - theirs).max() <= 1e-5
    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in enumerate(texts)))
    for backend in ("torch", "onnx"):
        encode_corpus(str(extended), str(source), tmp_path / backend, backend=backend, max_length=2048,
                          show_progress_bar=False)
    vectors = {backend: np.stack(pq.read_table(tmp_path / backend / "part-00000.parquet").column("embedding").to_numpy(
        zero_copy_only=False)) for backend in ("torch", "onnx")}
    assert np.abs(vectors["onnx"] - vectors["torch"]).max() <= 1e-5
    assert np.abs(vectors["torch"] - theirs).max() <= 1e-5


def test_a_graph_tuned_on_another_cpu_warns_once(tmp_path, caplog):
    from lmk_embed import onnx_backend

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f fma\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
    assert onnx_backend.cpu_features(str(cpuinfo)) == ["avx2", "avx512f"]
    assert onnx_backend.cpu_features(str(tmp_path / "missing")) is None
    tuned = {"lmk_tuned_cpu": "avx2,avx512f,avx512_vnni,amx_int8"}
    with caplog.at_level("WARNING"):
        for _ in range(2):
            onnx_backend.warn_if_tuned_for_other_cpu(tuned, "onnx/model_qint8.onnx", running=["avx2", "avx512f"])
        onnx_backend.warn_if_tuned_for_other_cpu(tuned, "onnx/model.onnx", running=tuned["lmk_tuned_cpu"].split(","))
        onnx_backend.warn_if_tuned_for_other_cpu({"lmk_tuned_cpu": "unknown"}, "onnx/model.onnx", running=[])
    warned = [record.getMessage() for record in caplog.records if "exported and measured on a CPU" in record.getMessage()]
    assert warned[0].startswith("onnx/model_qint8.onnx") and "avx512_vnni, amx_int8" in warned[0]
    assert sum("model_qint8" in message for message in warned) == 1  # once


def test_an_int8_graph_on_a_cpu_without_vnni_warns_once(caplog):
    from lmk_embed import onnx_backend

    # File names no real load uses: warning_once remembers messages for the whole process, and a load
    # of onnx/model_qint8.onnx on a CPU without VNNI may already have logged its own.
    int8, fp32 = {"lmk_quantization": "int8"}, {"lmk_quantization": "none"}
    with caplog.at_level("WARNING"):
        for _ in range(2):
            onnx_backend.warn_if_int8_without_vnni(int8, "onnx/int8_avx2.onnx", running=["avx2", "avx512f"])
        onnx_backend.warn_if_int8_without_vnni(fp32, "onnx/model.onnx", running=["avx2"])
        onnx_backend.warn_if_int8_without_vnni(int8, "onnx/int8_vnni.onnx", running=["avx2", "avx512f", "avx512_vnni"])
        onnx_backend.warn_if_int8_without_vnni(int8, "onnx/int8_amx.onnx", running=["avx2", "amx_int8"])
        onnx_backend.warn_if_int8_without_vnni(int8, "onnx/int8_old_cpu.onnx", running=[])  # not even AVX2
    warned = [record.getMessage() for record in caplog.records if "has no VNNI" in record.getMessage()]
    assert [message.split(" ", 1)[0] for message in warned] == ["onnx/int8_avx2.onnx", "onnx/int8_old_cpu.onnx"]
    assert "load onnx/model.onnx (fp32)" in warned[0]


def test_loading_a_graph_tuned_for_features_this_cpu_lacks_warns(extended, tmp_path, caplog):
    from lmk_embed_tools.onnx_export import _write_metadata

    folder = shutil.copytree(extended, tmp_path / "lmk")
    _write_metadata(folder / FP32_FILE, {"lmk_tuned_cpu": "avx2,amx_fp99"})  # no CPU has it
    with caplog.at_level("WARNING"):
        assert load_onnx(folder).encode("hello").shape == (32,)
    assert any("with amx_fp99, which this CPU lacks" in record.getMessage() for record in caplog.records)


def test_the_checkpoints_own_pooling_is_exported(modernbert_source, tmp_path):
    """Mean pooling without normalisation: the graph reads no landmark mask and normalises nothing."""
    from lmk_embed_tools.training.convert import convert_to_lmk
    from lmk_embed_tools.onnx_export import export_onnx

    folder = convert_to_lmk(modernbert_source, tmp_path / "mean", pooling="mean", normalize=False)
    export_onnx(folder, fuse=False)
    model, torch_model = load_onnx(folder), LMKModel.from_pretrained(folder).eval()
    assert model.graph.inputs == ["input_ids", "attention_mask"]
    ours = model.encode(TEXTS)
    assert np.abs(ours - torch_model.encode(TEXTS)).max() <= 1e-4
    assert not np.allclose(np.linalg.norm(ours, axis=-1), 1.0)


def test_sentence_transformers_backend_onnx(exported):
    from sentence_transformers import SentenceTransformer

    torch_st = SentenceTransformer(str(exported), trust_remote_code=True, device="cpu")
    onnx_st = SentenceTransformer(str(exported), trust_remote_code=True, backend="onnx")
    assert isinstance(onnx_st[0].model, LMKOnnxModel)
    assert np.abs(onnx_st.encode(TEXTS) - torch_st.encode(TEXTS)).max() <= 1e-4
    int8 = SentenceTransformer(str(exported), trust_remote_code=True, backend="onnx",
                               model_kwargs={"file_name": INT8_FILE})
    assert np.isfinite(int8.encode(TEXTS)).all()
    with pytest.raises(RuntimeError, match="inference only"):
        onnx_st.train()
    with pytest.raises(NotImplementedError, match="no torch weights"):
        onnx_st.save(str(exported.parent / "resaved"))


def test_a_checkpoint_ships_the_runtime_and_no_export_code(exported):
    shipped = (exported / "onnx_backend.py").read_text()
    assert "class OnnxGraph" in shipped and "class LMKOnnxModel" in (exported / "modeling_lmk.py").read_text()
    assert not any(word in shipped for word in ("def export_onnx", "def quantize_graph", "import onnx\n", "torch.onnx.export("))


def test_missing_onnxruntime_names_the_extra(exported, monkeypatch):
    from transformers.dynamic_module_utils import get_imports

    # The remote-code loader's own check must not require onnxruntime: torch loading works without it.
    assert not {"onnxruntime", "onnx"} & set(get_imports(exported / "onnx_backend.py"))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'lmk-embed\[onnx\]'"):
        LMKModel.from_pretrained(exported, backend="onnx")
    assert LMKModel.from_pretrained(exported).encode("still loads on torch").shape == (32,)
    code = cli.main(["export-onnx", str(exported)])
    assert code == 2


def test_bad_backend_arguments_are_named(exported, lmk_checkpoint):
    with pytest.raises(ValueError, match="backend"):
        LMKModel.from_pretrained(exported, backend="openvino")
    with pytest.raises(TypeError, match="dtype"):
        LMKModel.from_pretrained(exported, backend="onnx", dtype="bfloat16")
    with pytest.raises(OSError, match="export-onnx"):
        LMKModel.from_pretrained(lmk_checkpoint, backend="onnx")  # the fixture itself has no graphs
    with pytest.raises(ValueError, match="CPU"):
        load_onnx(exported).to("cuda")


def test_recurrent_checkpoints_are_refused(mamba2_checkpoint, capsys):
    assert cli.main(["export-onnx", str(mamba2_checkpoint)]) == 2
    error = capsys.readouterr().err
    assert "recurrent checkpoint" in error and "vertical schedule" in error
    assert not (mamba2_checkpoint / "onnx").exists()


def test_encode_corpus_backend_onnx(exported, torch_model, tmp_path):
    import pyarrow.parquet as pq

    from lmk_embed_tools.corpus import CorpusSettingsError, encode_corpus

    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in enumerate(TEXTS)))
    summary = encode_corpus(str(exported), str(source), tmp_path / "out", backend="onnx", show_progress_bar=False)
    assert summary["rows"] == len(TEXTS)
    vectors = np.stack(pq.read_table(tmp_path / "out" / "part-00000.parquet").column("embedding").to_numpy(
        zero_copy_only=False))
    assert np.abs(vectors - torch_model.encode(TEXTS)).max() <= 1e-4
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["settings"]["backend"]["file"] == FP32_FILE
    with pytest.raises(CorpusSettingsError, match="backend"):
        encode_corpus(str(exported), str(source), tmp_path / "out", show_progress_bar=False)


def test_push_stages_scans_and_validates_the_graphs(exported, tmp_path):
    folder = shutil.copytree(exported, tmp_path / "lmk")
    write_card(folder, model_id="our-org/tiny-onnx")
    assert FP32_FILE in (folder / "README.md").read_text() and INT8_FILE in (folder / "README.md").read_text()
    report = push.stage(folder, tmp_path / "staged", max_file_mb=1.0)  # graphs are weights: no size limit
    assert {FP32_FILE, INT8_FILE} <= set(report.files) and report.files[FP32_FILE] > 2**20
    # The clean process (another working directory, offline, the project unimportable) loads the graphs
    # by path and by model id from a Hub-cache layout, through AutoModel and SentenceTransformer.
    diffs = push.validate(report.folder, folder, repo_id="our-org/tiny-onnx")
    assert {"automodel_onnx_path", "automodel_onnx_id", "sentence_transformers_onnx_path", "sentence_transformers_onnx_id",
            "automodel_onnx_int8_path", "sentence_transformers_onnx_int8_id"} <= set(diffs)
    assert max(value for key, value in diffs.items() if "_int8_" not in key) <= 1e-4

    (folder / "README.md").write_text((folder / "README.md").read_text().replace(INT8_FILE, "the int8 graph"))
    with pytest.raises(push.PushError, match="does not name the staged ONNX graphs"):
        push.validate(push.stage(folder, tmp_path / "staged-2").folder, folder)

    (folder / "onnx" / "model_qint8.onnx").write_bytes((folder / FP32_FILE).read_bytes() + b"hf_" + b"a" * 34)
    with pytest.raises(push.PushError, match="model_qint8.onnx: contains what looks like a Hugging Face token"):
        push.stage(folder, tmp_path / "staged-3")
    shutil.copyfile(exported / INT8_FILE, folder / INT8_FILE)
    push.stage(folder, tmp_path / "staged-4")
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    first = sorted(tensors)[0]
    tensors[first] = tensors[first] + 1  # trained on: the graphs are stale
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(push.PushError, match="exported from other weights"):
        push.stage(folder, tmp_path / "staged-5")


def test_a_stale_graph_is_refused_at_load_and_by_encode_corpus(exported, tmp_path):
    """After the torch weights change, the graph exported from the old ones gives the old vectors:
    loading it fails naming both fingerprints and the command that re-exports (or, asked, warns), and
    encode-corpus refuses it before any shard (its manifest would name the new weights)."""
    from safetensors.torch import load_file, save_file

    from lmk_embed_tools.corpus import CorpusArgumentError, encode_corpus

    folder = shutil.copytree(exported, tmp_path / "lmk")
    tensors = load_file(folder / "model.safetensors")
    first = sorted(tensors)[0]
    tensors[first] = tensors[first] + 1  # trained on
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"exported from other weights \(sha256:.*\) than .* \(sha256:.*lmk-embed export-onnx"):
        load_onnx(folder)
    with pytest.warns(UserWarning, match="exported from other weights"):
        assert load_onnx(folder, stale_graph="warn").encode("hello").shape
    with pytest.raises(ValueError, match="stale_graph"):
        load_onnx(folder, stale_graph="ignore")
    source = tmp_path / "corpus.jsonl"
    source.write_text(json.dumps({"id": 0, "text": "hello"}) + "\n")
    with pytest.raises(CorpusArgumentError, match="exported from other weights"):
        encode_corpus(str(folder), str(source), tmp_path / "out", backend="onnx", show_progress_bar=False)
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert cli.main(["export-onnx", str(folder)]) == 0
    assert load_onnx(folder).encode("hello").shape  # re-exported: loads again


def _train_on(tensors: dict) -> dict:
    """The same tensors with the first one moved: weights the graph was not exported from."""
    first = sorted(tensors)[0]
    return {**tensors, first: tensors[first] + 1}


def test_a_stale_graph_beside_pickled_weights_is_refused(exported, tmp_path):
    """Weights saved as `pytorch_model.bin` (the safetensors file gone) are what torch loads, so the
    graph exported from the old ones is stale: the fingerprint covers every weight format."""
    import torch
    from safetensors.torch import load_file

    folder = shutil.copytree(exported, tmp_path / "lmk")
    torch.save(_train_on(load_file(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"exported from other weights \(sha256:.*\) than the checkpoint's pytorch_model\.bin"):
        load_onnx(folder)
    assert cli.main(["export-onnx", str(folder)]) == 0  # the pickle's own fingerprint, recorded
    torch_model = LMKModel.from_pretrained(folder).eval()
    assert np.abs(load_onnx(folder).encode(TEXTS) - torch_model.encode(TEXTS)).max() <= 1e-4


def test_a_stale_graph_loaded_by_model_id_is_refused(exported, tmp_path, monkeypatch):
    """A downloaded snapshot whose graph was exported from other weights than the snapshot's: refused
    by model id as by path, naming the repository; a snapshot with the matching graph loads."""
    from safetensors.torch import load_file, save_file

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    push.install_in_hub_cache(exported, "our-org/fresh", cache)
    assert load_onnx("our-org/fresh", cache_dir=str(cache)).encode("hello").shape == (32,)
    stale = shutil.copytree(exported, tmp_path / "stale")
    save_file(_train_on(load_file(stale / "model.safetensors")), stale / "model.safetensors", metadata={"format": "pt"})
    push.install_in_hub_cache(stale, "our-org/stale", cache)
    with pytest.raises(ValueError, match=r"snapshots/.*exported from other weights \(sha256:.*\).*'our-org/stale' needs "
                                         r"its graph exported again"):
        load_onnx("our-org/stale", cache_dir=str(cache))
    with pytest.warns(UserWarning, match="exported from other weights"):
        load_onnx("our-org/stale", cache_dir=str(cache), stale_graph="warn")


def test_push_dry_run_names_both_fingerprints_of_a_stale_graph(exported, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from lmk_embed.onnx_backend import weights_fingerprint

    folder = shutil.copytree(exported, tmp_path / "lmk")
    exported_from = weights_fingerprint(folder)
    save_file(_train_on(load_file(folder / "model.safetensors")), folder / "model.safetensors", metadata={"format": "pt"})
    write_card(folder, model_id="our-org/x")
    code = cli.main(["push", str(folder), "our-org/x", "--dry-run", "--stage-dir", str(tmp_path / "staged")])
    error = capsys.readouterr().err
    assert code != 0 and f"exported from other weights ({exported_from}) than this checkpoint's " \
                          f"({weights_fingerprint(folder)})" in error, error[-2000:]


def test_the_demo_recipes_checkpoint_exports(tmp_path):
    """`make demo`'s LMK conversion (windows by default, the table extended to 4,096): the probe reads
    one window per row, as the graph computes, so export works; the graph then gives torch's vectors
    in the checkpoint's own schedule, on texts cut into several windows."""
    from lmk_embed_tools.onnx_export import export_onnx
    from lmk_embed_tools.training.convert import convert_to_lmk
    from lmk_embed_tools.training.recipe import CONVERSION_KEYS, RECIPE

    conversion = {key: RECIPE[key] for key in CONVERSION_KEYS}
    assert conversion["long_input"] == "windows" and conversion["position_extension"] is not None
    folder = convert_to_lmk(tiny_encoder_source(tmp_path / "bert", "bert"), tmp_path / "lmk", **conversion)
    export_onnx(folder)
    model, torch_model = load_onnx(folder), LMKModel.from_pretrained(folder).eval()
    texts = [SAMPLE_TEXT * 30, SAMPLE_TEXT, "Zip archives."]
    assert len(torch_model.prepare_features(texts, training=False)["input_ids"]) > len(texts)  # cut into windows
    assert np.abs(model.encode(texts) - torch_model.encode(texts)).max() <= 1e-4
