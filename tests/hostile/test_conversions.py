"""A hostile run of the Hugging Face conversion and decode command lines, tried as a new user would (issue #45): each
case is a subprocess, judged clear when it is one `error: ...` line on stderr, exit code 2, no traceback, naming
what the case is about (else "vague"); or the right result; or for a stop signal one line and exit 128 + its
number. And nothing left behind: no `.partial` directory, no output from a command that failed, an existing output
untouched.

    python scripts/hostile_cli.py [--work DIR] [--only SUBSTRING] [--list] [--repo OTHER_CHECKOUT]

Fixtures first (~2 min on a 2-core CPU): tests/data/hf_tiny imported, a 3-step te_nvfp4 fine-tune of it with
checkpoints 1, 2, 3, a checkpoint of another model shape, and a 90 MB synthetic Llama (imported too) that takes long
enough to write for a signal to land mid-write. Storage faults are real: a file-size limit (RLIMIT_FSIZE), a full
200 KB tmpfs (ENOSPC; needs mount rights, else those cases are skipped), a read-only tmpfs (EROFS), and a directory
this process may not write (root without CAP_DAC_OVERRIDE, through util-linux's setpriv). Prints one row per case
and the count; exit code 1 if any case is not clear. A logged `WARNING:` line (te_nvfp4 on a CPU says it runs
emulated) is not counted as an error line. --repo runs another checkout's MaxText (the commit before a change) with
this script's cases.
"""

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing

import ml_dtypes
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from MaxText.checkpointing.hf.safetensors_file import SafetensorsWriter  # noqa: E402  pylint: disable=wrong-import-position

HF_TINY = REPO / "tests" / "data" / "hf_tiny"
DECODE = ["max_prefill_predict_length=16", "max_target_length=36", "prompt=ROMEO."]
SETPRIV = shutil.which("setpriv")
NO_DAC = [SETPRIV, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search", "--"]


CODE = {"repo": REPO}  # the checkout whose MaxText the cases run (--repo: another one, e.g. the commit before)


def env():
  path = os.pathsep.join(filter(None, [str(CODE["repo"]), os.environ.get("PYTHONPATH")]))
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", PYTHONPATH=path)


def module(name, *args):
  return [sys.executable, "-m", f"MaxText.{name}", *map(str, args)]


def run(argv, cwd=REPO, **kw):
  return subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True, check=False, **kw)


# ---------------------------------------------------------------------------------------------------------------
# Fixtures


def make_big_llama(out, hidden=1024, inter=2816, layers=4, heads=16, kv_heads=4, vocab=384):
  """A random Llama directory of ~90 MB bf16 (config.json as hf_tiny's, its tokenizer): slow enough to write."""
  out.mkdir(parents=True)
  config = json.loads((HF_TINY / "config.json").read_text())
  config.update(
    hidden_size=hidden,
    intermediate_size=inter,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv_heads,
    head_dim=hidden // heads,
    vocab_size=vocab,
  )
  (out / "config.json").write_text(json.dumps(config, indent=2))
  shutil.copyfile(HF_TINY / "tokenizer.json", out / "tokenizer.json")
  kv = kv_heads * hidden // heads
  shapes = {
    "model.embed_tokens.weight": (vocab, hidden),
    "model.norm.weight": (hidden,),
    "lm_head.weight": (vocab, hidden),
  }
  for i in range(layers):
    p = f"model.layers.{i}."
    shapes.update(
      {
        p + "input_layernorm.weight": (hidden,),
        p + "post_attention_layernorm.weight": (hidden,),
        p + "self_attn.q_proj.weight": (hidden, hidden),
        p + "self_attn.k_proj.weight": (kv, hidden),
        p + "self_attn.v_proj.weight": (kv, hidden),
        p + "self_attn.o_proj.weight": (hidden, hidden),
        p + "mlp.gate_proj.weight": (inter, hidden),
        p + "mlp.up_proj.weight": (inter, hidden),
        p + "mlp.down_proj.weight": (hidden, inter),
      }
    )
  rng = np.random.default_rng(0)
  writer = SafetensorsWriter(out / "model.safetensors", {n: (ml_dtypes.bfloat16, s) for n, s in shapes.items()})
  for name, shape in shapes.items():
    value = np.ones(shape, np.float32) if len(shape) == 1 else rng.standard_normal(shape, np.float32) * 0.02
    writer.write(name, value.astype(ml_dtypes.bfloat16))
  writer.close()


