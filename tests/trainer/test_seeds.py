"""Seeds are arguments of the compiled programs, not constants in them: every seed runs one compiled init and train
step (a second seed compiles nothing), and different seeds still train differently."""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText import config, precision, train
from MaxText.model.decoder import abstract_model
from MaxText.runtime.compile_count import CompileCounter
from MaxText.trainer import optimizer, train_step
from tests.conftest import REPO
from tests.trainer.test_train import SMALL

# te_nvfp4: the step's stochastic rounding draws from the seed's key, as the init does.
SEEDED = SMALL + ["quantization=te_nvfp4", "steps=3"]


def _cfg(tmp_path, seed):
  run = [f"base_output_directory={tmp_path}", f"run_name=s{seed}", f"seed={seed}"]
  return config.load(REPO / "configs" / "llama3_tiny.yml", SEEDED + run)


def test_a_second_seed_compiles_nothing_and_trains_differently(tmp_path):
  with CompileCounter() as first:
    losses_0 = train.train(_cfg(tmp_path, 0))
  with CompileCounter() as second:
    losses_1 = train.train(_cfg(tmp_path, 1))
  # Seed 0 compiled (or found in the suite's cache) the init and the step; seed 1 found the same programs.
  assert first.compiled["jit(init)"] + first.cache_hits["jit(init)"] == 1
  assert first.compiled["jit(step_fn)"] + first.cache_hits["jit(step_fn)"] == 1
  assert second.compilations == 0, second.compiled
  assert second.cache_hits["jit(init)"] == 1 and second.cache_hits["jit(step_fn)"] == 1
  assert len(losses_0) == len(losses_1) == 3
  assert all(a != b for a, b in zip(losses_0, losses_1)), (losses_0, losses_1)


def _lowered_step_text(cfg, seed):
  graphdef, params, rest = abstract_model(cfg)
  tx = optimizer.make_optimizer(cfg)
  step = train_step.make_train_step(graphdef, tx, precision.plan_from_config(cfg), cfg.gradient_accumulation_steps)
  tokens = jax.ShapeDtypeStruct((8, 32), jnp.int32)
  batch = {k: tokens for k in ("inputs", "positions", "segment_ids", "targets")}
  batch["weights"] = jax.ShapeDtypeStruct((8, 32), jnp.float32)
  step_index = jax.ShapeDtypeStruct((), jnp.int32)
  return step.lower(params, rest, jax.eval_shape(tx.init, params), batch, step_index, jax.random.key(seed)).as_text()


def test_the_step_program_is_the_same_for_every_seed(tmp_path):
  text = _lowered_step_text(_cfg(tmp_path, 0), 0)
  assert text == _lowered_step_text(_cfg(tmp_path, 12345), 12345)
  assert "12345" not in text


def test_the_key_argument_is_the_seed_constant_it_replaced():
  # What the step used to fold the step into (the seed compiled in) is what it now receives: the same key bits.
  seed, step = 2**32 - 1, 7
  compiled_in = jax.jit(lambda s: jax.random.key_data(jax.random.fold_in(jax.random.key(seed), s)))(step)
  argument = jax.jit(lambda k, s: jax.random.key_data(jax.random.fold_in(k, s)))(jax.random.key(seed), step)
  np.testing.assert_array_equal(compiled_in, argument)
