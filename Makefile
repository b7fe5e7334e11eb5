# Set-up + run. `make train` / `make test` work from a clean clone: they create .venv if no
# virtualenv is active, install torch 2.13.0 only when no torch is importable (a user's CUDA
# torch is never replaced: the venv sees system site-packages), then install structtorch and build its fused CPU
# kernels (fused=auto runs use them; where they do not build, runs use the eager passes).
ifdef VIRTUAL_ENV
VENV := $(VIRTUAL_ENV)
else
VENV := .venv
endif
PY := $(VENV)/bin/python
STAMP := $(VENV)/.structtorch-installed

.PHONY: setup train test lint bench
setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv --system-site-packages $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	@echo "building the fused CPU kernels (once: a few minutes; cached in ~/.cache/torch_extensions, per checkout)"
	@$(PY) -c "from structtorch.inference import fused; fused.kernels()" >/dev/null 2>&1 \
		|| echo "the fused CPU kernels did not build (no C++ compiler or ninja?): runs use the eager passes"
	@touch $(STAMP)

train: setup
	$(PY) -m structtorch.train $(ARGS)

# the suite in TEST_WORKERS pytest processes (pytest-xdist; conftest keeps each to one torch thread): about twice as
# fast on 2 cores; TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -x -q --durations=15 -n $(TEST_WORKERS) --dist loadgroup $(ARGS)

lint: setup
	$(PY) -m ruff check structtorch tests scripts experiments
	$(VENV)/bin/lint-imports  # the layers of docs/design.md (contracts in pyproject.toml)
