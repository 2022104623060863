"""The Hugging Face conversion and decode command lines tried as a new user would (damaged config.json fields, full
and read-only filesystems, file-size limits, unwritable directories, names over 255 bytes, stop signals mid-write,
damaged, junk and unfinished checkpoints, another model's checkpoint, tiny temperatures): each case is clear when it
is one `error: ...` line and exit code 2 naming what the case is about, or the right result, or for a stop signal
one line and exit code 128 + its number; and nothing is left behind (no `.partial` directory, no output from a command
that failed, an existing output untouched). tests/hostile/harness.py says how they run.

Their fixtures (tests/data/hf_tiny imported, a 3-step te_nvfp4 fine-tune of it with checkpoints 1, 2, 3, a
checkpoint of another model shape, the greedy completion) are made once for all workers; the cases are slow (a
process each): `make test-hostile`."""

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import signal
import sys
import typing

import pytest

from tests.conftest import REPO
from tests.hostile import harness

HF_TINY = REPO / "tests" / "data" / "hf_tiny"
DECODE = ["max_prefill_predict_length=16", "max_target_length=36", "prompt=ROMEO."]
module = harness.module
pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------------------------
# Fixtures


def _build_fixtures(fx):
  """The shared, read-only fixtures under `fx`."""
  fx.mkdir(parents=True)
  train = [str(REPO / "train.py"), fx / "imp" / "config.yml", "enable_checkpointing=true", "dataset_type=synthetic"]
  train += ["per_device_batch_size=2", "max_target_length=32", f"base_output_directory={fx / 'runs'}"]
  steps = [
    module("convert_hf", "to-maxtext", HF_TINY, fx / "imp"),
    [sys.executable, *train, "steps=3", "checkpoint_period=1", "quantization=te_nvfp4", "run_name=ft"],
    [sys.executable, *train, "steps=1", "base_mlp_dim=96", "load_parameters_path=", "run_name=other"],
    module("decode", fx / "imp" / "config.yml", *DECODE, f"decode_output_file={fx / 'greedy.jsonl'}"),
  ]
  for argv in steps:
    proc = harness.run(argv)
    assert proc.returncode == 0, f"fixture step failed: {' '.join(map(str, argv))}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="session")
def fx(tmp_path_factory, worker_id):
  """The fixtures' directory, made by the first worker that gets here (the others wait on its lock)."""
  root = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
  fx = root / "hostile_fixtures"
  with open(root / "hostile_fixtures.lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (fx / "done").exists():
      shutil.rmtree(fx, ignore_errors=True)
      _build_fixtures(fx)
      (fx / "done").write_text("")
  return fx


# ---------------------------------------------------------------------------------------------------------------
# Cases


@dataclasses.dataclass
class Case:
  name: str
  argv: typing.Callable  # (fx, d) -> argv
  expect: str = "error"  # error | ok | stopped
  needle: str = ""  # in the error line (error, stopped) or in stdout (ok)
  setup: typing.Callable = None  # (fx, d) -> None
  check: typing.Callable = None  # (fx, d, proc) -> failure text or None
  fsize: int = 0  # RLIMIT_FSIZE for the process
  stop: int = 0  # the signal the process sends itself when it has written its first block (MAXTEXT_SIGNAL_AT)
  no_dac: bool = False  # run without CAP_DAC_OVERRIDE
  mount: str = ""  # at d/mnt: "full" (a 200 KB tmpfs), "filled" (one already full) or "ro" (a read-only one)
  out: str = "out"  # the output that must not exist after a failure ("" for none)


def _copy_hf(fx, d):
  shutil.copytree(HF_TINY, d / "hf")


def _edit_config(**changes):
  def setup(fx, d):
    _copy_hf(fx, d)
    c = json.loads((d / "hf" / "config.json").read_text())
    for k, v in changes.items():
      if v is KeyError:
        c.pop(k, None)
      else:
        c[k] = v
    (d / "hf" / "config.json").write_text(json.dumps(c))

  return setup


def _edit_index(edit):
  def setup(fx, d):
    _copy_hf(fx, d)
    index = json.loads((d / "hf" / "model.safetensors.index.json").read_text())
    edit(index["weight_map"])
    (d / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))

  return setup


