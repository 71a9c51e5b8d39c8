"""bitsandbytes is imported only where 4-bit weights are asked for (QLoRA).

peft 0.21 imports it whenever it is installed, and transformers' trainer and sentence-transformers
import peft; on a CPU with AVX512_BF16 the import logs "Failed to load CPU gemm_4bit_forward from
kernels-community". Training's entry points import peft with bitsandbytes kept out, and leave
nothing behind: the caller (or a QLoRA run) can still import it.
"""

import json

from tests.helpers import REPO_ROOT, run_fresh_python
from tests.lmk_embed_tools.training.test_training import toy_rows, write_jsonl

WARNING = "gemm_4bit_forward"


def test_importing_the_training_entry_points_leaves_bitsandbytes_out(tmp_path):
    result = run_fresh_python("""
        import contextlib, io, json, sys
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            from lmk_embed_tools.training import train, train_side_by_side
            import lmk_embed_tools.training.finetune
            import sentence_transformers, transformers.trainer
        imported = {name: name in sys.modules for name in ("peft", "bitsandbytes")}
        import bitsandbytes  # the guard held for peft's import only
        print(json.dumps({**imported, "stderr": err.getvalue(), "later": "bitsandbytes" in sys.modules}))
    """, cwd=tmp_path)
    assert result["peft"] and not result["bitsandbytes"] and result["later"], result
    assert WARNING not in result["stderr"], result["stderr"]


def test_a_lora_run_never_imports_bitsandbytes(tmp_path, lmk_checkpoint):
    """A whole LoRA training step in a fresh process: bitsandbytes stays out to the end."""
    data = write_jsonl(toy_rows(8), tmp_path / "toy.jsonl")
    settings = dict(model=str(lmk_checkpoint), output_dir=str(tmp_path / "run"), train_data=str(data), eval_data=None,
                    per_device_train_batch_size=4, max_steps=1, save_steps=1000, logging_steps=1,
                    query_max_length=32, passage_max_length=64, finetune="lora")
    result = run_fresh_python(f"""
        import json, sys
        from lmk_embed_tools.training import TrainConfig, train
        train(TrainConfig(**json.loads({json.dumps(json.dumps(settings))})))
        print(json.dumps({{"bitsandbytes": "bitsandbytes" in sys.modules, "peft": "peft" in sys.modules}}))
    """, cwd=REPO_ROOT)
    assert result == {"bitsandbytes": False, "peft": True}
