# `make demo` runs the main job, `make train-full` its full-budget version, `make test` the test suite.
# Each creates .venv when it is missing and installs torch==2.13.0 (the CPU wheel) and the pinned set.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo train-full train-student test install clean bench-onnx-peer bench-onnx-avx2 bench-llamacpp bench-serve

EXTRAS := train,eval,dev,rwkv7,scale,onnx,search,serve

# uv installs torch and the pinned set in a fraction of pip's time, compiled to bytecode as pip does.
# uv reads no pip configuration, so it is given pip's find-links: where the CPU torch wheel lies on
# disk, uv takes it from there, as pip would. Where uv cannot install the set, pip does, and says so.
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt uv
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) $(addprefix --find-links ,$(FIND_LINKS)) \
	  -c constraints.txt torch==2.13.0 -e ".[$(EXTRAS)]" \
	  || { echo "uv could not install the set; pip installs it instead"; $(PY) -m pip install -q -c constraints.txt torch==2.13.0 -e ".[$(EXTRAS)]"; }
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/lmk-embed demo

# The same job with the full budget: more steps, every max length (about an hour on 2 cores).
train-full: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/lmk-embed demo --budget full

# The recurrent student of MiniLM with the full budget (three epochs of every training row, seed 0);
# `lmk-embed train-student` alone is the demo budget (minutes).
train-student: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/lmk-embed train-student --budget full

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

# sentence-transformers' own backend="onnx", the ONNX benchmark's peer, needs optimum-onnx, which pins
# transformers < 4.58 (and so a sentence-transformers 5 release): it gets a venv of its own, used by
# benchmarks/onnx_backend.py only, never by the package or the tests. Then the benchmark runs. It lives
# under runs/, which git and the layout test ignore.
PEER_VENV := runs/venv-onnx-peer
# The set pip resolves for it (measured): transformers 4.57.6, huggingface-hub 0.36.2, tokenizers 0.22.2.
PEER_SET  := torch==2.13.0 "optimum-onnx[onnxruntime]==0.1.0" optimum==2.1.0 sentence-transformers==5.7.0 \
             transformers==4.57.6 huggingface-hub==0.36.2 tokenizers==0.22.2 onnxruntime==1.32.0 onnx==1.23.2

$(PEER_VENV)/.installed:
	test -x $(PEER_VENV)/bin/python || python3 -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install -q $(addprefix --find-links ,$(FIND_LINKS)) $(PEER_SET)
	touch $@

bench-onnx-peer: $(STAMP) $(PEER_VENV)/.installed
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.onnx_backend --peer-python $(PEER_VENV)/bin/python

# The same benchmark with AVX2 kernels on an AVX-512 CPU: benchmarks/avx2_kernels.c hides AVX-512,
# VNNI and AMX from CPUID (Linux's CPUID faulting, the `cpuid_fault` CPU flag), so ONNX Runtime and
# torch both take their AVX2 paths. It measures the kernels, not an AVX2 CPU's clocks or memory.
AVX2_KERNELS := runs/avx2_kernels.so
ONNX_AVX2_ARGS ?= --no-quality --no-corpus --runs 3

$(AVX2_KERNELS): benchmarks/avx2_kernels.c
	mkdir -p $(dir $@) && $(CC) -O2 -shared -fPIC -o $@ $<

bench-onnx-avx2: $(STAMP) $(AVX2_KERNELS)
	HF_HUB_OFFLINE=1 LD_PRELOAD=$(abspath $(AVX2_KERNELS)) $(PY) -m benchmarks.onnx_backend $(ONNX_AVX2_ARGS)

# llama.cpp, the recurrent encode's CPU peer (benchmarks/recurrent_vs_llamacpp.py): llama-cpp-python
# built from its sdist, CPU only, in a venv of its own under runs/, never in the package or the tests.
# The build compiles llama.cpp with at most 2 jobs: about 6 minutes on 2 idle cores, 20 on busy ones.
# The multimodal library (LLAVA_BUILD) is left out, since the benchmark only embeds token ids.
LLAMACPP_VENV := runs/venv-llamacpp
LLAMACPP_SET  := llama-cpp-python==0.3.36 gguf==0.19.0 numpy
LLAMACPP_CMAKE_ARGS ?= -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF

$(LLAMACPP_VENV)/.installed:
	test -x $(LLAMACPP_VENV)/bin/python || python3 -m venv $(LLAMACPP_VENV)
	CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(LLAMACPP_VENV)/bin/python -m pip install -q \
	  --no-binary llama-cpp-python $(LLAMACPP_SET)
	touch $@

# --quick is the short set (27 minutes on 2 idle cores); `make bench-llamacpp LLAMACPP_ARGS=` runs the full grid (hours).
LLAMACPP_ARGS ?= --quick

bench-llamacpp: $(STAMP) $(LLAMACPP_VENV)/.installed
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.recurrent_vs_llamacpp --peer-python $(LLAMACPP_VENV)/bin/python $(LLAMACPP_ARGS)

# Infinity, the serving benchmark's peer (benchmarks/serve.py): it pins sentence-transformers < 4 and
# transformers <= 5.0, so it gets a venv of its own under runs/, never the package or the tests.
# The set pip resolves for it (measured): sentence-transformers 3.4.1, transformers 4.57.6.
INFINITY_VENV := runs/venv-infinity-peer
INFINITY_SET  := torch==2.13.0 "infinity-emb[server,torch]==0.0.78" sentence-transformers==3.4.1 transformers==4.57.6 \
                 huggingface-hub==0.36.2 tokenizers==0.22.2 fastapi==0.165.0 uvicorn==0.32.1 numpy==1.26.4

$(INFINITY_VENV)/.installed:
	test -x $(INFINITY_VENV)/bin/python || python3 -m venv $(INFINITY_VENV)
	$(INFINITY_VENV)/bin/python -m pip install -q $(addprefix --find-links ,$(FIND_LINKS)) $(INFINITY_SET)
	touch $@

bench-serve: $(STAMP) $(INFINITY_VENV)/.installed
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.serve --peer-python $(INFINITY_VENV)/bin/python

clean:
	rm -rf $(VENV) runs .pytest_cache