def _header_dtype_list(fx, d):
  _copy_hf(fx, d)
  path = d / "hf" / "model-00002-of-00002.safetensors"
  data = path.read_bytes()
  n = int.from_bytes(data[:8], "little")
  header = json.loads(data[8 : 8 + n])
  name = next(k for k in header if k != "__metadata__")
  header[name]["dtype"] = ["BF16"]
  text = json.dumps(header).encode()
  text += b" " * (-len(text) % 8)
  path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n :])


def _copy_run(name="ft"):
  def setup(fx, d):
    shutil.copytree(fx / "runs" / name, d / "run")

  return setup


def _truncate_all(step):
  """Every data file of checkpoint `step`'s state item cut to 10 bytes (a copy interrupted midway)."""

  def damage(run_dir):
    for f in (run_dir / "checkpoints" / str(step) / "state").rglob("*"):
      if f.is_file() and f.parent.name == "d":
        f.write_bytes(f.read_bytes()[:10])

  return damage


def _truncate_data(step):
  """The array data files of checkpoint `step` (OCDBT's per-process data, not its index) cut to 100 bytes: the
  metadata reads, the arrays don't."""

  def damage(run_dir):
    for f in (run_dir / "checkpoints" / str(step) / "state").glob("ocdbt.process_*/d/*"):
      f.write_bytes(f.read_bytes()[:100])

  return damage


def _damaged_run(*damages, name="ft"):
  def setup(fx, d):
    shutil.copytree(fx / "runs" / name, d / "run")
    for damage in damages:
      damage(d / "run")

  return setup


def _junk_step(run_dir):
  (run_dir / "checkpoints" / "9" / "state").mkdir(parents=True)


def _long_name(d):
  return d / ("x" * 300)


def _existing_output(fx, d):
  (d / "out").mkdir()
  (d / "out" / "mine.txt").write_text("keep me")


def _stale_partial(fx, d):
  """A partial output of a conversion killed long ago (a pid that can't be running: above pid_max's range)."""
  stale = d / ".out.partial-4194999"
  (stale / "checkpoints").mkdir(parents=True)
  (stale / "checkpoints" / "half").write_bytes(b"x" * 1000)


def _read_only_dir(fx, d):
  (d / "ro").mkdir()
  os.chmod(d / "ro", 0o555)


def _exported_from(step):
  def check(fx, d, proc):
    line = next((l for l in proc.stdout.splitlines() if l.startswith("exported ")), "")
    if f"/checkpoints/{step} -> " not in line:
      return f"expected an export of step {step}: {line!r}"
    return None

  return check


def _greedy_text(fx):
  return json.loads((fx / "greedy.jsonl").read_text().splitlines()[0])["completion"]


def _completion_is_greedy(fx, d, proc):
  out = json.loads((d / "o.jsonl").read_text().splitlines()[0])["completion"]
  return None if out == _greedy_text(fx) else f"completion {out!r} is not the greedy {_greedy_text(fx)!r}"


def _import_is_absolute(fx, d, proc):
  text = (d / "out" / "config.yml").read_text()
  return None if f"load_parameters_path: {d}/out/checkpoints/0" in text else "load_parameters_path is not absolute"


def _stale_gone(fx, d, proc):
  return None if not (d / ".out.partial-4194999").exists() else "the stale partial output is still there"


def _tmp_dir_of_step(fx, d):
  """Orbax's temporary directory of a save killed midway: step 3's files, some of them not written yet."""
  shutil.copytree(fx / "runs" / "ft", d / "run")
  unfinished = d / "run" / "checkpoints" / "4.orbax-checkpoint-tmp-1732512345"
  (d / "run" / "checkpoints" / "3").rename(unfinished)
  for f in sorted((unfinished / "state").rglob("*"), key=lambda p: p.stat().st_size)[-2:]:
    if f.is_file():
      f.unlink()
  for f in (unfinished / "state").glob("_*"):
    f.unlink()


