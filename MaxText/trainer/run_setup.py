"""Building a run: its directory (owned), mesh, sharded state (fresh, resumed or loaded), data, compiled steps and
the hooks the loop calls (metrics, eval, checkpoints, profiler, stops), gathered in one `Run`."""

import dataclasses
import json
import logging
import os
import typing

import jax
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from MaxText import checkpointing, data, precision, storage
from MaxText.checkpointing import parameters
from MaxText.errors import UserError
from MaxText.model import accounting
from MaxText.model.decoder import Transformer, abstract_model
from MaxText.runtime import prefetch, run_lock, sharding
from MaxText.trainer import optimizer
from MaxText.trainer.hooks import metrics, profiler
from MaxText.trainer.hooks.checkpoint import CheckpointHook
from MaxText.trainer.hooks.eval import EvalHook
from MaxText.trainer.hooks.preemption import StopHook
from MaxText.trainer.train_step import StepFunctions, TrainState

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class Run:
  """What the loop runs (state, steps, batches, hooks) on `mesh`, and what `close()` releases, in reverse."""

  mesh: typing.Any
  state: TrainState
  steps: StepFunctions
  batches: prefetch.Prefetcher
  hooks: list
  checkpointer: typing.Optional[checkpointing.Checkpointer]
  closing: list  # what to close when the run is over, in the order it was opened (hooks included)
  lock: typing.Optional[run_lock.RunLock]
  closed: bool = False

  def close(self, after_failure=False):
    """Closes everything, newest first, even if one fails, then releases the lock (once). A close that fails is
    raised after the others closed; `after_failure` (the run is already failing with its own error): each is
    logged as a warning instead, so the error the user must see stays the one raised."""
    if self.closed:
      return
    self.closed = True
    try:
      close_all(self.closing, after_failure)
    finally:
      if self.lock is not None:
        self.lock.release()


def close_all(things, after_failure=False):
  """Closes `things` newest first; every one is tried. The first failure is raised after (`after_failure`: logged)."""
  failure = None
  for thing in reversed(things):
    try:
      thing.close()
    except Exception as e:  # pylint: disable=broad-except  (the rest must still close)
      if after_failure:
        _log.warning("closing %s after the failure failed too: %s", type(thing).__name__, e)
      failure = failure or e
  if failure is not None and not after_failure:
    raise failure


def abstract_train_state(cfg, mesh, tx):
  """(graphdef, TrainState of jax.ShapeDtypeStruct) for `cfg` on `mesh`, nothing allocated, every leaf carrying its
  sharding, decided here once for init, restore, the step's outputs and train_compile: parameters by the logical
  axis rules (sharding.PARAM_AXES), each optimizer-state copy of the parameters (AdamW's mu and nu) like its
  parameter (MaxText's rule: the optimizer state is sharded like the params), everything else (AdamW's count, the
  amax histories) replicated."""
  graphdef, params, rest = abstract_model(cfg)
  param_shardings = sharding.param_shardings(params, mesh)
  replicated = NamedSharding(mesh, P())
  opt_shardings = optax.tree_map_params(
    tx,
    lambda _, s: s,
    jax.eval_shape(tx.init, params),
    param_shardings,
    transform_non_params=lambda _: replicated,
    is_leaf=lambda x: isinstance(x, NamedSharding),
  )
  with_sharding = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
  state = TrainState(
    0,
    jax.tree.map(with_sharding, params, param_shardings),
    jax.tree.map(lambda a: with_sharding(a, replicated), rest),
    jax.tree.map(with_sharding, jax.eval_shape(tx.init, params), opt_shardings),
  )
  return graphdef, state


def state_shardings(state):
  """The NamedShardings of a TrainState's (params, rest, opt_state), abstract or concrete."""
  return jax.tree.map(lambda a: a.sharding, (state.params, state.rest, state.opt_state))


def init_sharded(cfg, mesh, tx, seed_key):
  """(graphdef, TrainState at step 0) created directly in abstract_train_state's shardings (nothing materialised
  whole on one device). `seed_key` (jax.random.key(seed)) is the program's argument, not a constant in it: every
  seed runs one compiled init."""
  graphdef, abstract = abstract_train_state(cfg, mesh, tx)
  param_shardings, rest_shardings, opt_shardings = state_shardings(abstract)

  def init(seed_key):
    _, params, rest = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed_key)), nnx.Param, ...)
    return params, rest, tx.init(params)

  params, rest, opt_state = jax.jit(init, out_shardings=(param_shardings, rest_shardings, opt_shardings))(seed_key)
  return graphdef, TrainState(0, params, rest, opt_state)


