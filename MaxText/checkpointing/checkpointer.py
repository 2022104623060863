"""Orbax checkpoints of the training state (parameters, optimizer state, step, data position) and resume.

Layout: <run dir>/checkpoints/<step>/{state, data, meta}; <step> = steps completed; meta holds the step and
the settings a resume must agree with. Orbax writes each checkpoint to a temporary directory and
renames it when complete, so a run killed mid-save, or a save that fails (disk full, directory gone),
leaves no half checkpoint behind; a checkpoint that is there but unreadable (corrupt files) is
reported and the previous one is used instead. A good checkpoint that this config cannot continue
(another model shape, optimizer, recipe state or data source) is named with what differs, never
moved aside. Never a silent restart from step 0.
"""

import contextlib
import functools
import io
import logging
import pathlib
import re
import shutil
import tempfile
import traceback

import jax
import orbax.checkpoint as ocp

from MaxText import config, errors, storage
from MaxText.errors import UserError
from MaxText.runtime import late_noise, preemption


TMP_MARK = ".orbax-checkpoint-tmp"  # in the name of a step directory Orbax has not finished writing


class CheckpointError(UserError):
  """No usable checkpoint where one is expected, or one that can't be written: a user or environment error."""


class UnreadableCheckpoint(CheckpointError):
  """A checkpoint step that is there but can't be read (damaged or truncated files, a junk directory): where a run's
  checkpoints are listed, the previous one serves instead (newest_readable). `reason`: the cause in a few words."""

  def __init__(self, step_dir, reason, message=None):
    self.step_dir, self.reason = step_dir, reason
    hint = _another_step(pathlib.Path(str(step_dir)))
    super().__init__(
      message
      or f"checkpoint {step_dir} is unreadable ({reason}): it is damaged or incomplete; "
      f"{hint or 'write it again (train, or import) or use another checkpoint'}"
    )

  @classmethod
  def of(cls, step_dir, e):
    """The UnreadableCheckpoint that reading `step_dir` failing with `e` (Orbax's, TensorStore's) is."""
    return cls(step_dir, _reason(e))


def _another_step(step_dir):
  """'point at another step of its run: .../2 (or 1)', or None where its run has no other step."""
  others = [s for s in reversed(step_numbers(step_dir.parent)) if str(s) != step_dir.name.split(".")[0]]
  if not others:
    return None
  rest = f" (or {', '.join(map(str, others[1:4]))}{', ...' if len(others) > 4 else ''})" if len(others) > 1 else ""
  return f"point at another step of its run: {step_dir.parent / str(others[0])}{rest}"


def step_numbers(directory):
  """The steps of a checkpoints directory (its entries named by a number), in order; [] where there is none."""
  try:
    return sorted(int(p.name) for p in pathlib.Path(directory).iterdir() if p.name.isdigit() and p.is_dir())
  except OSError:
    return []


def newest_readable(directory, steps, read, *, log=print, if_none="move the directory away"):
  """(step, read(step), [the newer steps that were unreadable]) for the newest of `steps` that `read` can read:
  each newer one `read` finds unreadable (UnreadableCheckpoint) is said in one line and skipped, as a resuming run
  does. None without steps; CheckpointError (ending in `if_none`) when none is readable. Any other error of `read`
  (a checkpoint of another model) stops the search."""
  failures = []
  for step in reversed(sorted(steps)):
    try:
      return step, read(step), failures
    except UnreadableCheckpoint as e:
      failures.append(step)
      log(f"warning: checkpoint {directory}/{step} is unreadable ({e.reason}); trying the previous one")
  if failures:
    raise CheckpointError(f"no readable checkpoint in {directory} (tried steps {failures}); {if_none}")
  return None


# Settings a checkpoint's data position and state depend on: resuming under others is refused.
DATA_KEYS = (
  "dataset_type",
  "grain_train_files",
  "grain_record_format",
  "dataset_path",
  "dataset_name",
  "train_split",
  "tokenizer_type",
  "tokenizer_path",
  "max_target_length",
  "hf_path",
  "hf_name",
  "hf_data_dir",
  "hf_train_files",
  "train_data_columns",
)
SECRET_KEYS = ("hf_access_token",)  # never written into a checkpoint's meta