def cases():
  imp = lambda fx: fx / "imp" / "config.yml"  # noqa: E731
  to_maxtext = lambda *extra: lambda fx, d: module("convert_hf", "to-maxtext", d / "hf", d / "out", *extra)  # noqa: E731
  ft_to_hf = lambda *extra: lambda fx, d: module("convert_hf", "to-hf", d / "run", d / "out", *extra)  # noqa: E731
  fx_to_hf = lambda *extra: lambda fx, d: module("convert_hf", "to-hf", fx / "runs" / "ft", d / "out", *extra)  # noqa: E731
  decode = lambda *extra: lambda fx, d: module("decode", imp(fx), *DECODE, *extra)  # noqa: E731
  q = "quantization=te_nvfp4"
  return [
    # to-maxtext
    Case(
      "import: relative paths",
      lambda fx, d: module("convert_hf", "to-maxtext", "hf", "out"),
      "ok",
      "imported",
      _copy_hf,
      _import_is_absolute,
    ),
    Case("import: rms_norm_eps null", to_maxtext(), needle="rms_norm_eps=null", setup=_edit_config(rms_norm_eps=None)),
    Case(
      "import: rope_theta '10k'",
      to_maxtext(),
      needle='rope_theta="10k"',
      setup=_edit_config(rope_parameters=KeyError, rope_theta="10k"),
    ),
    Case(
      "import: num_attention_heads 0",
      to_maxtext(),
      needle="num_attention_heads=0",
      setup=_edit_config(num_attention_heads=0),
    ),
    Case(
      "import: rope_parameters 'llama3'",
      to_maxtext(),
      needle='rope_parameters="llama3"',
      setup=_edit_config(rope_parameters="llama3"),
    ),
    Case(
      "import: rope_scaling [1, 2]",
      to_maxtext(),
      needle="rope_scaling=[1, 2]",
      setup=_edit_config(rope_parameters=KeyError, rope_scaling=[1, 2]),
    ),
    Case(
      "import: max_position_embeddings null",
      to_maxtext(),
      needle="max_position_embeddings=null",
      setup=_edit_config(max_position_embeddings=None),
    ),
    Case(
      "import: max_position_embeddings 0",
      to_maxtext(),
      needle="max_position_embeddings=0",
      setup=_edit_config(max_position_embeddings=0),
    ),
    Case("import: hidden_size '64'", to_maxtext(), needle='hidden_size="64"', setup=_edit_config(hidden_size="64")),
    Case(
      "import: 3 kv heads for 4 heads",
      to_maxtext(),
      needle="not a multiple of num_key_value_heads=3",
      setup=_edit_config(num_key_value_heads=3),
    ),
    Case(
      "import: tie_word_embeddings 'false'",
      to_maxtext(),
      needle="tie_word_embeddings",
      setup=_edit_config(tie_word_embeddings="false"),
    ),
    Case("import: vocab_size -5", to_maxtext(), needle="vocab_size=-5", setup=_edit_config(vocab_size=-5)),
    Case("import: head_dim 0", to_maxtext(), needle="head_dim=0", setup=_edit_config(head_dim=0)),
    Case(
      "import: rope factor '8'",
      to_maxtext(),
      needle='factor="8"',
      setup=_edit_config(
        rope_parameters={**json.loads((HF_TINY / "config.json").read_text())["rope_parameters"], "factor": "8"}
      ),
    ),
    Case("import: header dtype a list", to_maxtext(), needle="dtype", setup=_header_dtype_list),
    Case(
      "import: weight_map value a number",
      to_maxtext(),
      needle="weight_map",
      setup=_edit_index(lambda m: m.update({next(iter(m)): 2})),
    ),
    Case(
      "import: weight_map value '../x'",
      to_maxtext(),
      needle="weight_map",
      setup=_edit_index(lambda m: m.update({next(iter(m)): "../model.safetensors"})),
    ),
    Case(
      "import: output name of 300 bytes",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, _long_name(d)),
      needle="File name too long",
      out="",
    ),
    Case(
      "import: output under a file",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "f" / "o"),
      needle="can't be made",
      setup=lambda fx, d: (d / "f").write_text("a file"),
    ),
    Case(
      "import: output in a directory not writable",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "ro" / "out"),
      needle="not a writable directory",
      setup=_read_only_dir,
      no_dac=True,
      out="ro/out",
    ),
    Case(
      "import: file-size limit",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "out"),
      needle="File too large",
      fsize=20_000,
    ),
    Case(
      "import: full disk",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "mnt" / "out"),
      needle="No space left on device",
      mount="full",
      out="mnt/out",
    ),
    Case(
      "import: read-only filesystem",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "mnt" / "out"),
      needle="mnt",
      mount="ro",
      out="mnt/out",
    ),
    Case(
      "import: SIGTERM mid-write",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "out"),
      "stopped",
      "SIGTERM",
      stop=signal.SIGTERM,
    ),
    Case(
      "import: SIGINT mid-write",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "out"),
      "stopped",
      "SIGINT",
      stop=signal.SIGINT,
    ),
    Case(
      "import: a killed import's partial output",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "out"),
      "ok",
      "partial output of a conversion that was killed",
      _stale_partial,
      _stale_gone,
    ),
    Case(
      "import: output exists",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "out"),
      needle="exists and is not empty",
      setup=_existing_output,
      out="",
    ),
    Case(
      "import: no such HF dir",
      lambda fx, d: module("convert_hf", "to-maxtext", d / "nope", d / "out"),
      needle="no such directory",
    ),
    # to-hf
    Case(
      "export: relative run dir",
      lambda fx, d: module("convert_hf", "to-hf", "run", "out"),
      "ok",
      "exported",
      _copy_run(),
      _exported_from(3),
    ),
    Case(
      "export --nvfp4: relative run dir",
      lambda fx, d: module("convert_hf", "to-hf", "run", "out", "--nvfp4", "--calibration-batches", "2"),
      "ok",
      "exported",
      _copy_run(),
      _exported_from(3),
    ),
    Case(
      "export: relative config and run",
      lambda fx, d: module(
        "convert_hf", "to-hf", os.path.relpath(imp(fx), d), "out", "run_name=ft", "base_output_directory=runs"
      ),
      "ok",
      "exported",
      lambda fx, d: shutil.copytree(fx / "runs", d / "runs"),
      _exported_from(3),
    ),
    Case(
      "export: newest step truncated",
      ft_to_hf(),
      "ok",
      "checkpoints/3 is unreadable",
      _damaged_run(_truncate_all(3)),
      _exported_from(2),
    ),
    Case(
      "export: newest step's data file truncated",
      ft_to_hf(),
      "ok",
      "checkpoints/3 is unreadable",
      _damaged_run(_truncate_data(3)),
      _exported_from(2),
    ),
    Case(
      "export --nvfp4: newest step truncated",
      ft_to_hf("--nvfp4", "--calibration-batches", "1"),
      "ok",
      "checkpoints/3 is unreadable",
      _damaged_run(_truncate_all(3)),
      _exported_from(2),
    ),
    Case(
      "export: junk empty checkpoints/9/state",
      ft_to_hf(),
      "ok",
      "checkpoints/9 is unreadable",
      _damaged_run(_junk_step),
      _exported_from(3),
    ),
    Case(
      "export: every step damaged",
      ft_to_hf(),
      needle="no readable checkpoint",
      setup=_damaged_run(_truncate_all(1), _truncate_all(2), _truncate_all(3)),
    ),
    Case("export: --max-shard-size 0", fx_to_hf("--max-shard-size", "0"), needle="--max-shard-size"),
    Case("export: --max-shard-size -1", fx_to_hf("--max-shard-size", "-1"), needle="--max-shard-size"),
    Case("export: --max-shard-size 5GB", fx_to_hf("--max-shard-size", "5GB"), needle="--max-shard-size"),
    Case(
      "export --nvfp4: --calibration-batches 0",
      fx_to_hf("--nvfp4", "--calibration-batches", "0"),
      needle="--calibration-batches",
    ),
    Case("export: file-size limit", fx_to_hf(), needle="File too large", fsize=100_000),
    Case(
      "export --nvfp4: file-size limit",
      fx_to_hf("--nvfp4", "--calibration-batches", "1"),
      needle="File too large",
      fsize=100_000,
    ),
    Case(
      "export: full disk",
      lambda fx, d: module("convert_hf", "to-hf", fx / "runs" / "ft", d / "mnt" / "o"),
      needle="No space left on device",
      mount="full",
      out="mnt/o",
    ),
    Case(
      "export: output name of 300 bytes",
      lambda fx, d: module("convert_hf", "to-hf", fx / "runs" / "ft", _long_name(d)),
      needle="File name too long",
      out="",
    ),
    Case(
      "export: output in a directory not writable",
      lambda fx, d: module("convert_hf", "to-hf", fx / "runs" / "ft", d / "ro" / "out"),
      needle="not a writable directory",
      setup=_read_only_dir,
      no_dac=True,
      out="ro/out",
    ),
    Case("export: output exists", fx_to_hf(), needle="exists and is not empty", setup=_existing_output, out=""),
    Case(
      "export: SIGTERM mid-write",
      lambda fx, d: module("convert_hf", "to-hf", fx / "imp", d / "out", "--dtype", "float32"),
      "stopped",
      "SIGTERM",
      stop=signal.SIGTERM,
    ),
    Case(
      "export: SIGINT mid-write",
      lambda fx, d: module("convert_hf", "to-hf", fx / "imp", d / "out", "--dtype", "float32"),
      "stopped",
      "SIGINT",
      stop=signal.SIGINT,
    ),
    Case(
      "export: a killed export's partial output",
      fx_to_hf(),
      "ok",
      "partial output of a conversion that was killed",
      _stale_partial,
      _stale_gone,
    ),
    Case("export: no such source", lambda fx, d: module("convert_hf", "to-hf", d / "nope", d / "out"), needle="nope"),
    Case(
      "export --nvfp4: a bf16 import",
      lambda fx, d: module("convert_hf", "to-hf", fx / "imp", d / "out", "--nvfp4"),
      needle="NVFP4",
    ),
    Case(
      "export: an unfinished (orbax tmp) step",
      lambda fx, d: module(
        "convert_hf",
        "to-hf",
        imp(fx),
        d / "out",
        f"load_parameters_path={d}/run/checkpoints/4.orbax-checkpoint-tmp-1732512345",
        "run_name=",
      ),
      needle="had not finished writing",
      setup=_tmp_dir_of_step,
    ),
    # decode
    Case(
      "decode: prompts_file a directory",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"prompts_file={d}"),
      needle="prompts_file",
      out="",
    ),
    *[
      Case(
        f"decode: another model's checkpoint ({i})",
        lambda fx, d: module("decode", imp(fx), *DECODE, f"load_parameters_path={fx}/runs/other/checkpoints/1"),
        needle="in this config",
        out="",
      )
      for i in (1, 2, 3)
    ],
    Case(
      "decode: damaged checkpoint named",
      lambda fx, d: module("decode", imp(fx), *DECODE, q, f"load_parameters_path={d}/run/checkpoints/3"),
      needle="point at another step of its run",
      setup=_damaged_run(_truncate_data(3)),
      out="",
    ),
    Case(
      "decode: an unfinished (orbax tmp) step",
      lambda fx, d: module(
        "decode", imp(fx), *DECODE, q, f"load_parameters_path={d}/run/checkpoints/4.orbax-checkpoint-tmp-1732512345"
      ),
      needle="had not finished writing",
      setup=_tmp_dir_of_step,
      out="",
    ),
    Case(
      "decode: junk empty step named",
      lambda fx, d: module("decode", imp(fx), *DECODE, q, f"load_parameters_path={d}/run/checkpoints/9"),
      needle="checkpoints/9 is unreadable",
      setup=_damaged_run(_junk_step),
      out="",
    ),
    Case(
      "decode: run's newest step damaged",
      lambda fx, d: module(
        "decode", imp(fx), *DECODE, q, "load_parameters_path=", "run_name=run", f"base_output_directory={d}"
      ),
      "ok",
      "checkpoints/3 is unreadable",
      _damaged_run(_truncate_all(3)),
      out="",
    ),
    Case(
      "decode: run's every step damaged",
      lambda fx, d: module(
        "decode", imp(fx), *DECODE, q, "load_parameters_path=", "run_name=run", f"base_output_directory={d}"
      ),
      needle="no readable checkpoint",
      setup=_damaged_run(_truncate_all(1), _truncate_all(2), _truncate_all(3)),
      out="",
    ),
    Case(
      "decode: weighted at temperature 1e-40",
      lambda fx, d: module(
        "decode",
        imp(fx),
        *DECODE,
        "decode_sampling_strategy=weighted",
        "decode_sampling_temperature=1e-40",
        f"decode_output_file={d}/o.jsonl",
      ),
      "ok",
      "Input `ROMEO.`",
      check=_completion_is_greedy,
      out="",
    ),
    Case(
      "decode: topk at temperature 1e-30",
      lambda fx, d: module(
        "decode",
        imp(fx),
        *DECODE,
        "decode_sampling_strategy=topk",
        "decode_sampling_top_k=5",
        "decode_sampling_temperature=1e-30",
        f"decode_output_file={d}/o.jsonl",
      ),
      "ok",
      "Input `ROMEO.`",
      check=_completion_is_greedy,
      out="",
    ),
    Case(
      "decode: temperature 0",
      decode("decode_sampling_strategy=weighted", "decode_sampling_temperature=0"),
      needle="decode_sampling_temperature=0.0",
      out="",
    ),
    Case(
      "decode: relative load_parameters_path",
      lambda fx, d: module("decode", imp(fx), *DECODE, q, "load_parameters_path=run/checkpoints/2"),
      "ok",
      "Input `ROMEO.`",
      _copy_run(),
      out="",
    ),
    Case(
      "decode: decode_output_file in a missing directory",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"decode_output_file={d}/no/such/o.jsonl"),
      needle="decode_output_file",
      out="no",
    ),
    Case(
      "decode: decode_output_file a directory",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"decode_output_file={d}"),
      needle="decode_output_file",
      out="",
    ),
    Case(
      "decode: decode_output_file name of 300 bytes",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"decode_output_file={_long_name(d)}"),
      needle="File name too long",
      out="",
    ),
    Case(
      "decode: decode_output_file on a full disk",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"decode_output_file={d}/mnt/o.jsonl"),
      needle="No space left on device",
      mount="filled",
      out="mnt/o.jsonl",
    ),
    Case(
      "decode: prompts_file not UTF-8",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"prompts_file={d}/p.txt"),
      needle="not UTF-8",
      setup=lambda fx, d: (d / "p.txt").write_bytes(b"\xff\xfe"),
      out="",
    ),
    Case(
      "decode: prompts_file unreadable",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"prompts_file={d}/p.txt"),
      needle="Permission denied",
      no_dac=True,
      out="",
      setup=lambda fx, d: ((d / "p.txt").write_text("ROMEO.\n"), os.chmod(d / "p.txt", 0o000)),
    ),
  ]