def build_fixtures(work):
  """The shared, read-only fixtures under `work/fx` (made once; kept between runs)."""
  fx = work / "fx"
  if (fx / "done").exists():
    return fx
  shutil.rmtree(fx, ignore_errors=True)
  fx.mkdir(parents=True)
  steps = [
    module("convert_hf", "to-maxtext", HF_TINY, fx / "imp"),
    [
      sys.executable,
      CODE["repo"] / "train.py",
      fx / "imp" / "config.yml",
      "steps=3",
      "checkpoint_period=1",
      "enable_checkpointing=true",
      "dataset_type=synthetic",
      "quantization=te_nvfp4",
      "per_device_batch_size=2",
      "max_target_length=32",
      f"base_output_directory={fx / 'runs'}",
      "run_name=ft",
    ],
    [
      sys.executable,
      CODE["repo"] / "train.py",
      fx / "imp" / "config.yml",
      "steps=1",
      "enable_checkpointing=true",
      "dataset_type=synthetic",
      "base_mlp_dim=96",
      "load_parameters_path=",
      "per_device_batch_size=2",
      "max_target_length=32",
      f"base_output_directory={fx / 'runs'}",
      "run_name=other",
    ],
    module("decode", fx / "imp" / "config.yml", *DECODE, f"decode_output_file={fx / 'greedy.jsonl'}"),
  ]
  for argv in steps:
    proc = run([str(a) for a in argv])
    if proc.returncode != 0:
      sys.exit(f"fixture step failed: {' '.join(map(str, argv))}\n{proc.stderr[-3000:]}")
  make_big_llama(fx / "big_hf")
  proc = run(module("convert_hf", "to-maxtext", fx / "big_hf", fx / "big_imp"))
  if proc.returncode != 0:
    sys.exit(f"fixture step failed: big import\n{proc.stderr[-3000:]}")
  (fx / "done").write_text("")
  return fx


# ---------------------------------------------------------------------------------------------------------------
# Cases