def _state_args(state, restore):
  if restore:
    return ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, state))
  return ocp.args.StandardSave(state)


_OS_FAULTS = re.compile(
  r"No space left on device|File too large|Disk quota exceeded|Read-only file system|"
  r"Permission denied|No such file or directory|Not a directory|Input/output error"
)


_TENSORSTORE_STATUS = re.compile(r"^[A-Z][A-Z_]+: ")
_TENSORSTORE_NOISE = re.compile(r"\s*\[(source locations|os_error_code|tensorstore_spec)=[^\]]*\]")


def _reason(e):
  """The cause in a few words: the operating system's where Orbax/tensorstore wrap one, else TensorStore's status
  message (Orbax's wrappers print a bound method's repr instead), else the first line."""
  chain = errors.exception_chain(e)
  for link in chain:
    fault = _OS_FAULTS.search(str(link))
    if fault:
      return fault.group(0)
  for link in chain:
    message = str(link).strip()
    if _TENSORSTORE_STATUS.match(message):
      return _TENSORSTORE_NOISE.sub("", message.splitlines()[0])[:300]
  message = str(e).strip().split(" See full TensorStore details")[0]
  return message.splitlines()[0][:300] if message else type(e).__name__


def _array_names(tree):
  """{the name Orbax stores each array leaf under ('params.layers...', 'opt_state.1.0.mu...')}."""

  def name(path):
    return ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)

  return {name(path) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(leaf, "shape")}


_STATE_PARTS = {
  "params": "parameters",
  "opt_state": "optimizer state (gradient_clipping_threshold or the optimizer changed?)",
  "amax_history": "FP8 delayed scaling's amax histories (quantization / "
  "attention_quantization / amax_history_len changed?)",
}


def structure_difference(stored_names, template):
  """None when a checkpoint holding arrays `stored_names` can fill `template`, else what differs (one phrase)."""
  wanted = _array_names(template)
  if stored_names == wanted:
    return None
  only_stored, only_wanted = stored_names - wanted, wanted - stored_names
  fused_stored, fused_wanted = (any(".mlp.gate_up." in n for n in names) for names in (only_stored, only_wanted))
  if fused_stored != fused_wanted:  # one key changed the whole MLP subtree: name the key
    return (
      f"its MLP was trained with fused_mlp={str(fused_stored).lower()} (gate and up as "
      f"{'one kernel' if fused_stored else 'two kernels'}) and this config has fused_mlp={str(fused_wanted).lower()}"
    )
  parts = sorted({n.split(".")[0] for n in only_stored | only_wanted})
  what = "; ".join(_STATE_PARTS.get(p, p) for p in parts)
  example = (
    f"the checkpoint holds {sorted(only_stored)[0]}, which this config doesn't"
    if only_stored
    else f"this config needs {sorted(only_wanted)[0]}, which the checkpoint lacks"
  )
  return f"its {what} differ from this config's ({example})"


def settings_difference(stored_config, cfg):
  """The data settings a checkpoint was written under that differ from `cfg`'s, as 'key: old -> new' text."""
  # Checkpoints written before paths were made absolute at load hold them as given: read those against the working
  # directory, as the run that wrote them did.
  stored = {k: config.absolute_path(v) if k in config.PATH_KEYS else v for k, v in stored_config.items()}
  changed = [
    f"{k}: {stored_config[k]!r} -> {getattr(cfg, k)!r}"
    for k in DATA_KEYS
    if k in stored and stored[k] != getattr(cfg, k)
  ]
  return ", ".join(changed) or None


def meta_record(step, cfg):
  """What a checkpoint says about itself: its step and the run's settings."""
  return {
    "step": int(step),
    "config": {
      k: v for k, v in cfg.to_dict().items() if isinstance(v, (str, int, float, bool, list)) and k not in SECRET_KEYS
    },
  }


