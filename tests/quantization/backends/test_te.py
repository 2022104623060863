"""Transformer Engine vs the emulation: runs only where TE can run the recipe (Blackwell + TE)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.quantization import backends, get_recipe, qmatmul
from MaxText.quantization.backends import te as te_backend


@pytest.mark.parametrize("name", ["te_nvfp4", "te_nvfp4_no_rht", "te_fp8_currentscaling", "te_mxfp8"])
def test_te_matches_emulation(name):
  recipe = get_recipe(name, disable_stochastic_rounding=True) if "nvfp4" in name else get_recipe(name)
  reason = te_backend.unavailable_reason(recipe)
  if reason:
    pytest.skip(reason)
  kx, kw, kd = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (256, 512), jnp.bfloat16)
  w = jax.random.normal(kw, (512, 256), jnp.float32)
  dy = jax.random.normal(kd, (256, 256), jnp.bfloat16)
  outs = {}
  for backend in ("te", "emulate"):
    y, vjp = jax.vjp(lambda x, w, b=backends.Choice(backend): qmatmul(x, w, recipe, backend=b), x, w)
    outs[backend] = (y, *vjp(dy))
  for got, want in zip(outs["te"], outs["emulate"]):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


def test_unavailable_reason_on_this_machine_is_a_sentence():
  reason = te_backend.unavailable_reason(get_recipe("te_nvfp4"))
  assert reason is None or "SM100" in reason or "not importable" in reason
  assert "no Transformer Engine kernel" in te_backend.unavailable_reason(get_recipe("mxfp4"))
