# `make demo` runs the main job, `make train-full` its full-budget version, `make test` the test suite.
# Each creates .venv when it is missing and installs torch==2.13.0 first (the CPU wheel), then the pinned set.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo train-full test install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[train,eval,dev,rwkv7,scale]"
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