class Checkpointer:
  """Saves every `period` steps (and on demand), keeps `max_to_keep` (0 = all), restores the newest readable.

  `cfg` (optional) is recorded in each checkpoint's meta item and checked on resume.
  """

  def __init__(self, directory, *, period, max_to_keep, async_save, cfg=None):
    self.directory = checkpoint_path(directory)
    self.period = period
    self.cfg = cfg
    self._log_path = _log_path(self.directory)
    self._in_flight = None  # the step of an async save not yet known to have finished
    self.directory.parent.mkdir(parents=True, exist_ok=True)
    self._log_path.parent.mkdir(parents=True, exist_ok=True)
    # Orbax reports from its background threads (a failed async save's traceback): into the log, not the
    # terminal, for as long as this checkpointer lives; the run reports the failure itself in one line.
    self._noise = _LogFileHandler(self._log_path)
    _route("absl", self._noise, True)
    self._stop_closed_loop_noise = late_noise.closed_loop_to(self._log_path)
    self._remove_unfinished()  # before Orbax's manager exists: it would clean up (and race this) in the background
    with _kept_in(self._log_path) as log, _logger_to("absl", log):  # its warnings about junk dirs
      self._manager = ocp.CheckpointManager(
        self.directory,
        item_names=("state", "data", "meta"),
        options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep or None,
          enable_async_checkpointing=async_save,
          create=True,
          cleanup_tmp_directories=False,  # _remove_unfinished's, done before the first save
        ),
      )

  def _remove_unfinished(self):
    """Removes what saves that failed or were interrupted left (Orbax's `<step>.orbax-checkpoint-tmp*`: a save killed
    mid-write, or one cut short by a second stop signal), so that no listing or later save sees them; process 0, on a
    filesystem all processes share. The one place they are removed: when a checkpointer starts (before its Orbax
    manager, whose own background cleanup would race with this one and with the first save) and when it closes."""
    if jax.process_index() != 0 or not self.directory.is_dir():
      return
    for path in self.directory.iterdir():
      if TMP_MARK in path.name:
        try:
          path.rmtree() if storage.is_remote(path) else shutil.rmtree(path)  # epath's, for object storage
        except OSError:
          pass  # tried again at close and at the next start (and Orbax replaces its own step's before a save)

  def steps(self):
    return sorted(self._manager.all_steps())

  def due(self, step, force=False):
    """Whether `save(step, ..., force=force)` would consider writing: a period boundary, or forced."""
    return force or step % self.period == 0

  def _failed(self, step, e):
    late_noise.everything_to(self._log_path)  # the failed write's leftover callbacks print tracebacks later
    good = [s for s in self.steps() if s != step]
    last = (
      (
        f"the last good checkpoint is {self.directory}/{good[-1]}: fix the storage (space, permissions) and "
        "rerun to resume from it"
      )
      if good
      else "no checkpoint was saved before it: fix the storage and rerun"
    )
    return CheckpointError(f"saving the checkpoint at step {step} in {self.directory} failed ({_reason(e)}); {last}")

  def save(self, step, state, data_state, *, force=False):
    """Checkpoint after `step` completed steps, if it is a period boundary or `force`; True if one was written."""
    if not self.due(step, force) or step in self._manager.all_steps():
      return False
    self.wait()  # Orbax would wait for the previous save anyway: its failure is named as its own step's
    meta = meta_record(step, self.cfg) if self.cfg is not None else {"step": int(step)}
    args = ocp.args.Composite(
      state=_state_args(state, False), data=ocp.args.JsonSave(data_state), meta=ocp.args.JsonSave(meta)
    )
    try:
      saved = self._manager.save(step, args=args, force=True)
    except Exception as e:  # orbax/tensorstore/OS errors: disk full, directory removed or read-only
      raise self._failed(step, e) from None
    self._in_flight = step
    preemption.point("save")  # tests: a stop while this save's temporary directory is being written
    return saved

  def check(self):
    """Raises CheckpointError if a background save failed (called every step: the failure is seen at once)."""
    if self._in_flight is None:
      return
    try:
      self._manager.check_for_errors()
    except Exception as e:
      step, self._in_flight = self._in_flight, None
      raise self._failed(step, e) from None

  def _restore(self, step, state_template):
    step_dir = self.directory / str(step)
    items = dict(state=_state_args(state_template, True), data=ocp.args.JsonRestore())
    if (step_dir / "meta").is_dir():  # checkpoints from before the meta item have none
      items["meta"] = ocp.args.JsonRestore()
    return self._manager.restore(step, args=ocp.args.Composite(**items))

  def _check_compatible(self, step, state_template):
    """CheckpointError when the (readable-looking) checkpoint can't serve this config: named, never moved aside."""
    try:
      stored = _stored_names(self.directory / str(step))
      meta = read_meta(self.directory / str(step))
    except Exception:  # damaged metadata: the restore that follows reports it as unreadable
      return
    difference = structure_difference(stored, state_template) if stored else None
    if difference is None and isinstance(meta, dict) and self.cfg is not None:
      changed = settings_difference(meta.get("config", {}), self.cfg)
      difference = changed and f"it was written reading other data ({changed})"
    if difference:
      raise CheckpointError(
        f"checkpoint {self.directory}/{step} can't continue under this config: {difference}; "
        "resume with the settings it was written with, start from its weights with "
        f"load_parameters_path={self.directory}/{step}, or pick another run_name"
      )

  def restore_latest(self, state_template):
    """(step, state, data_state) from the newest readable checkpoint, or None when there is none.

    Unreadable newer checkpoints are reported and moved aside to `<step>.corrupt`, so that the run
    writes those steps again and retention only ever counts readable ones. A checkpoint of another
    model shape or state structure is a CheckpointError (the config changed), as is having no
    readable one at all. Orbax's tracebacks from the failed reads go to
    `<run dir>/checkpoint_errors.log`, not stderr.
    """
    with _kept_in(self._log_path) as log, contextlib.redirect_stderr(log), _logger_to("absl", log):
      found = newest_readable(
        self.directory,
        self.steps(),
        lambda step: self._read(step, state_template, log),
        log=lambda line: print(line, flush=True),
        if_none="move the directory away (or pick another run_name) to start from step 0",
      )
      if found is None:
        return None
      step, restored, failures = found
      self._set_aside(failures)
      return step, restored["state"], dict(restored["data"] or {})

  def _read(self, step, state_template, log):
    """The restored items of checkpoint `step`; UnreadableCheckpoint where its files can't be read."""
    self._check_compatible(step, state_template)
    try:
      return self._restore(step, state_template)
    except Exception as e:  # orbax/tensorstore raise many types for damaged files
      traceback.print_exception(e, file=log)
      late_noise.everything_to(self._log_path)
      if "not compatible with the stored shape" in str(e):
        raise CheckpointError(
          f"checkpoint {self.directory}/{step} holds another model shape "
          f"({_shape_mismatch(str(e))}): resume with the config it was trained with, or "
          "pick another run_name"
        ) from None
      raise UnreadableCheckpoint.of(self.directory / str(step), e) from None

  def _set_aside(self, failures):
    for bad in failures:
      print(
        f"moved the unreadable checkpoint {self.directory}/{bad} aside to "
        f"{self._move_aside(bad).name} (the run writes step {bad} again when it gets there)",
        flush=True,
      )
    if failures:
      self._manager.reload()

  def _move_aside(self, step):
    """<step> -> <step>.corrupt (.corrupt.1, ... if taken); process 0 renames, on a filesystem all processes share."""
    target = self.directory / f"{step}.corrupt"
    n = 0
    while target.exists():
      n += 1
      target = self.directory / f"{step}.corrupt.{n}"
    if jax.process_index() == 0:
      (self.directory / str(step)).rename(target)
    return target

  def wait(self):
    """Blocks until a background save has finished; CheckpointError if it failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:
      step, self._in_flight = self._in_flight, None
      raise self._failed(step, e) from None
    self.check()

  def close(self):
    try:
      self.wait()
    finally:
      self._manager.close()
      self._remove_unfinished()
      _route("absl", self._noise, False)
      self._stop_closed_loop_noise()


class _LogFileHandler(logging.Handler):
  """Appends records to `path`, opening it at the first record (no empty log files)."""

  def __init__(self, path):
    super().__init__()
    self.path = path

  def emit(self, record):
    try:
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(self.format(record) + "\n")
    except OSError:
      pass  # the storage that failed the save may fail this too; the run reports the failure itself


def _route(name, handler, on):
  """While on, the `name` logger writes to `handler` only."""
  logger = logging.getLogger(name)
  if on:
    logger.addHandler(handler)
    handler.previous_propagate, logger.propagate = logger.propagate, False
  else:
    logger.removeHandler(handler)
    logger.propagate = getattr(handler, "previous_propagate", True)


@contextlib.contextmanager
def _kept_in(path):
  """A text buffer for the block whose contents, if any, are appended to `path` (no empty log files)."""
  buffer = io.StringIO()
  try:
    yield buffer
  finally:
    if buffer.getvalue():
      with open(path, "a", encoding="utf-8") as f:
        f.write(buffer.getvalue())


@contextlib.contextmanager
def _logger_to(name, stream):
  """Within the block, the `name` logger writes to `stream` only."""
  logger, handler = logging.getLogger(name), logging.StreamHandler(stream)
  propagate, logger.propagate = logger.propagate, False
  logger.addHandler(handler)
  try:
    yield
  finally:
    logger.removeHandler(handler)
    logger.propagate = propagate


def _shape_mismatch(message):
  """'stored (a, b), this config (c, d)' from Orbax's shape error."""
  found = re.search(r"Requested shape: (\([^)]*\)).*?stored shape: (\([^)]*\))", message, re.S)
  return f"a parameter stored as {found.group(2)} is {found.group(1)} in this config" if found else "shapes differ"


