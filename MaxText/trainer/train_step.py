"""The step functions: loss of a micro-batch, the jitted train step (accumulation, clipping, AdamW) and eval step, the
TrainState a step advances, and the few compiled variants a run needs (StepFunctions)."""

import dataclasses
import functools
import typing

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from MaxText import data, precision
from MaxText.model import vocab_tiling
from MaxText.precision import GEMMS
from MaxText.quantization import stats as quant_stats


@dataclasses.dataclass
class TrainState:
  """What one step turns into the next: the step count (steps completed), parameters, the amax histories
  (`rest`, empty unless FP8 delayed scaling) and the optimizer state."""

  step: int
  params: typing.Any
  rest: typing.Any
  opt_state: typing.Any

  def checkpoint_tree(self):
    """What a checkpoint holds: parameters, optimizer state and, with delayed scaling, the amax histories."""
    tree = {"params": self.params, "opt_state": self.opt_state}
    if jax.tree.leaves(self.rest):
      tree["amax_history"] = self.rest
    return tree


def loss_terms(model, batch, layer_precisions, key, stats_sinks=None, packed=True):
  """(sum of weighted token cross-entropies, sum of weights) for one micro-batch; with num_vocab_tiling > 1
  the lm head and its cross-entropy run tile by tile (model/vocab_tiling.py), never all logits at once. `packed`:
  a row may hold several documents (data.packed_documents), which attention then never crosses; else causal only."""
  x = model.hidden(
    batch["inputs"],
    batch["positions"],
    batch["segment_ids"] if packed else None,
    layer_precisions=layer_precisions,
    key=key,
    stats_sinks=stats_sinks,
  )
  if model.num_vocab_tiling > 1:
    xent_sum = vocab_tiling.xent_sum(
      x, model.head_kernel(), batch["targets"], batch["weights"], model.num_vocab_tiling, model.logits_dtype
    )
  else:
    xent = optax.softmax_cross_entropy_with_integer_labels(model.logits(x), batch["targets"])
    xent_sum = jnp.sum(xent * batch["weights"])
  return xent_sum, jnp.sum(batch["weights"])


def _stats_sinks(num_layers):
  """{gemm: zeros [layers, roles, stats]}: the telemetry sinks (their gradients are the stats), {} without telemetry.
  Host zeros (numpy), not jnp: made eagerly, and a step compiled for a GPU that is not there (train_compile) has no
  device to put a jnp array on."""
  if not num_layers:
    return {}
  return {g: np.zeros((num_layers, len(quant_stats.ROLES), len(quant_stats.STATS)), np.float32) for g in GEMMS}


def _accumulated_grads(graphdef, plan, accumulation_steps, sinks, packed):
  """(params, rest, batch, step_key) -> (xent sum, weight sum, summed gradients, summed stats, the last `rest`):
  the micro-batches' loss terms and gradients w.r.t. the parameters, `rest` (the amax histories: their gradient is
  the new history) and the telemetry sinks (their gradient is the stats), accumulated by a scan."""

  def micro_grads(params, rest, micro_batch, key):
    def loss_sum(p, r, s):
      return loss_terms(nnx.merge(graphdef, p, r), micro_batch, plan.layer_ranges, key, s or None, packed)

    return jax.value_and_grad(loss_sum, argnums=(0, 1, 2), has_aux=True)(params, rest, sinks)

  def accumulated(params, rest, batch, step_key):
    micro = jax.tree.map(lambda a: a.reshape(accumulation_steps, -1, *a.shape[1:]), batch)

    def accumulate(carry, xs):
      micro_batch, index = xs
      acc_xent, acc_weight, acc_grads, acc_stats, rest = carry
      (xent, weight), (grads, new_rest, stats) = micro_grads(
        params, rest, micro_batch, jax.random.fold_in(step_key, index)
      )
      # Each micro-batch quantizes with the histories the previous one left (TE's behaviour).
      add = functools.partial(jax.tree.map, jnp.add)
      return (acc_xent + xent, acc_weight + weight, add(acc_grads, grads), add(acc_stats, stats), new_rest), None

    zeros = jax.tree.map(jnp.zeros_like, (params, sinks))
    return jax.lax.scan(accumulate, (0.0, 0.0, *zeros, rest), (micro, jnp.arange(accumulation_steps)))[0]

  return accumulated


