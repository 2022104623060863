"""MaxText's GPU-script keys do what they do in MaxText: opt_type (adam_pax against Praxis' formula, sgd),
reuse_example_batch, logits_dot_in_fp32, matmul_precision and max_segments_per_seq."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from MaxText import config, data
from MaxText.model.decoder import Transformer
from MaxText.trainer import optimizer, run
from tests.data.corpus import REPO, grain_overrides
from tests.trainer.test_train import SMALL


def _cfg(*extra):
  return config.load(REPO / "configs" / "llama3_tiny.yml", SMALL + list(extra))


def _praxis_adam(grads, params, steps, lr, b1, b2, eps, eps_root, wd):
  """MaxText's adam_pax as Praxis writes it: bias-corrected decay rates, no separate bias correction."""
  mu, nu, out = np.zeros_like(params), np.zeros_like(params), []
  for t, g in enumerate(grads):
    decay = lambda d, t=t: d * (1 - d**t) / (1 - d ** (t + 1))
    mu = (1 - decay(b1)) * g + decay(b1) * mu
    nu = (1 - decay(b2)) * g**2 + decay(b2) * nu
    out.append(-lr(t) * (mu / (np.sqrt(nu + eps_root) + eps) + wd * params))
  return out


@pytest.mark.parametrize("opt_type", ["adam_pax", "sgd"])
def test_opt_type_updates(opt_type):
  cfg = _cfg(f"opt_type={opt_type}", "gradient_clipping_threshold=0", "adam_eps_root=1e-6", "warmup_steps=2")
  tx, schedule = optimizer.make_optimizer(cfg), optimizer.learning_rate_schedule(cfg)
  params = np.linspace(-1, 1, 12, dtype=np.float64).reshape(3, 4)
  grads = [np.cos(np.arange(12.0) * (t + 1)).reshape(3, 4) for t in range(4)]
  with jax.enable_x64():
    state, got = tx.init(jnp.asarray(params)), []
    for g in grads:
      update, state = tx.update(jnp.asarray(g), state, jnp.asarray(params))
      got.append(np.asarray(update))
  lr = lambda t: float(schedule(t))
  if opt_type == "sgd":
    want = [-lr(t) * g for t, g in enumerate(grads)]  # no momentum, no weight decay
  else:
    want = _praxis_adam(grads, params, 4, lr, cfg.adam_b1, cfg.adam_b2, cfg.adam_eps, 1e-6, cfg.adam_weight_decay)
  np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_reuse_example_batch_repeats_the_first_batch_and_resumes_on_it():
  cfg = _cfg("reuse_example_batch=1")
  shape = config.RunShape.of(cfg, 1)
  it = data.make_iterator(cfg, shape)
  first = next(it)
  assert all(next(it) is first for _ in range(3))
  again = data.make_iterator(cfg, shape)
  again.set_state(it.get_state())
  np.testing.assert_array_equal(next(again).inputs, first.inputs)
  assert not np.array_equal(next(data.make_iterator(_cfg(), shape)).inputs, next(_skip(cfg, shape)).inputs)


def _skip(cfg, shape):
  it = data.make_iterator(cfg.replace(reuse_example_batch=0), shape)
  next(it)
  return it


def test_logits_dot_in_fp32_runs_the_lm_head_on_f32_operands(cpu_gemm_choice):
  cpu_gemm_choice("bfloat16")  # the CPU's GEMMs on bf16 operands, as a GPU's: only logits_dot_in_fp32 widens them
  x = jax.random.normal(jax.random.key(0), (2, 8, 64), jnp.float32)
  logits = {}
  for fp32 in (False, True):
    model = Transformer(_cfg(f"logits_dot_in_fp32={str(fp32).lower()}"), rngs=nnx.Rngs(0))
    hlo = jax.jit(model.logits).lower(x).as_text()
    assert ("dot_general" in hlo) and (("bf16" in hlo.split("dot_general")[1].split("\n")[0]) != fp32)
    logits[fp32] = np.asarray(model.logits(x))
  exact = np.einsum("bld,dv->blv", np.asarray(x, np.float64), np.asarray(model.head_kernel(), np.float64))
  assert np.abs(logits[True] - exact).max() < 1e-4 < np.abs(logits[False] - exact).max()


def test_matmul_precision_reaches_every_f32_dot():
  f = lambda a, b: a @ b
  a = jnp.ones((4, 4), jnp.float32)
  with run.matmul_precision(_cfg("matmul_precision=float32")):
    assert "HIGHEST" in jax.jit(f).lower(a, a).as_text().upper()
  with run.matmul_precision(_cfg()):
    assert "HIGHEST" not in jax.jit(f).lower(a, a).as_text().upper()


def test_max_segments_per_seq_caps_documents_per_row(corpus):
  for cap, most in ((-1, None), (2, 2)):
    cfg = _cfg(*grain_overrides(corpus), f"max_segments_per_seq={cap}", "max_target_length=512")
    batch = next(data.make_iterator(cfg, config.RunShape.of(cfg, 1)))
    segments = max(len(set(row[row > 0].tolist())) for row in batch.segment_ids)
    assert segments <= most if most else segments > 2