def quiet_item_access():
  """Around Orbax reads of a step's `state` item alone: Orbax warns (through absl) that the item has no
  _CHECKPOINT_METADATA of its own, which is as it should be (it is one item of a step, or an import's parameters).
  Failures still raise."""
  return _logger_to("absl", io.StringIO())


def state_metadata(step_dir):
  """The tree metadata of a checkpoint's state item (shapes, dtypes, names; no array is read); UnreadableCheckpoint
  where there is none to read (Orbax returns None for damaged files and for an empty directory alike)."""
  step_dir = check_step_dir(step_dir)
  try:
    with quiet_item_access():
      metadata = ocp.StandardCheckpointer().metadata(step_dir / "state")
  except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many types for damaged files)
    raise UnreadableCheckpoint(step_dir, f"its metadata can't be read: {_reason(e)}") from None
  metadata = getattr(metadata, "item_metadata", metadata)
  if metadata is None or not jax.tree.leaves(metadata):
    empty = not any((step_dir / "state").iterdir())
    raise UnreadableCheckpoint(step_dir, "its state directory is empty" if empty else "its metadata can't be read")
  return metadata


def _stored_names(step_dir):
  """The names of the arrays a checkpoint's state item holds, from its metadata (no array is read)."""
  return {leaf.name for leaf in jax.tree.leaves(state_metadata(step_dir))}


