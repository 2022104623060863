"""The quantizers' bits don't depend on XLA's CPU optimization level: this suite compiles at level 0 on CPU
(conftest.py), the trainer at the default; a subprocess compiled as the trainer is must give the same bits."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, TEST_XLA_FLAGS

SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
from MaxText.quantization.backends import emulated
from MaxText.quantization import get_recipe
from MaxText.quantization.formats import nvfp4

def everything(x, w, dy, key):
  # The quantizers' distinct paths: 1x16 with RHT and SR, 16x16 tiles of an f32 weight, Four Over Six (mse with RHT
  # and SR, mae on tiles), MX's power-of-two scales (FP8's casts are MXFP8's elements).
  quantize = lambda a, **kw: (lambda q: (q.values, q.scales, q.global_scale))(nvfp4.quantize(a, **kw))
  mx = lambda a, name: (lambda q: (q.values, q.scales))(emulated.quantize_operand(a, get_recipe(name), "x"))
  return {"1x16 rht sr": quantize(dy, rht=True, stochastic_rounding=True, key=key),
          "16x16": quantize(w, tile=(16, 16)),
          "4/6 mse rht sr": quantize(x, rht=True, stochastic_rounding=True, key=key, four_over_six="mse"),
          "4/6 mae 16x16": quantize(w, tile=(16, 16), four_over_six="mae"),
          "mxfp4": mx(x, "mxfp4"), "mxfp8": mx(x, "te_mxfp8")}

kx, kw, kd = jax.random.split(jax.random.key(0), 3)
x = (jax.random.normal(kx, (64, 128)) * jnp.exp(jax.random.normal(kw, (64, 1)))).astype(jnp.bfloat16)
w = jax.random.normal(kw, (128, 96)) * 0.05
dy = jax.random.normal(kd, (64, 96), jnp.bfloat16)
leaves = jax.tree_util.tree_flatten_with_path(jax.jit(everything)(x, w, dy, jax.random.key(1)))[0]
np.savez(sys.argv[1], **{jax.tree_util.keystr(path): np.asarray(leaf).astype(np.float32)
                         for path, leaf in leaves})
"""


@pytest.mark.slow
@pytest.mark.skipif(not TEST_XLA_FLAGS, reason="the suite compiles as the trainer does (no level 0 to check)")
def test_every_quantizer_gives_the_same_bits_at_level_0_and_the_default(tmp_path):
  runs = {}
  for name, flags in (("suite", os.environ["XLA_FLAGS"]), ("trainer", "")):
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
      [sys.executable, "-c", SCRIPT, str(tmp_path / f"{name}.npz")],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs[name] = dict(np.load(tmp_path / f"{name}.npz"))
  assert len(runs["suite"]) == 4 * 3 + 2 * 2 and runs["suite"].keys() == runs["trainer"].keys()
  for key, suite in runs["suite"].items():
    np.testing.assert_array_equal(suite, runs["trainer"][key], err_msg=key)
