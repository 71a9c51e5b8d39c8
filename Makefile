# `make demo` runs the main job, `make train-full` its full-budget version, `make test` the test suite.
# Each creates .venv when it is missing and installs torch==2.13.0 (the CPU wheel) and the pinned set.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo train-full test install clean

EXTRAS := train,eval,dev,rwkv7,scale

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

clean:
	rm -rf $(VENV) runs .pytest_cache
