"""The te tests' fixtures: skip without Transformer Engine (`make te`, then `make test-te`), and lower for a GPU of a
given compute capability on any machine (TE asks the driver for it; lowering needs nothing else from a GPU)."""

import functools
import importlib
import pathlib
import re
import sys

import jax
import pytest

from MaxText.quantization import backends
from MaxText.quantization.backends import te as te_backend
from MaxText.quantization.formats import Format

PINS = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "te" / "requirements.txt"
# TE's Python modules that hold a name get_device_compute_capability (te.COMPUTE_CAPABILITY_HOLDERS, which
# te.compiling_for_sm patches too); the fixture also patches any other module of the package that has one, and fails
# if one listed there doesn't.
COMPUTE_CAPABILITY_HOLDERS = te_backend.COMPUTE_CAPABILITY_HOLDERS
# Compute capabilities the tests lower for: Blackwell for the block-scaled recipes, Hopper for per-tensor FP8.
SM_FOR_FORMAT = {Format.NVFP4: 100, Format.MXFP8: 100, Format.FP8_CURRENT: 90}


def pinned_te_version():
  return re.search(r"^transformer-engine-cu\d+==([\d.]+)", PINS.read_text(), re.M).group(1)


@functools.lru_cache(maxsize=None)
def te_unavailable_reason():
  """None where transformer_engine.jax imports, else why not (one line)."""
  try:
    jax.devices()  # jax's CUDA plugin loads the NVIDIA libraries TE's core links by name (NCCL) from their wheels
    importlib.import_module("transformer_engine.jax")
    importlib.import_module("transformer_engine.jax.flax")
  except Exception as e:  # pylint: disable=broad-except  # ImportError, or a TE build that can't load its libraries
    return (
      f"transformer_engine.jax is not importable here ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
      "`make te` builds .venv-te and `make test-te` runs these tests with it"
    )
  return None


@pytest.fixture(autouse=True)
def _transformer_engine():
  reason = te_unavailable_reason()
  if reason:
    pytest.skip(reason)


def te_ffi_targets():
  """Every custom-call target TE registers (what jax.export must be told not to refuse)."""
  return sorted(importlib.import_module("transformer_engine_jax").registrations())


def export_for_cuda(fn, *args):
  """jax.export of `fn` for CUDA, TE's custom calls allowed; the exported module's text (locations included)."""
  checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in te_ffi_targets()]
  return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()


@pytest.fixture
def gpu_of(monkeypatch):
  """gpu_of(sm): from here on TE and our te backend see a GPU of compute capability `sm` (100: Blackwell)."""

  def pin(sm):
    assert te_unavailable_reason() is None  # TE imported: every module that holds the function is loaded

    def compute_capability(gpu_id=0):
      del gpu_id
      return sm

    holders = {
      name
      for name, module in list(sys.modules.items())
      if (name == "transformer_engine_jax" or name.startswith("transformer_engine."))
      and callable(getattr(module, "get_device_compute_capability", None))
    }
    missing = set(COMPUTE_CAPABILITY_HOLDERS) - holders
    assert not missing, f"TE moved get_device_compute_capability: no longer in {sorted(missing)}"
    for name in holders:
      monkeypatch.setattr(sys.modules[name], "get_device_compute_capability", compute_capability)
    # What TE derived from the old answer: its cached support table and layout check.
    helper = importlib.import_module("transformer_engine.jax.quantize.helper")
    monkeypatch.setattr(helper, "_is_scaling_mode_supported", None)
    importlib.import_module(
      "transformer_engine.jax.quantize.device_utils"
    ).is_fp8_gemm_with_all_layouts_supported.cache_clear()
    monkeypatch.setattr(te_backend, "gpu_compute_capability", lambda: sm)
    backends.resolve.cache_clear()

  yield pin
  backends.resolve.cache_clear()
  importlib.import_module(
    "transformer_engine.jax.quantize.device_utils"
  ).is_fp8_gemm_with_all_layouts_supported.cache_clear()
