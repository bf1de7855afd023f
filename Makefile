# The two commands of the README. Each creates .venv and installs everything on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test install clean bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the local CPU wheel. Anything unpinned would pull CUDA.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/veil demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/accounting.py
	$(BIN)/python bench/ingest.py --real
	$(BIN)/python bench/lp.py
	$(BIN)/python bench/dp_step.py
	$(BIN)/python bench/dp_step.py --full
	$(BIN)/python bench/asi_liu_noise.py --measure
	$(BIN)/python bench/audit_evidence.py

clean:
	rm -rf .veil