def global_batch(batch, batch_sharding):
  """This process's rows of the batch -> global arrays sharded over the mesh."""
  return {k: jax.make_array_from_process_local_data(batch_sharding, np.asarray(v)) for k, v in batch._asdict().items()}


def _gather_positions(position):
  if jax.process_count() == 1:
    return {"0": position}
  blob = np.frombuffer(json.dumps(position).encode("utf-8"), np.uint8)
  lengths = multihost_utils.process_allgather(np.array([blob.size])).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[: blob.size] = blob
  blobs = multihost_utils.process_allgather(padded)
  return {str(i): json.loads(bytes(blobs[i][: lengths[i]]).decode("utf-8")) for i in range(len(lengths))}


def _optimizer_count(opt_state):
  """Updates the optimizer has applied (AdamW's count): the step of a checkpoint that doesn't say."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
    if getattr(path[-1], "name", None) == "count":
      return int(leaf)
  return 0


def _initial_state(cfg, checkpointer, template):
  """(steps completed, state tree, data position, the config it was written under or {}): the run's own newest
  checkpoint, else a load_* path."""
  if checkpointer is not None:
    restored = checkpointer.restore_latest(template)
    if restored is not None:
      step, tree, data_state = restored
      print(f"resuming from checkpoint {checkpointer.directory}/{step}", flush=True)
      return step, tree, data_state, _written_under(checkpointer.directory / str(step))
  if cfg.load_full_state_path:
    tree, data_state, step = checkpointing.restore_step_dir(cfg.load_full_state_path, template)
    step = _optimizer_count(tree["opt_state"]) if step is None else step
    print(f"loaded the full state from {cfg.load_full_state_path} (step {step})", flush=True)
    return step, tree, data_state, _written_under(cfg.load_full_state_path)
  if cfg.load_parameters_path:
    params = parameters.load(cfg, cfg.load_parameters_path, template["params"])
    print(f"loaded parameters from {cfg.load_parameters_path}; fresh optimizer state, step 0", flush=True)
    return 0, {**template, "params": params}, {}, {}
  return 0, template, {}, {}


def _written_under(step_dir):
  """The settings a checkpoint's meta says it was written under ({} when it doesn't say)."""
  try:
    return dict(checkpointing.read_meta(step_dir).get("config") or {})
  except Exception:  # pylint: disable=broad-except  (the state restored; a meta it can't read says nothing)
    return {}


def _recipe_change(cfg, step, written_under):
  """A resumed state that another recipe or plan trained: said in one line; the record for metrics.jsonl."""
  change = precision.change_on_resume(written_under, cfg, step) if written_under else None
  if change is None:
    return {}
  line, record = change
  print(line, flush=True)
  return {"recipe_change": record}


def _restore_position(data_iter, data_state, process_index, dataset_type):
  if not data_state:
    return
  own = data_state.get(str(process_index))
  if own is None:
    raise UserError(
      f"the checkpoint holds data positions for processes {sorted(data_state)}, not for process "
      f"{process_index}; resume with the same number of processes (or load_parameters_path)"
    )
  try:
    data_iter.set_state(own)
  except Exception as e:  # a position another pipeline wrote: its keys or types don't fit this one
    raise UserError(
      f"the checkpoint's data position ({json.dumps(own)[:120]}) doesn't fit this data pipeline "
      f"(dataset_type={dataset_type}: {e}); resume with the data settings it was "
      "written with, or use load_parameters_path"
    ) from None


def _refuse_second_run(cfg, out_dir):
  """A run directory holding another run's metrics, with nothing to resume from, is not appended to."""
  size = storage.size_if_file(os.path.join(out_dir, "metrics.jsonl"))
  resumable = cfg.enable_checkpointing or cfg.load_full_state_path
  if not resumable and size:
    raise UserError(
      f"run directory {out_dir} already holds the metrics of an earlier run (metrics.jsonl) and "
      "enable_checkpointing=false leaves nothing to resume; pick another run_name (or delete the "
      "directory to start over)"
    )


def _own_directory(cfg, out_dir, process_index):
  """The run directory's lock (process 0 holds it for the job), taken before anything is written. Object storage
  (gs://, s3://) has no lock: there, as in MaxText, one run per run_name is the user's to keep."""
  if process_index != 0:
    return None
  if storage.is_remote(out_dir):
    _refuse_second_run(cfg, out_dir)
    return None
  lock = run_lock.RunLock(out_dir).acquire()
  try:
    _refuse_second_run(cfg, out_dir)
  except UserError:
    lock.release()
    raise
  return lock


