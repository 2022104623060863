# Two commands: `make train` (set up and train llama3_tiny) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup train test test-all bench clean

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

setup: $(VENV)/.installed

train: setup
	$(PY) train.py configs/llama3_tiny.yml $(ARGS)

test: setup
	$(PY) -m pytest -q tests

test-all: setup
	$(PY) -m pytest -q -m "" tests

bench: setup
	$(PY) benchmarks/quantize_bench.py

clean:
	rm -rf $(VENV) outputs .pytest_cache