@dataclasses.dataclass
class Case:
  name: str
  cls: str  # the class it probes (1-11), or "new"
  argv: typing.Callable  # (fx, d) -> argv
  expect: str = "error"  # error | ok | stopped
  needle: str = ""  # in the error line (error, stopped) or in stdout (ok)
  setup: typing.Callable = None  # (fx, d) -> None
  check: typing.Callable = None  # (fx, d, proc) -> failure text or None
  fsize: int = 0  # RLIMIT_FSIZE for the process
  stop: int = 0  # signal sent once the partial output holds a few MB
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
      "1",
      lambda fx, d: module("convert_hf", "to-maxtext", "hf", "out"),
      "ok",
      "imported",
      _copy_hf,
      _import_is_absolute,
    ),
    Case(
      "import: rms_norm_eps null", "5", to_maxtext(), needle="rms_norm_eps=null", setup=_edit_config(rms_norm_eps=None)
    ),
    Case(
      "import: rope_theta '10k'",
      "5",
      to_maxtext(),
      needle='rope_theta="10k"',
      setup=_edit_config(rope_parameters=KeyError, rope_theta="10k"),
    ),
    Case(
      "import: num_attention_heads 0",
      "5",
      to_maxtext(),
      needle="num_attention_heads=0",
      setup=_edit_config(num_attention_heads=0),
    ),
    Case(
      "import: rope_parameters 'llama3'",
      "5",
      to_maxtext(),
      needle='rope_parameters="llama3"',
      setup=_edit_config(rope_parameters="llama3"),
    ),
    Case(
      "import: rope_scaling [1, 2]",
      "5",
      to_maxtext(),
      needle="rope_scaling=[1, 2]",
      setup=_edit_config(rope_parameters=KeyError, rope_scaling=[1, 2]),
    ),
    Case(
      "import: max_position_embeddings null",
      "5",
      to_maxtext(),
      needle="max_position_embeddings=null",
      setup=_edit_config(max_position_embeddings=None),
    ),
    Case(
      "import: max_position_embeddings 0",
      "6",
      to_maxtext(),
      needle="max_position_embeddings=0",
      setup=_edit_config(max_position_embeddings=0),
    ),
    Case(
      "import: hidden_size '64'", "5", to_maxtext(), needle='hidden_size="64"', setup=_edit_config(hidden_size="64")
    ),
    Case(
      "import: 3 kv heads for 4 heads",
      "5",
      to_maxtext(),
      needle="not a multiple of num_key_value_heads=3",
      setup=_edit_config(num_key_value_heads=3),
    ),
    Case(
      "import: tie_word_embeddings 'false'",
      "5",
      to_maxtext(),
      needle="tie_word_embeddings",
      setup=_edit_config(tie_word_embeddings="false"),
    ),
    Case("import: vocab_size -5", "5", to_maxtext(), needle="vocab_size=-5", setup=_edit_config(vocab_size=-5)),
    Case("import: head_dim 0", "5", to_maxtext(), needle="head_dim=0", setup=_edit_config(head_dim=0)),
    Case(
      "import: rope factor '8'",
      "5",
      to_maxtext(),
      needle='factor="8"',
      setup=_edit_config(
        rope_parameters={**json.loads((HF_TINY / "config.json").read_text())["rope_parameters"], "factor": "8"}
      ),
    ),
    Case("import: header dtype a list", "5", to_maxtext(), needle="dtype", setup=_header_dtype_list),
    Case(
      "import: weight_map value a number",
      "5",
      to_maxtext(),
      needle="weight_map",
      setup=_edit_index(lambda m: m.update({next(iter(m)): 2})),
    ),
    Case(
      "import: weight_map value '../x'",
      "5",
      to_maxtext(),
      needle="weight_map",
      setup=_edit_index(lambda m: m.update({next(iter(m)): "../model.safetensors"})),
    ),
    Case(
      "import: output name of 300 bytes",
      "7",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, _long_name(d)),
      needle="File name too long",
      out="",
    ),
    Case(
      "import: output under a file",
      "new",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "f" / "o"),
      needle="can't be made",
      setup=lambda fx, d: (d / "f").write_text("a file"),
    ),
    Case(
      "import: output in a directory not writable",
      "2",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "ro" / "out"),
      needle="not a writable directory",
      setup=_read_only_dir,
      no_dac=True,
      out="ro/out",
    ),
    Case(
      "import: file-size limit",
      "2",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "out"),
      needle="File too large",
      fsize=20_000,
    ),
    Case(
      "import: full disk",
      "2",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "mnt" / "out"),
      needle="No space left on device",
      mount="full",
      out="mnt/out",
    ),
    Case(
      "import: read-only filesystem",
      "2",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "mnt" / "out"),
      needle="mnt",
      mount="ro",
      out="mnt/out",
    ),
    Case(
      "import: SIGTERM mid-write",
      "4",
      lambda fx, d: module("convert_hf", "to-maxtext", fx / "big_hf", d / "out"),
      "stopped",
      "SIGTERM",
      stop=signal.SIGTERM,
    ),
    Case(
      "import: SIGINT mid-write",
      "4",
      lambda fx, d: module("convert_hf", "to-maxtext", fx / "big_hf", d / "out"),
      "stopped",
      "SIGINT",
      stop=signal.SIGINT,
    ),
    Case(
      "import: a killed import's partial output",
      "4",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "out"),
      "ok",
      "partial output of a conversion that was killed",
      _stale_partial,
      _stale_gone,
    ),
    Case(
      "import: output exists",
      "new",
      lambda fx, d: module("convert_hf", "to-maxtext", HF_TINY, d / "out"),
      needle="exists and is not empty",
      setup=_existing_output,
      out="",
    ),
    Case(
      "import: no such HF dir",
      "new",
      lambda fx, d: module("convert_hf", "to-maxtext", d / "nope", d / "out"),
      needle="no such directory",
    ),
    # to-hf
    Case(
      "export: relative run dir",
      "1",
      lambda fx, d: module("convert_hf", "to-hf", "run", "out"),
      "ok",
      "exported",
      _copy_run(),
      _exported_from(3),
    ),
    Case(
      "export --nvfp4: relative run dir",
      "1",
      lambda fx, d: module("convert_hf", "to-hf", "run", "out", "--nvfp4", "--calibration-batches", "2"),
      "ok",
      "exported",
      _copy_run(),
      _exported_from(3),
    ),
    Case(
      "export: relative config and run",
      "1",
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
      "3",
      ft_to_hf(),
      "ok",
      "checkpoints/3 is unreadable",
      _damaged_run(_truncate_all(3)),
      _exported_from(2),
    ),
    Case(
      "export: newest step's data file truncated",
      "3",
      ft_to_hf(),
      "ok",
      "checkpoints/3 is unreadable",
      _damaged_run(_truncate_data(3)),
      _exported_from(2),
    ),
    Case(
      "export --nvfp4: newest step truncated",
      "3",
      ft_to_hf("--nvfp4", "--calibration-batches", "1"),
      "ok",
      "checkpoints/3 is unreadable",
      _damaged_run(_truncate_all(3)),
      _exported_from(2),
    ),
    Case(
      "export: junk empty checkpoints/9/state",
      "11",
      ft_to_hf(),
      "ok",
      "checkpoints/9 is unreadable",
      _damaged_run(_junk_step),
      _exported_from(3),
    ),
    Case(
      "export: every step damaged",
      "3",
      ft_to_hf(),
      needle="no readable checkpoint",
      setup=_damaged_run(_truncate_all(1), _truncate_all(2), _truncate_all(3)),
    ),
    Case("export: --max-shard-size 0", "10", fx_to_hf("--max-shard-size", "0"), needle="--max-shard-size"),
    Case("export: --max-shard-size -1", "10", fx_to_hf("--max-shard-size", "-1"), needle="--max-shard-size"),
    Case("export: --max-shard-size 5GB", "10", fx_to_hf("--max-shard-size", "5GB"), needle="--max-shard-size"),
    Case(
      "export --nvfp4: --calibration-batches 0",
      "10",
      fx_to_hf("--nvfp4", "--calibration-batches", "0"),
      needle="--calibration-batches",
    ),
    Case("export: file-size limit", "2", fx_to_hf(), needle="File too large", fsize=100_000),
    Case(
      "export --nvfp4: file-size limit",
      "2",
      fx_to_hf("--nvfp4", "--calibration-batches", "1"),
      needle="File too large",
      fsize=100_000,
    ),
    Case(
      "export: full disk",
      "2",
      lambda fx, d: module("convert_hf", "to-hf", fx / "runs" / "ft", d / "mnt" / "o"),
      needle="No space left on device",
      mount="full",
      out="mnt/o",
    ),
    Case(
      "export: output name of 300 bytes",
      "7",
      lambda fx, d: module("convert_hf", "to-hf", fx / "runs" / "ft", _long_name(d)),
      needle="File name too long",
      out="",
    ),
    Case(
      "export: output in a directory not writable",
      "2",
      lambda fx, d: module("convert_hf", "to-hf", fx / "runs" / "ft", d / "ro" / "out"),
      needle="not a writable directory",
      setup=_read_only_dir,
      no_dac=True,
      out="ro/out",
    ),
    Case("export: output exists", "new", fx_to_hf(), needle="exists and is not empty", setup=_existing_output, out=""),
    Case(
      "export: SIGTERM mid-write",
      "4",
      lambda fx, d: module("convert_hf", "to-hf", fx / "big_imp", d / "out", "--dtype", "float32"),
      "stopped",
      "SIGTERM",
      stop=signal.SIGTERM,
    ),
    Case(
      "export: SIGINT mid-write",
      "4",
      lambda fx, d: module("convert_hf", "to-hf", fx / "big_imp", d / "out", "--dtype", "float32"),
      "stopped",
      "SIGINT",
      stop=signal.SIGINT,
    ),
    Case(
      "export: a killed export's partial output",
      "4",
      fx_to_hf(),
      "ok",
      "partial output of a conversion that was killed",
      _stale_partial,
      _stale_gone,
    ),
    Case(
      "export: no such source", "new", lambda fx, d: module("convert_hf", "to-hf", d / "nope", d / "out"), needle="nope"
    ),
    Case(
      "export --nvfp4: a bf16 import",
      "new",
      lambda fx, d: module("convert_hf", "to-hf", fx / "imp", d / "out", "--nvfp4"),
      needle="NVFP4",
    ),
    Case(
      "export: an unfinished (orbax tmp) step",
      "8",
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
      "8",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"prompts_file={d}"),
      needle="prompts_file",
      out="",
    ),
    *[
      Case(
        f"decode: another model's checkpoint ({i})",
        "8",
        lambda fx, d: module("decode", imp(fx), *DECODE, f"load_parameters_path={fx}/runs/other/checkpoints/1"),
        needle="in this config",
        out="",
      )
      for i in (1, 2, 3)
    ],
    Case(
      "decode: damaged checkpoint named",
      "8",
      lambda fx, d: module("decode", imp(fx), *DECODE, q, f"load_parameters_path={d}/run/checkpoints/3"),
      needle="point at another step of its run",
      setup=_damaged_run(_truncate_data(3)),
      out="",
    ),
    Case(
      "decode: an unfinished (orbax tmp) step",
      "8",
      lambda fx, d: module(
        "decode", imp(fx), *DECODE, q, f"load_parameters_path={d}/run/checkpoints/4.orbax-checkpoint-tmp-1732512345"
      ),
      needle="had not finished writing",
      setup=_tmp_dir_of_step,
      out="",
    ),
    Case(
      "decode: junk empty step named",
      "11",
      lambda fx, d: module("decode", imp(fx), *DECODE, q, f"load_parameters_path={d}/run/checkpoints/9"),
      needle="checkpoints/9 is unreadable",
      setup=_damaged_run(_junk_step),
      out="",
    ),
    Case(
      "decode: run's newest step damaged",
      "3",
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
      "3",
      lambda fx, d: module(
        "decode", imp(fx), *DECODE, q, "load_parameters_path=", "run_name=run", f"base_output_directory={d}"
      ),
      needle="no readable checkpoint",
      setup=_damaged_run(_truncate_all(1), _truncate_all(2), _truncate_all(3)),
      out="",
    ),
    Case(
      "decode: weighted at temperature 1e-40",
      "9",
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
      "9",
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
      "9",
      decode("decode_sampling_strategy=weighted", "decode_sampling_temperature=0"),
      needle="decode_sampling_temperature=0.0",
      out="",
    ),
    Case(
      "decode: relative load_parameters_path",
      "1",
      lambda fx, d: module("decode", imp(fx), *DECODE, q, "load_parameters_path=run/checkpoints/2"),
      "ok",
      "Input `ROMEO.`",
      _copy_run(),
      out="",
    ),
    Case(
      "decode: decode_output_file in a missing directory",
      "new",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"decode_output_file={d}/no/such/o.jsonl"),
      needle="decode_output_file",
      out="no",
    ),
    Case(
      "decode: decode_output_file a directory",
      "new",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"decode_output_file={d}"),
      needle="decode_output_file",
      out="",
    ),
    Case(
      "decode: decode_output_file name of 300 bytes",
      "7",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"decode_output_file={_long_name(d)}"),
      needle="File name too long",
      out="",
    ),
    Case(
      "decode: decode_output_file on a full disk",
      "2",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"decode_output_file={d}/mnt/o.jsonl"),
      needle="No space left on device",
      mount="filled",
      out="mnt/o.jsonl",
    ),
    Case(
      "decode: prompts_file not UTF-8",
      "new",
      lambda fx, d: module("decode", imp(fx), *DECODE, f"prompts_file={d}/p.txt"),
      needle="not UTF-8",
      setup=lambda fx, d: (d / "p.txt").write_bytes(b"\xff\xfe"),
      out="",
    ),
    Case(
      "decode: prompts_file unreadable",
      "8",
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


def _limits(fsize=0):
  def apply():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as from a terminal (a background job of a shell ignores it)
    if fsize:
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of the process dying
      resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

  return apply


@contextlib.contextmanager
def _mounted(kind, where):
  if not kind:
    yield True
    return
  where.mkdir()
  options = "size=200k,ro" if kind == "ro" else "size=200k"
  ok = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True).returncode == 0
  if ok and kind == "filled":  # no byte left
    with contextlib.suppress(OSError), open(where / "filler", "wb") as f:
      while True:
        f.write(b"x" * 4096)
        f.flush()
  try:
    yield ok
  finally:
    if ok:
      subprocess.run(["umount", str(where)], capture_output=True, check=False)


