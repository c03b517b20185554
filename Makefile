# fcp — two commands matter: `make demo` and `make test`. Both bootstrap .venv when it is missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# A CPU machine must not pull a multi-GB CUDA torch: torch is installed on its own first, pinned.
# Set TORCH_SPEC / TORCH_PIP_ARGS to choose another build (e.g. TORCH_PIP_ARGS="--index-url ...").
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
EXTRAS ?= all
# megatron-core 0.17+ ships a cp311 wheel whose metadata says Python >= 3.12 (the code runs on
# 3.11): with the megatron extra, that release is installed as a 3.11 user must, past the check.
MEGATRON_SPEC ?= megatron-core==0.19.2

.PHONY: venv demo test lint bench fuzz clean

$(VENV)/.installed: pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "torch found in $(PYTHON): the venv reuses it (--system-site-packages)"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; \
	fi
	$(PIP) install -q --upgrade pip
	@if ! $(PY) -c "import torch" 2>/dev/null; then \
	  echo "installing $(TORCH_SPEC) $(TORCH_PIP_ARGS)"; \
	  $(PIP) install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"; \
	fi
	$(PIP) install -q -e ".[$(EXTRAS)]"
	@case ",$(EXTRAS)," in *,all,*|*,megatron,*) \
	  echo "installing $(MEGATRON_SPEC) (--ignore-requires-python)"; \
	  $(PIP) install -q --ignore-requires-python "$(MEGATRON_SPEC)";; esac
	@touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/fcp demo

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n 2 --durations=15

# every parser fcp owns, FUZZ_SECONDS each (a short seeded pass of the same targets runs in
# `make test`); a case found is written to out/fuzz/found/ and the exit status is 1
FUZZ_SECONDS ?= 60
fuzz: venv
	$(PY) tests/fuzz/run.py --seconds $(FUZZ_SECONDS) --json out/fuzz.json

bench: venv
	$(PY) bench/planner_quality.py
	$(PY) bench/planner_speed.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info