def make_train_step(graphdef, tx, plan, accumulation_steps, num_layers=0, state_shardings=None, packed=True):
  """The jitted step (params, rest, opt_state, batch, step, seed_key): gradient accumulation over micro-batches,
  clipping and AdamW (state donated; `state_shardings`: the (params, rest, opt_state) shardings it returns). The
  run's key (`seed_key`, jax.random.key(seed)) is an argument, not a constant of the program, so every seed runs the
  same compiled step (one compilation, or one cache entry). `packed`: as loss_terms's.

  With `num_layers` > 0 the step also returns quantization telemetry ("quant_stats": {gemm:
  [layers, roles, stats]}, averaged over micro-batches) through zero sinks' gradients.
  """
  accumulated = _accumulated_grads(graphdef, plan, accumulation_steps, _stats_sinks(num_layers), packed)

  def step_fn(params, rest, opt_state, batch, step, seed_key):
    xent, weights, grads, stats, rest = accumulated(params, rest, batch, jax.random.fold_in(seed_key, step))
    grads = jax.tree.map(lambda g: g / jnp.maximum(weights, 1.0), grads)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    step_metrics = {
      "loss": xent / jnp.maximum(weights, 1.0),
      "total_weights": weights,
      "grad_norm": optax.tree.norm(grads),
    }
    if num_layers:
      step_metrics["quant_stats"] = jax.tree.map(lambda s: s / accumulation_steps, stats)
    return params, rest, opt_state, step_metrics

  # The new state leaves in the shardings it came in with (run_setup.abstract_train_state's): without them XLA may
  # choose others (e.g. all-reduced, replicated gradients and moments instead of reduce-scattered, sharded ones).
  out_shardings = None if state_shardings is None else (*state_shardings, None)
  return jax.jit(step_fn, donate_argnums=(0, 2), out_shardings=out_shardings)


def make_eval_step(graphdef, plan, packed=True):
  """Jitted (sum of token losses, sum of weights) of one batch under the plan's forward numerics."""

  def eval_fn(params, rest, batch):
    return loss_terms(nnx.merge(graphdef, params, rest), batch, plan.layer_ranges, jax.random.key(0), packed=packed)

  return jax.jit(eval_fn)


class StepFunctions:
  """The compiled train steps a run needs, never one per step: the plan's, the all-BF16 one from
  high_precision_from_step, and each with telemetry every quantization_stats_period; plus the eval step.
  `seed_key`: the run's jax.random.key(seed), the train steps' last argument."""

  def __init__(self, cfg, graphdef, tx, plan, state_shardings, seed_key):
    self.cfg, self.graphdef, self.tx, self.state_shardings = cfg, graphdef, tx, state_shardings
    self.seed_key = seed_key
    self.plans = {False: plan, True: precision.plan_from_config(cfg, high_precision=True)}
    self._compiled = {}
    self.packed = data.packed_documents(cfg)
    self.eval_step = make_eval_step(graphdef, plan, self.packed) if cfg.eval_interval > 0 else None

  def for_step(self, step):
    """(plan, jitted step function) for `step`."""
    cfg = self.cfg
    high = 0 <= cfg.high_precision_from_step <= step
    plan = self.plans[high]
    stats = plan.quantized and cfg.quantization_stats_period > 0 and step % cfg.quantization_stats_period == 0
    if (high, stats) not in self._compiled:
      self._compiled[high, stats] = (
        plan,
        make_train_step(
          self.graphdef,
          self.tx,
          plan,
          cfg.gradient_accumulation_steps,
          num_layers=cfg.base_num_decoder_layers if stats else 0,
          state_shardings=self.state_shardings,
          packed=self.packed,
        ),
      )
    return self._compiled[high, stats]
