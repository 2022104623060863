"""The training entry point: config -> model and precision plan -> jitted train step -> metrics.

    python train.py CONFIG.yml [key=value ...]     (same as python -m MaxText.train ...)
"""

import datetime
import logging
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from MaxText import accounting, config as config_lib, data, metrics, optimizer, precision
from MaxText.model.decoder import GEMMS, Transformer
from MaxText.quantization import stats as quant_stats

log = logging.getLogger("MaxText")


class UserError(Exception):
  """A mistake the user can fix: printed as one line on stderr, exit code 2."""


def device_memory_gib(cfg, devices):
  """Memory per device for the preflight: hardware_memory_gib, the accelerator's limit, or host RAM."""
  if cfg.hardware_memory_gib > 0:
    return cfg.hardware_memory_gib
  stats = devices[0].memory_stats() if hasattr(devices[0], "memory_stats") else None
  if stats and stats.get("bytes_limit"):
    return stats["bytes_limit"] / accounting.GIB
  with open("/proc/meminfo", encoding="ascii") as f:
    info = dict(line.split(":", 1) for line in f)
  available_kib = int(info["MemAvailable"].split()[0])
  return available_kib / 2 ** 20 / len(devices)  # virtual CPU devices share the host


def summary(cfg, run_shape):
  flops = accounting.training_flops_per_device(cfg)
  mem = accounting.memory_per_device(cfg, run_shape.num_devices, run_shape.micro_batch_size)
  lines = [
      f"model: {cfg.model_name}",
      f"parameters: {accounting.param_count(cfg)}",
      f"TFLOPs per device per step: {flops.tflops:.2f}",
      f"memory per device: {mem.total_gib:.2f} GiB",
      f"  parameters {mem.params / accounting.GIB:.2f} GiB ({cfg.weight_dtype}), gradients "
      f"{mem.grads / accounting.GIB:.2f} GiB (f32), optimizer state {mem.optimizer / accounting.GIB:.2f} GiB "
      f"(AdamW mu+nu f32), activations ~{mem.activations / accounting.GIB:.2f} GiB "
      f"(remat_policy={cfg.remat_policy}, micro-batch {run_shape.micro_batch_size}, estimate)",
      f"  sharding: parameters and optimizer state over {run_shape.num_devices} device(s)",
      f"global batch: {run_shape.global_batch_size} sequences x {cfg.max_target_length} tokens "
      f"({run_shape.tokens_per_step} tokens/step)",
  ]
  return "\n".join(lines), mem


def preflight(cfg, mem, devices):
  have = device_memory_gib(cfg, devices)
  need = mem.total_gib
  if need > have:
    raise UserError(
        f"estimated memory per device {need:.1f} GiB exceeds the {have:.1f} GiB available on "
        f"{devices[0].platform} ({len(devices)} device(s)); use more devices, a smaller model, or lower "
        "per_device_batch_size / max_target_length, or remat_policy=full (or set hardware_memory_gib)")


def loss_terms(model, batch, layer_precisions, key, stats_sinks=None):
  """(sum of weighted token cross-entropies, sum of weights) for one micro-batch."""
  logits = model(batch["inputs"], batch["positions"], batch["segment_ids"], layer_precisions=layer_precisions,
                 key=key, stats_sinks=stats_sinks)
  xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
  return jnp.sum(xent * batch["weights"]), jnp.sum(batch["weights"])


def make_train_step(graphdef, tx, plan, accumulation_steps, seed, num_layers=0):
  """The jitted step: gradient accumulation over micro-batches, clipping and AdamW (state donated).

  With `num_layers` > 0 the step also returns quantization telemetry ("quant_stats": {gemm:
  [layers, roles, stats]}, averaged over micro-batches) through zero sinks' gradients.
  """
  sinks = {g: jnp.zeros((num_layers, len(quant_stats.ROLES), len(quant_stats.STATS))) for g in GEMMS}

  def micro_grads(params, rest, micro_batch, key):
    def loss_sum(p, s):
      return loss_terms(nnx.merge(graphdef, p, rest), micro_batch, plan.layer_ranges, key, s)
    if not num_layers:
      (xent_sum, weight_sum), grads = jax.value_and_grad(loss_sum, has_aux=True)(params, None)
      return xent_sum, weight_sum, (grads, {})
    (xent_sum, weight_sum), grads = jax.value_and_grad(loss_sum, argnums=(0, 1), has_aux=True)(params, sinks)
    return xent_sum, weight_sum, grads

  def step_fn(params, rest, opt_state, batch, step):
    step_key = jax.random.fold_in(jax.random.key(seed), step)
    micro = jax.tree.map(lambda a: a.reshape(accumulation_steps, -1, *a.shape[1:]), batch)

    def accumulate(carry, xs):
      micro_batch, index = xs
      xent, weight, grads = micro_grads(params, rest, micro_batch, jax.random.fold_in(step_key, index))
      acc_xent, acc_weight, acc_grads = carry
      return (acc_xent + xent, acc_weight + weight, jax.tree.map(jnp.add, acc_grads, grads)), None

    zeros = jax.tree.map(jnp.zeros_like, (params, sinks if num_layers else {}))
    (xent, weights, (grads, stats)), _ = jax.lax.scan(accumulate, (0.0, 0.0, zeros),
                                                      (micro, jnp.arange(accumulation_steps)))
    grads = jax.tree.map(lambda g: g / jnp.maximum(weights, 1.0), grads)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    step_metrics = {"loss": xent / jnp.maximum(weights, 1.0), "total_weights": weights,
                    "grad_norm": optax.tree.norm(grads)}
    if num_layers:
      step_metrics["quant_stats"] = jax.tree.map(lambda s: s / accumulation_steps, stats)
    return params, opt_state, step_metrics

  return jax.jit(step_fn, donate_argnums=(0, 2))


