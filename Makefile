# `make demo` runs the main job, `make train-full` its full-budget version, `make test` the test suite.
# Each creates .venv when it is missing and installs torch==2.13.0 first (the CPU wheel), then the pinned set.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo train-full test install clean

EXTRAS := train,eval,dev,rwkv7,scale

# pip takes torch (it finds the CPU wheel where one lies on disk); uv installs the rest in a fraction
# of pip's time, compiled to bytecode as pip does. uv reads no pip configuration: where it cannot
# reach an index that pip can, pip installs the set instead.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0 uv
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -c constraints.txt -e ".[$(EXTRAS)]" \
	  || { echo "uv could not install the set; pip installs it instead"; $(PY) -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"; }
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) demo.py

# The same job with the full budget: more steps, every max length (about an hour on 2 cores).
train-full: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) demo.py --budget full

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
