# `make demo` runs the main job, `make train-full` its full-budget version, `make test` the test suite.
# Each creates .venv when it is missing and installs torch==2.13.0 (the CPU wheel) and the pinned set.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo train-full test install clean bench-onnx-peer

EXTRAS := train,eval,dev,rwkv7,scale,onnx

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

clean:
	rm -rf $(VENV) runs .pytest_cache