def _state(cfg, mesh, checkpointer, data_iter, process_index, seed_key):
  """(graphdef, optimizer, TrainState, notes for the first metrics row) fresh or restored, with the data iterator
  moved to its position; a recipe or plan other than the one that trained the restored state is said."""
  with jax.set_mesh(mesh):
    tx = optimizer.make_optimizer(cfg)
    graphdef, fresh = init_sharded(cfg, mesh, tx, seed_key)
    template = fresh.checkpoint_tree()
  step, tree, data_state, written_under = _initial_state(cfg, checkpointer, template)
  # Whatever layout the checkpoint was written in (e.g. replicated moments), the state continues in the fresh one's.
  tree = jax.device_put(tree, jax.tree.map(lambda a: a.sharding, {k: template[k] for k in tree}))
  if step >= cfg.steps:
    print(f"the run is at step {step} already (steps={cfg.steps}): nothing to train; raise steps to go on", flush=True)
  _restore_position(data_iter, data_state, process_index, cfg.dataset_type)
  state = TrainState(step, tree["params"], tree.get("amax_history", fresh.rest), tree["opt_state"])
  return graphdef, tx, state, _recipe_change(cfg, step, written_under)


def _hooks(cfg, run_shape, steps, batch_sharding, checkpointer, writer, out_dir, process_index, process_count, notes):
  """The loop's hooks, in the order they run: eval (adds to the step's record), metrics (writes it, the first row
  with `notes`), checkpoint (flushes the metrics, then saves), profiler, stop."""
  hooks = []
  if steps.eval_step is not None:
    make_iterator = lambda: data.make_eval_iterator(cfg, run_shape, process_index, process_count)
    hooks.append(
      EvalHook(
        steps.eval_step,
        make_iterator,
        lambda batch: global_batch(batch, batch_sharding),
        every=cfg.eval_interval,
        eval_steps=cfg.eval_steps,
        last_step=cfg.steps,
      )
    )
  hooks.append(
    metrics.MetricsHook(
      writer,
      flops=accounting.training_flops_per_device(cfg),
      tokens_per_device=run_shape.tokens_per_step / run_shape.num_devices,
      schedule=optimizer.learning_rate_schedule(cfg),
      notes=notes,
    )
  )
  if checkpointer is not None:
    hooks.append(
      CheckpointHook(checkpointer, last_step=cfg.steps, gather_positions=_gather_positions, before_save=writer.flush)
    )
  hooks.append(profiler.ProfilerHook(profiler.Profiler(cfg, out_dir, enabled=process_index == 0)))
  hooks.append(StopHook(checkpointer.directory if checkpointer is not None else None))
  return hooks


def build(cfg, plan, run_shape, devices, process_index, process_count, out_dir):
  """The Run for `cfg`, resumed where its checkpoints (or load_* paths) say."""
  lock = _own_directory(cfg, out_dir, process_index)
  opened = []
  try:
    mesh = sharding.make_mesh(cfg, devices)
    batch_sharding = sharding.batch_sharding(mesh)
    data_iter = data.make_iterator(cfg, run_shape, process_index, process_count)  # before the model: fails fast
    opened.append(data_iter)
    checkpointer = None
    if cfg.enable_checkpointing:
      checkpointer = checkpointing.Checkpointer(
        os.path.join(out_dir, "checkpoints"),
        period=cfg.checkpoint_period,
        max_to_keep=cfg.max_num_checkpoints_to_keep,
        async_save=cfg.async_checkpointing,
        cfg=cfg,
      )
      opened.append(checkpointer)
    seed_key = jax.random.key(cfg.seed)  # the init's and the steps' argument, made once
    graphdef, tx, state, notes = _state(cfg, mesh, checkpointer, data_iter, process_index, seed_key)
    writer = metrics.MetricsWriter(
      out_dir,
      tensorboard=cfg.enable_tensorboard,
      flush_period=cfg.log_period,
      enabled=process_index == 0,
      first_step=state.step,
    )
    opened.append(writer)
    steps = StepFunctions(cfg, graphdef, tx, plan, state_shardings(state), seed_key)
    hooks = _hooks(
      cfg, run_shape, steps, batch_sharding, checkpointer, writer, out_dir, process_index, process_count, notes
    )
    opened[:] = [data_iter, *hooks]  # the hooks close what they hold: the writer, the checkpointer, the profiler
    batches = prefetch.Prefetcher(data_iter, lambda b: global_batch(b, batch_sharding), cfg.data_prefetch_depth)
    opened.append(batches)
    return Run(mesh, state, steps, batches, hooks, checkpointer, opened, lock)
  except BaseException:
    try:
      close_all(opened, after_failure=True)
    finally:
      if lock is not None:
        lock.release()
    raise