# ---------------------------------------------------------------------------------------------------------------
# Running and judging


def _tree_digest(path):
  h = hashlib.sha256()
  for p in sorted(path.rglob("*")):
    h.update(str(p.relative_to(path)).encode())
    if p.is_file():
      h.update(p.read_bytes())
  return h.hexdigest()


def judge(case, fx, d, proc, protected):
  """None if the case is clear, else why not."""
  lines = harness.stderr_lines(proc)
  if "Traceback" in proc.stdout + proc.stderr:
    return f"a traceback (exit {proc.returncode}): {lines[-3:]}"
  if case.expect == "error":
    if proc.returncode != 2:
      return f"exit {proc.returncode}, not 2"
    if len(lines) != 1 or not lines[0].startswith("error: "):
      return f"{len(lines)} stderr lines: {lines[:2]}"
    if case.needle not in lines[0]:
      return f"vague: {case.needle!r} not in the line {lines[0]!r}"
  elif case.expect == "stopped":
    if proc.returncode != 128 + case.stop:
      return f"exit {proc.returncode}, not {128 + case.stop}"
    if len(lines) != 1:
      return f"stderr: {lines[:2]}"
    if case.needle not in lines[0]:
      return f"vague: {case.needle!r} not in the line {lines[0]!r}"
  else:
    if proc.returncode != 0:
      return f"exit {proc.returncode}: {lines[-1:] if lines else ''}"
    if [l for l in lines if l.startswith("error")]:
      return f"an error line: {lines}"
    if case.needle not in proc.stdout:
      return f"{case.needle!r} not in stdout"
  left = [str(p.relative_to(d)) for p in d.rglob("*") if ".partial-" in p.name]
  if left:
    return f"left behind: {left}"
  if case.expect != "ok" and case.out and (d / case.out).exists():
    return f"{case.out} was written by a failed command"
  if protected is not None and _tree_digest(d / "out") != protected:
    return "an existing output was changed"
  if case.check is not None:
    return case.check(fx, d, proc)
  return None


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in cases()])
def test_case_is_clear(case, fx, tmp_path):
  d = tmp_path / "case"
  d.mkdir()
  if case.setup is not None:
    case.setup(fx, d)
  protected = _tree_digest(d / "out") if (d / "out").is_dir() else None
  environ = {"MAXTEXT_SIGNAL_AT": f"write:{signal.Signals(case.stop).name}"} if case.stop else {}
  argv = case.argv(fx, d)
  if case.mount:
    with harness.mounted(case.mount, d / "mnt"):
      proc = harness.run(argv, d, fsize=case.fsize, no_dac=case.no_dac, **environ)
      why = judge(case, fx, d, proc, protected)
  else:
    proc = harness.run(argv, d, fsize=case.fsize, no_dac=case.no_dac, **environ)
    why = judge(case, fx, d, proc, protected)
  assert why is None, why
