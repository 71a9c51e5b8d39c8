"""benchmarks/avx2_kernels.c (`make bench-onnx-avx2`): under it, torch and ONNX Runtime see an AVX2 CPU
and compute as before, and a real segmentation fault still ends the process."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import numpy as np, torch
from onnx import TensorProto, helper
import onnxruntime as ort
print(torch.backends.cpu.get_cpu_capability())
graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "g",
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64, 64]) for n in "ab"],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [64, 64])])
session = ort.InferenceSession(helper.make_model(graph).SerializeToString(), providers=["CPUExecutionProvider"])
a, b = np.random.default_rng(0).standard_normal((2, 64, 64), dtype=np.float32)
print(float(np.abs(session.run(None, {"a": a, "b": b})[0] - a @ b).max()))
"""


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build benchmarks/avx2_kernels.c")
    flags = cpu_flags()
    if "cpuid_fault" not in flags:
        pytest.skip("this CPU or kernel has no CPUID faulting, which the library needs")
    if "avx512f" not in flags:
        pytest.skip("this CPU has no AVX-512 to hide")
    path = tmp_path_factory.mktemp("avx2") / "avx2_kernels.so"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(path), str(ROOT / "benchmarks" / "avx2_kernels.c")],
                   check=True)
    return path


def run_under(library, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LD_PRELOAD": str(library)})


def test_kernels_see_avx2_and_compute_as_before(library):
    done = run_under(library, PROBE)
    assert done.returncode == 0, done.stderr[-2000:]
    capability, difference = done.stdout.split()
    assert capability == "AVX2"
    assert float(difference) < 1e-4
    plain = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                           capture_output=True, text=True, timeout=300)
    assert plain.stdout.strip() != "AVX2"  # without the library the same CPU shows its AVX-512 kernels


def test_a_real_fault_still_crashes(library):
    done = run_under(library, "import ctypes; ctypes.string_at(0)")
    assert done.returncode == -11
