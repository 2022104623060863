"""Calibration: the activation amax each NVFP4 MLP GEMM of a trained model sees on the config's data, under the run's
precision plan (the `input_scale` of a ModelOpt NVFP4 export).

Training quantizes a GEMM's activations with their own amax, call by call; a serving engine quantizes them with one
static scale per GEMM, from an amax measured beforehand. No NVFP4 recipe records activation amax while training (only
FP8 delayed scaling keeps histories), so it is measured here: the first N batches of the config's training data run
through the trained model's forward pass, and each GEMM keeps the largest |x| it multiplied (gate and up read the
same x). Each NVFP4 layer runs as its own layer range whose GEMMs go through `AmaxRecorder`, a backend that reports
max |x| to the host (jax.debug.callback) and then runs the backend the plan chose: the forward pass is the plan's.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from MaxText import config as config_lib
from MaxText import data, precision
from MaxText.checkpointing import restore_params
from MaxText.model.decoder import abstract_model
from MaxText.quantization import backends
from MaxText.quantization.formats import Format, grids
from MaxText.runtime import sharding

DEFAULT_BATCHES = 32


class AmaxRecorder(backends.Backend):
  """A backend for one (layer, gemm): `sink[(layer, gemm)]` becomes the max |x| over its calls (NaN sticks), then
  the GEMM runs on the backend `choice` resolves to."""

  name = "amax recorder"

  def __init__(self, choice, layer, gemm, sink):
    self.choice, self.key, self.sink = choice, (layer, gemm), sink

  def unavailable_reason(self, recipe):
    return backends.resolve(recipe, self.choice).unavailable_reason(recipe)

  def _record(self, amax):
    amax, old = float(amax), self.sink.get(self.key)
    if old is None or amax != amax or amax > old:
      self.sink[self.key] = old if old is not None and old != old else amax

  def dense(self, x, w, recipe, **options):
    jax.debug.callback(self._record, grids.abs_max(x.astype(jnp.float32)))
    return backends.resolve(recipe, self.choice).dense(x, w, recipe, **options)


def recording_ranges(plan, sink):
  """The plan's layer ranges with every layer whose MLP GEMMs are NVFP4 on its own, recorded into `sink`."""
  out = []
  for start, stop, prec in plan.layer_ranges:
    if prec["gate"].recipe.format is not Format.NVFP4:
      out.append((start, stop, prec))
      continue
    for layer in range(start, stop):
      recorded = {
        g: p._replace(backend=AmaxRecorder(p.backend, layer, g, sink)) if g in precision.MLP_GEMMS else p
        for g, p in prec.items()
      }
      out.append((layer, layer + 1, recorded))
  return out


def _describe(cfg, batches, tokens):
  data_source = {
    "synthetic": f"synthetic (seed {cfg.seed})",
    "grain": cfg.grain_train_files,
    "tfds": f"{cfg.dataset_name}:{cfg.train_split}",
  }.get(cfg.dataset_type, cfg.dataset_type)
  return {
    "source": "calibrated",
    "why": "no NVFP4 recipe records activation amax in training",
    "batches": batches,
    "tokens": tokens,
    "data": f"{cfg.dataset_type}: {data_source}, the first {batches} training batches",
    "amax": "max |x| per GEMM over the batches, forward pass under the run's precision plan",
  }


def calibrate(cfg, step_dir, num_batches=DEFAULT_BATCHES, log=print):
  """({(layer, gemm): activation amax} of the NVFP4 MLP GEMMs, a description of the calibration) for the parameters of
  checkpoint `step_dir` of `cfg`'s model."""
  if num_batches < 1:
    raise config_lib.ConfigError(f"--calibration-batches {num_batches}: must be at least 1")
  devices = jax.devices()
  mesh = sharding.make_mesh(cfg, devices)
  run_shape = config_lib.RunShape.of(cfg, len(devices))
  graphdef, abstract_params, rest = abstract_model(cfg)
  sink = {}
  ranges = recording_ranges(precision.plan_from_config(cfg.replace(disable_stochastic_rounding=True)), sink)

  def forward(params, inputs, positions, segment_ids):
    model = nnx.merge(graphdef, params, rest)
    segments = segment_ids if data.packed_documents(cfg) else None
    return grids.abs_max(model.hidden(inputs, positions, segments, layer_precisions=ranges).astype(jnp.float32))

  with sharding.use_mesh(mesh):
    shardings = sharding.param_shardings(abstract_params, mesh)
    template = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params, shardings)
    params = restore_params(step_dir, template)
    batch_sharding = sharding.batch_sharding(mesh)
    step = jax.jit(forward)
    iterator = data.make_iterator(cfg.replace(eval_interval=0), run_shape)
    tokens = 0
    try:
      for i in range(num_batches):
        batch = next(iterator)
        put = lambda a: jax.device_put(a, batch_sharding)
        step(params, put(batch.inputs), put(batch.positions), put(batch.segment_ids)).block_until_ready()
        tokens += int((batch.segment_ids != 0).sum())
        if i == 0:
          log(f"calibrating input_scale: {num_batches} batch(es) of {math.prod(batch.inputs.shape)} tokens")
    finally:
      iterator.close()
    jax.effects_barrier()
  return sink, _describe(cfg, num_batches, tokens)
