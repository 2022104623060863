"""A backend added in this file alone: per-tensor INT8 quantizers and an integer GEMM, registered under its name and
trained with llama3_tiny through the trainer (quantization_backend=int8_toy) on 1 and on 8 CPU devices, where its
GEMMs run partitioned (each device quantizes its shards, the amax all-reduced) with nothing else written for it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText import config, train
from MaxText.quantization import backends, get_recipe, registry
from MaxText.quantization.formats import grids
from MaxText.quantization.formats.tensor import QuantizedTensor
from tests.conftest import REPO, run_on_cpu_devices
from tests.trainer.test_train import SMALL


class Int8Backend(backends.Backend):
  """Per-tensor symmetric INT8 for the per-tensor recipes: q = round(x * 127 / amax), the GEMM an int8 x int8 dot
  summed exactly in int32, then times both decode scales (amax / 127)."""

  name = "int8_toy"

  def unavailable_reason(self, recipe):
    return None if recipe.format.per_tensor_fp8 else f"{self.name} runs the per-tensor recipes only"

  def quantize(self, x, recipe, role, key=None, *, kernels, transpose=False, amax_axes=(), draws=None):
    x = (x.T if transpose else x).astype(jnp.float32)
    amax = grids.max_across(jnp.max(jnp.abs(x)), amax_axes)  # a shard's: the whole operand's amax
    scale = jnp.where(amax > 0, 127.0 / amax, 1.0)
    return QuantizedTensor(jnp.round(x * scale).astype(jnp.int8), None, 1.0 / scale)

  def gemm(self, a, b_t, recipe, out_dtype=jnp.float32):
    acc = jax.lax.dot_general(a.values, b_t.values, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * (a.global_scale * b_t.global_scale)


INT8 = Int8Backend()


@pytest.fixture
def int8_registered():
  """INT8 registered for one test (other tests see the built-in backends only)."""
  backends.register(INT8)
  yield INT8
  registry.REGISTERED.pop(INT8.name)


# The suite's small llama3_tiny (SMALL), the same global batch of 8 rows on 1 device and on 8 (one row each, fsdp 8).
KEYS = [
  "quantization=te_fp8_currentscaling",
  "quantization_scope=all_dense",
  "quantization_backend=int8_toy",
  *SMALL,
  "steps=12",
]
SCRIPT = r"""
import json, sys
from MaxText import config, train
from MaxText.quantization import backends
from tests.quantization import test_toy_backend as toy
backends.register(toy.INT8)
losses = train.train(config.load(toy.REPO / "configs" / "llama3_tiny.yml", [*toy.KEYS, *sys.argv[1:]]))
print("RESULT" + json.dumps([float(l) for l in losses]))
"""


@pytest.mark.slow
def test_a_backend_registered_here_trains_llama3_tiny_on_1_and_8_devices(tmp_path, int8_registered):
  assert backends.resolve(get_recipe("te_fp8_currentscaling"), "int8_toy") is int8_registered
  cfg = config.load(REPO / "configs" / "llama3_tiny.yml", KEYS)
  one = train.train(cfg.replace(base_output_directory=str(tmp_path), run_name="one"))
  eight = run_on_cpu_devices(
    SCRIPT, "per_device_batch_size=1", "ici_fsdp_parallelism=8", f"base_output_directory={tmp_path}", "run_name=8"
  )
  assert len(one) == 12 and np.mean(one[-3:]) < np.mean(one[:3]) - 0.5, one
  # The same quantized operands (a shard's amax is the whole operand's), the same integer sums; dgrad's and wgrad's
  # partial sums are rounded to bf16 before they are reduced, as BF16's are, and the bf16 layers sum in other orders.
  np.testing.assert_allclose(eight, one, rtol=3e-3)  # 7e-4 at most, measured
