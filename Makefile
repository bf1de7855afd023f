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

.PHONY: demo test install clean bench mlflow-server-env

# The full `mlflow` (its tracking server needs Flask; Veil pins mlflow-skinny) in an environment of its own,
# for tests/core/test_registry_http.py (a real `mlflow server` on 127.0.0.1; it skips without this).
# Opt-in, not part of `make test`: the install measured 4 min 54 s on the 2-core dev machine (load ~9),
# too much of CI's 20-minute budget.
MLFLOW_SERVER_VENV := .venv-mlflow-server
$(MLFLOW_SERVER_VENV)/.installed:
	test -x $(MLFLOW_SERVER_VENV)/bin/python || $(PY) -m venv $(MLFLOW_SERVER_VENV)
	$(MLFLOW_SERVER_VENV)/bin/pip install -q "mlflow==3.17.2"
	touch $@

mlflow-server-env: $(MLFLOW_SERVER_VENV)/.installed

# uv installs, not pip (uv is bootstrapped into the venv with pip): on the 2-core machine (load ~9, empty
# caches) the install took 71 s with uv against 530 s with pip, with the same version of every package
# (pip freeze of both compared). uv reads no pip.conf: the local CPU wheel of torch is found through
# FIND_LINKS and asked for by its local version (+cpu), so that nothing can pull a CUDA build; once it is
# in, the project's `torch>=2.4` is satisfied and uv leaves it alone.
# No bytecode is compiled at install (pip compiled all of it: 110 s of CPU, mostly for modules never
# imported); Python writes it on first import instead, which PYTHONDONTWRITEBYTECODE (set on some machines)
# would turn into a recompile in every process: hence the unexport.
TORCH := torch==2.13.0+cpu
FIND_LINKS ?= /opt/wheels
UV_INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python
unexport PYTHONDONTWRITEBYTECODE
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "uv==0.13.9"
	# torch first, pinned: the local CPU wheel. Anything unpinned would pull CUDA.
	$(UV_INSTALL) $(if $(wildcard $(FIND_LINKS)),--find-links $(FIND_LINKS)) "$(TORCH)"
	$(UV_INSTALL) -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/veil demo

# Test files run in parallel (pytest-xdist), one file per worker at a time so that a file's module
# fixtures (trained tiny models, servers) are built once: much of the suite waits on servers it starts
# (Prefect, MLflow, PostgreSQL), so 3 workers on 2 cores still pay. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

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
