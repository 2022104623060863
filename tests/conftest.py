"""Shared test fixtures: repo paths and the golden NVFP4 cases."""

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# One persistent compilation cache for the whole test run (pytest-xdist workers inherit it from the controller):
# the many small trainings of the suite compile the same steps, and each compiles once.
JAX_CACHE = os.environ.setdefault("MAXTEXT_TEST_JAX_CACHE", tempfile.mkdtemp(prefix="maxtext-test-jax-cache-"))
# Transformer Engine's reference NVFP4 cases (tests/data/golden/nvfp4/README.md), in the repo; NVFP4_GOLDEN_DIR may
# name a directory of the same layout whose cases are checked too (never instead).
GOLDEN_DIRS = [REPO / "tests" / "data" / "golden" / "nvfp4"] + (
  [pathlib.Path(os.environ["NVFP4_GOLDEN_DIR"])] if os.environ.get("NVFP4_GOLDEN_DIR") else []
)
# Compiling is most of the suite's time on CPU, and about a third of that is LLVM optimizing code that runs for
# milliseconds: on CPU-only machines the suite compiles at XLA's backend optimization level 0. The quantizers' bits
# are the same at every level (elementwise code, no fast math or FP contraction:
# tests/quantization/test_optimization_level.py checks them against a subprocess compiled as the trainer compiles);
# a dot's sums, at level 0, follow Eigen's thread count, so dots run single-threaded (every process of the suite,
# pinned to one core or not, then computes the same losses). MAXTEXT_TEST_XLA_OPT=default compiles as the trainer.
TEST_XLA_FLAGS = ""
if os.environ.get("MAXTEXT_TEST_XLA_OPT") != "default" and not os.path.exists("/dev/nvidiactl"):
  TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

# A suite started as a shell's background job (`make test &`, nohup, some CI runners) starts with SIGINT ignored,
# which every process it starts inherits, and the product rightly leaves an ignored signal ignored. The tests that
# interrupt a program need SIGINT to arrive, so the suite takes it back: a Python handler here becomes the default
# action in the programs the tests run.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)


def cpu_subprocess_env(devices, **extra):
  """The environment of a test's subprocess on `devices` virtual CPU devices, compiling as this suite does."""
  flags = f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}".strip()
  return dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", **extra)


def run_on_cpu_devices(script, *args, devices=8, timeout=900):
  """The JSON `script` (a `python -c` program) prints after "RESULT", run with `args` in a subprocess on `devices`
  virtual CPU devices (a mesh without touching this process's XLA_FLAGS); its stderr's tail if it fails."""
  proc = subprocess.run(
    [sys.executable, "-c", script, *args],
    cwd=REPO,
    env=cpu_subprocess_env(devices),
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.split("RESULT")[-1])


@pytest.fixture
def cpu_gemm_choice():
  """MaxText.quantization.cpu_gemm.configure for one test (the cpu_gemm_dtype key's choices); auto afterwards."""
  from MaxText.quantization import cpu_gemm  # pylint: disable=import-outside-toplevel

  yield cpu_gemm.configure
  cpu_gemm.configure("auto")


def pytest_collection_modifyitems(items):
  """The heavy tests first: pytest-xdist hands out tests in this order, so the longest ones start at once
  instead of leaving one worker busy after the other has finished."""
  items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


def golden_cases(kind):
  """[(name, meta, arrays)] for quantize/ or linear/: the repo's cases, then NVFP4_GOLDEN_DIR's (named by their
  directory where a name repeats)."""
  cases = []
  for i, directory in enumerate(GOLDEN_DIRS):
    index = directory / kind / "index.json"
    if not index.exists():
      if i == 0:
        raise FileNotFoundError(f"the golden NVFP4 cases are missing: {index}")
      continue
    for c in json.loads(index.read_text()):
      name = c["name"] if i == 0 else f"{directory.name}/{c['name']}"
      cases.append((name, c, dict(np.load(directory / kind / f"{c['name']}.npz"))))
  return cases


def golden_params(kind):
  return [pytest.param(c, id=c[0]) for c in golden_cases(kind)]


def division_modes():
  """Parameters for tests that must hold with IEEE f32 division and with an NVIDIA GPU's (one ulp off)."""
  from tests.quantization.gpu_division import gpu_like_division  # pylint: disable=import-outside-toplevel

  return [pytest.param(contextlib.nullcontext, id="ieee_div"), pytest.param(gpu_like_division, id="gpu_like_div")]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
  """A small prepared text corpus: ArrayRecord text shards for the byte tokenizer, plus a TFDS copy 'plays'."""
  from tests.data.corpus import make_corpus  # pylint: disable=import-outside-toplevel

  return make_corpus(tmp_path_factory.mktemp("corpus"), "--tfds", "plays")


HF_TINY = REPO / "tests" / "data" / "hf_tiny"  # made by scripts/make_tiny_llama.py (transformers), with its logits


@pytest.fixture(scope="session")
def hf_tiny_import(tmp_path_factory):
  """tests/data/hf_tiny imported once: the output directory (config.yml, checkpoints/0, hf/)."""
  from MaxText.checkpointing.hf import importer  # pylint: disable=import-outside-toplevel

  out = tmp_path_factory.mktemp("hf_tiny") / "new" / "imported"  # its parent made too, as mkdir -p
  importer.import_checkpoint(HF_TINY, out, log=lambda *_: None)
  return out