def run_dir(cfg):
  name = cfg.run_name or datetime.datetime.now().strftime("run_%Y%m%d_%H%M%S")
  return os.path.join(cfg.base_output_directory, name)


def train(cfg):
  """Train per `cfg`; returns the list of per-step losses."""
  devices = jax.devices()
  run_shape = config_lib.RunShape.of(cfg, len(devices))
  text, mem = summary(cfg, run_shape)
  plan = precision.plan_from_config(cfg)
  print(text)
  print("precision plan:\n" + precision.format_plan(plan, cfg))
  if cfg.high_precision_from_step >= 0:
    print(f"from step {cfg.high_precision_from_step}: every GEMM in bf16")
  if cfg.dry_run:
    nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(cfg.seed)))  # the model builds, abstractly
    return []
  preflight(cfg, mem, devices)

  mesh = Mesh(np.array(devices), ("data",))
  replicated, batch_sharding = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  model = Transformer(cfg, rngs=nnx.Rngs(cfg.seed))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params = jax.device_put(params, replicated)
  tx = optimizer.make_optimizer(cfg)
  opt_state = jax.device_put(tx.init(params), replicated)
  # A few compiled steps, never one per step: the plan's, the all-BF16 one from
  # high_precision_from_step, and each of those with telemetry every quantization_stats_period.
  compiled_steps = {}

  def train_step_for(step):
    high = 0 <= cfg.high_precision_from_step <= step
    step_plan = precision.plan_from_config(cfg, high_precision=high)
    stats = step_plan.quantized and cfg.quantization_stats_period > 0 and step % cfg.quantization_stats_period == 0
    if (high, stats) not in compiled_steps:
      compiled_steps[high, stats] = (step_plan, make_train_step(
          graphdef, tx, step_plan, cfg.gradient_accumulation_steps, cfg.seed,
          num_layers=cfg.base_num_decoder_layers if stats else 0))
    return compiled_steps[high, stats]

  data_iter = data.make_iterator(cfg, run_shape)
  flops = accounting.training_flops_per_device(cfg)
  schedule = optimizer.learning_rate_schedule(cfg)
  out_dir = run_dir(cfg)
  writer = metrics.MetricsWriter(out_dir, tensorboard=cfg.enable_tensorboard, flush_period=cfg.log_period)
  losses = []
  try:
    last = time.perf_counter()
    for step in range(cfg.steps):
      batch = jax.device_put(next(data_iter)._asdict(), batch_sharding)
      step_plan, step_fn = train_step_for(step)
      params, opt_state, step_metrics = step_fn(params, rest, opt_state, batch, jnp.int32(step))
      loss = float(step_metrics["loss"])
      now = time.perf_counter()
      seconds, last = now - last, now
      if not np.isfinite(loss):
        raise UserError(f"loss is {loss} at step {step}; lower learning_rate or check the data "
                        f"(metrics so far in {out_dir})")
      tokens_per_device = run_shape.tokens_per_step / run_shape.num_devices
      record = {"loss": loss, "seconds": seconds, "TFLOP/s/device": flops.tflops / seconds,
                "Tokens/s/device": tokens_per_device / seconds,
                "total_weights": float(step_metrics["total_weights"]),
                "grad_norm": float(step_metrics["grad_norm"]),
                "learning_rate": float(schedule(step))}
      if "quant_stats" in step_metrics:
        record.update(precision.stats_record(step_plan, jax.device_get(step_metrics["quant_stats"])))
      print(metrics.step_line(step, seconds, record["TFLOP/s/device"], record["Tokens/s/device"],
                              record["total_weights"], loss), flush=True)
      writer.write(step, record)
      losses.append(loss)
  finally:
    writer.close()
  return losses


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
  if not argv or argv[0] in ("-h", "--help"):
    print(__doc__.strip())
    return 0 if argv else 2
  try:
    cfg = config_lib.load(argv[0], argv[1:])
    train(cfg)
  except (config_lib.ConfigError, UserError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