def checkpoint_path(path):
  """An absolute local pathlib path, or for a URL (gs://, s3://) an etils epath, which Orbax reads and writes."""
  if storage.is_remote(path):
    from etils import epath  # pylint: disable=import-outside-toplevel

    return epath.Path(str(path))
  return pathlib.Path(path).absolute()


def _log_path(directory):
  """Where Orbax's tracebacks go: beside the checkpoints directory, or for one on object storage (no appending
  there) a local file named after it."""
  if not storage.is_remote(directory):
    return directory.parent / "checkpoint_errors.log"
  name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(directory.parent))
  return pathlib.Path(tempfile.gettempdir()) / "maxtext_checkpoint_errors" / f"{name}.log"


def read_meta(step_dir):
  """A checkpoint's meta record ({} for checkpoints written before it existed)."""
  step_dir = checkpoint_path(step_dir)
  return dict(ocp.JsonCheckpointHandler().restore(step_dir / "meta") or {}) if (step_dir / "meta").is_dir() else {}


def check_step_dir(step_dir):
  """`step_dir` as checkpoint_path gives it, if it is a checkpoint step directory: CheckpointError naming what it
  is instead (an unfinished save, MaxText's layout), UnreadableCheckpoint where it has no state item."""
  step_dir = checkpoint_path(step_dir)
  if TMP_MARK in step_dir.name:
    raise CheckpointError(
      f"{step_dir} is a checkpoint Orbax had not finished writing (a save that was interrupted or failed; the next "
      f"training run removes it); {_another_step(step_dir) or 'point at a complete checkpoint step'}"
    )
  if not (step_dir / "state").is_dir() and (step_dir / "items").is_dir():
    raise CheckpointError(
      f"{step_dir} is a MaxText checkpoint (<step>/items), whose parameter tree differs from ours; start from the "
      "Hugging Face weights instead (python -m MaxText.convert_hf to-maxtext, or load_parameters_path=<HF dir>)"
    )
  if not (step_dir / "state").is_dir():
    raise UnreadableCheckpoint(
      step_dir,
      "it has no state item",
      f"{step_dir} is not a checkpoint step directory (no {step_dir.name}/state; point at <run dir>/checkpoints/"
      "<step> or an import's checkpoints/0) nor a Hugging Face model directory (config.json beside *.safetensors)",
    )
  return step_dir