def _partial_bytes(out):
  """The bytes in `out`'s partial outputs so far (0 where they change under the walk)."""
  try:
    return sum(f.stat().st_size for p in out.parent.glob(f".{out.name}.partial-*") for f in p.rglob("*") if f.is_file())
  except OSError:
    return 0


def _run_with_signal(argv, cwd, signum, watch):
  """Runs `argv`, sending `signum` once a partial output beside `watch` holds 4 MB or more."""
  proc = subprocess.Popen(
    argv, cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_limits()
  )
  sent, deadline = False, time.time() + 300
  while proc.poll() is None and time.time() < deadline:
    if not sent and _partial_bytes(watch) >= 4 << 20:
      proc.send_signal(signum)
      sent = True
    time.sleep(0.02)
  out, err = proc.communicate(timeout=300)
  return subprocess.CompletedProcess(argv, proc.returncode, out, err), sent


def judge(case, fx, d, proc, protected):
  """None if the case is clear, else why not."""
  text = proc.stdout + proc.stderr
  # A logged warning is not the error (on a CPU, te_nvfp4 says it runs emulated NVFP4): not counted.
  lines = [l for l in proc.stderr.splitlines() if l.strip() and not l.startswith("WARNING:")]
  if "Traceback" in text:
    return f"a traceback (exit {proc.returncode})"
  if case.expect == "error":
    if proc.returncode != 2:
      return f"exit {proc.returncode}, not 2"
    if len(lines) != 1 or not lines[0].startswith("error: "):
      return f"{len(lines)} stderr lines: {lines[:2]}"
    if case.needle not in lines[0]:
      return f"vague: {case.needle!r} not in the line"
  elif case.expect == "stopped":
    if proc.returncode != 128 + case.stop:
      return f"exit {proc.returncode}, not {128 + case.stop}"
    if len(lines) != 1:
      return f"stderr: {lines[:2]}"
    if case.needle not in lines[0]:
      return f"vague: {case.needle!r} not in the line"
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