def _noise_log(step_dir):
  """Where Orbax's leftover tracebacks of a failed read go for a command that only reads (decode, convert_hf): a
  file in the temporary directory named after the run (a command that only reads leaves the run's files as they
  are)."""
  name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(checkpoint_path(step_dir).parent.parent))
  return pathlib.Path(tempfile.gettempdir()) / "maxtext_checkpoint_errors" / f"{name}.log"


_reads_noise_to = functools.cache(late_noise.closed_loop_to)  # a route per log file, kept for the process


@contextlib.contextmanager
def reading(step_dir):
  """Around a read-only command's reads of checkpoint `step_dir`: what Orbax's threads print after a failed read
  (tracebacks of callbacks on a closed event loop, from other threads, at any time) goes to a log (_noise_log), not
  around the one line the user needs (for the rest of the process: those callbacks run late)."""
  _reads_noise_to(_noise_log(step_dir))
  try:
    yield
  except BaseException:
    late_noise.everything_to(_noise_log(step_dir))
    raise


def restore_step_dir(path, state_template):
  """(state, data_state, step) from one checkpoint step directory (load_full_state_path / load_parameters_path).

  The step comes from the checkpoint's meta item, else from a directory named by it, else None.
  """
  path = check_step_dir(path)
  try:
    state = ocp.StandardCheckpointer().restore(
      path / "state", jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template)
    )
    data_state = ocp.JsonCheckpointHandler().restore(path / "data") if (path / "data").is_dir() else {}
    meta = read_meta(path)
  except Exception as e:
    raise UnreadableCheckpoint.of(path, e) from e
  step = (meta or {}).get("step")
  if step is None and path.name.isdigit():
    step = int(path.name)
  return state, dict(data_state or {}), step


def restore_params(step_dir, params_template):
  """The parameters of checkpoint `step_dir` (<...>/checkpoints/<step>), typed and sharded like `params_template`
  (stored bf16 becomes the template's f32); the rest of the checkpoint is not read. UnreadableCheckpoint for
  damaged files, CheckpointError for another model's checkpoint."""
  with reading(step_dir):
    step_dir = check_step_dir(step_dir)
    target = {"params": jax.tree.map(ocp.utils.to_shape_dtype_struct, params_template)}
    stored = {n for n in _stored_names(step_dir) if n.startswith("params.")}
    difference = structure_difference(stored, target)
    if difference:
      raise CheckpointError(f"checkpoint {step_dir} can't start this config: {difference}")
    args = ocp.args.PyTreeRestore(
      item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
    )
    try:
      with quiet_item_access(), ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
        restored = checkpointer.restore(step_dir / "state", args=args)
    except Exception as e:  # damaged files, shapes of another model
      message = str(e)
      if "not compatible with the stored shape" in message:
        raise CheckpointError(f"can't load parameters from {step_dir}: {_shape_mismatch(message)}") from None
      raise UnreadableCheckpoint.of(step_dir, e) from None
    return restored["params"]