def run_case(case, fx, d):
  """(status, detail): status clear | NOT CLEAR | skipped."""
  d.mkdir(parents=True)
  if case.setup is not None:
    case.setup(fx, d)
  if case.no_dac and not SETPRIV:
    return "skipped", "no setpriv here"
  protected = _tree_digest(d / "out") if (d / "out").is_dir() else None
  with _mounted(case.mount, d / "mnt") as mounted:
    if not mounted:
      return "skipped", "no right to mount a tmpfs here"
    argv = [str(a) for a in case.argv(fx, d)]
    argv = NO_DAC + argv if case.no_dac else argv
    if case.stop:
      proc, sent = _run_with_signal(argv, d, case.stop, d / "out")
      if not sent:
        return "skipped", "finished before the signal could be sent"
    else:
      proc = subprocess.run(
        argv, cwd=d, env=env(), capture_output=True, text=True, check=False, preexec_fn=_limits(case.fsize), timeout=600
      )
    why = judge(case, fx, d, proc, protected)
  line = next((l for l in reversed(proc.stderr.splitlines()) if l.strip()), "")
  shown = line if case.expect != "ok" else next((l for l in proc.stdout.splitlines() if case.needle in l), line)
  if why is None:
    return "clear", shown
  return ("vague" if why.startswith("vague: ") else "NOT CLEAR"), f"{why} | {line[:200]}"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--work", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "maxtext_hostile")
  parser.add_argument("--only", default="", help="run the cases whose name holds this")
  parser.add_argument("--list", action="store_true", help="list the cases and exit")
  parser.add_argument("--repo", type=pathlib.Path, default=REPO, help="the checkout to run (default: this one)")
  args = parser.parse_args(argv)
  CODE["repo"] = args.repo.absolute()
  chosen = [c for c in cases() if args.only in c.name]
  if args.list:
    for c in chosen:
      print(f"[{c.cls:>3}] {c.name}")
    return 0
  work = args.work.absolute()
  fx = build_fixtures(work)
  counts = {"clear": 0, "vague": 0, "NOT CLEAR": 0, "skipped": 0}
  for i, case in enumerate(chosen):
    d = work / "cases" / f"{i:02d}"
    shutil.rmtree(d, ignore_errors=True)
    start = time.time()
    status, detail = run_case(case, fx, d)
    counts[status] += 1
    print(f"{status:9} [{case.cls:>3}] {case.name:48} {time.time() - start:5.1f}s  {detail[:230]}", flush=True)
    if status == "clear":
      shutil.rmtree(d, ignore_errors=True)
  print(
    f"\n{len(chosen)} cases: {counts['clear']} clear, {counts['vague']} vague (one line, exit 2, but not naming what "
    f"the case is about), {counts['NOT CLEAR']} not clear, {counts['skipped']} skipped"
  )
  return 1 if counts["NOT CLEAR"] or counts["vague"] else 0


if __name__ == "__main__":
  sys.exit(main())
