"""The launchers tried as a new user would: scripts/slurm/submit.sh (sbatch missing or refusing the job, values sbatch
or pyxis would split, absurd node counts), `make te` (scripts/te/build.sh: two at once, an interrupted build) and
benchmarks/parity.py (--out and --config naming the wrong kind of path, XLA_FLAGS). Each a one-line error and
nothing written (tests/hostile/harness.py)."""

import fcntl
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.hostile import harness

SUBMIT = REPO / "scripts" / "slurm" / "submit.sh"
BUILD = REPO / "scripts" / "te" / "build.sh"
JOB = ["--gpu", "gb200", "--nodes", "1", "--model", str(REPO / "configs" / "gb200" / "llama3_8b_nvfp4.yml")]
JOB += ["--quantization", "te_nvfp4"]


def _submit(tmp_path, *args, path=None):
  """submit.sh from `tmp_path` with `path` (default: this python's directory first, then the system's)."""
  environ = {"PATH": path or os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"])}
  return harness.run(["bash", SUBMIT, *args], tmp_path, **environ)


def _fake_sbatch(tmp_path, script):
  """A directory holding an `sbatch` that runs `script` (bash): the cluster's answer, without a cluster."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "sbatch").write_text(f"#!/bin/bash\n{script}\n")
  (bin_dir / "sbatch").chmod(0o755)
  return os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), "/usr/bin", "/bin"])


def test_submit_without_sbatch_is_one_line_and_makes_no_directory(tmp_path):
  proc = _submit(tmp_path, *JOB, "--output-dir", tmp_path / "runs")
  harness.assert_one_line(proc, 2, "error: sbatch is not on PATH: submit from a Slurm login node")
  assert not (tmp_path / "runs").exists()


def test_a_job_sbatch_refuses_leaves_no_directory(tmp_path):
  path = _fake_sbatch(tmp_path, 'echo "sbatch: error: Invalid account or account/partition combination" >&2; exit 1')
  proc = _submit(tmp_path, *JOB, "--output-dir", tmp_path / "runs" / "new", path=path)
  harness.assert_one_line(proc, 2, "error: sbatch refused the job (sbatch: error: Invalid account")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


def test_a_job_sbatch_takes_gets_its_run_directory(tmp_path):
  path = _fake_sbatch(tmp_path, 'echo "Submitted batch job 42"')
  proc = _submit(tmp_path, *JOB, "--output-dir", tmp_path / "runs", path=path)
  assert proc.returncode == 0 and proc.stdout.strip() == "Submitted batch job 42", proc.stderr
  assert (tmp_path / "runs" / "maxtext-llama3_8b_nvfp4-te_nvfp4-1n").is_dir()


@pytest.mark.parametrize(
  "args, needle",
  [
    (["--output-dir", "a,b"], "holds ',', which sbatch's --export and pyxis's --container-mounts split at"),
    (["--output-dir", "a:b"], "holds ':', which pyxis's --container-mounts reads as src:dst at"),
    (["--output-dir", "run%j"], "holds '%', which sbatch reads as a file-name pattern (%j) at"),
    (["--image", "registry/a,b:1"], "--image registry/a,b:1 holds ','"),
    (["--nodes", "100000000000000000000000"], "--nodes 100000000000000000000000 is more than the 65536 nodes"),
    (["--nodes", "65537"], "--nodes 65537 is more than the 65536 nodes a job here may have (262144 GPUs)"),
    (["--output-dir", "f/runs"], "--output-dir {d}/f/runs can't be made: {d}/f is not a writable directory"),
  ],
)
def test_values_sbatch_would_split_or_reject_are_refused_before_anything_is_written(tmp_path, args, needle):
  (tmp_path / "f").write_text("")
  path = _fake_sbatch(tmp_path, "touch submitted")
  proc = _submit(tmp_path, *JOB, *args, path=path)
  harness.assert_one_line(proc, 2, needle.format(d=tmp_path))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "f"]


def _fake_te_venv(tmp_path):
  """A venv as `make te` leaves it, for the lock's and the stamp's sake: its python this one, Transformer Engine a
  stand-in package (nothing here imports it for real)."""
  venv = tmp_path / "venv-te"
  (venv / "bin").mkdir(parents=True)
  (tmp_path / "site" / "transformer_engine" / "jax").mkdir(parents=True)
  (tmp_path / "site" / "transformer_engine" / "__init__.py").write_text("")
  (tmp_path / "site" / "transformer_engine" / "jax" / "__init__.py").write_text("")
  # It runs this interpreter: a build that went past its stamp check must not install into this interpreter's
  # environment, so pip is refused here (one line, exit 1) instead of run.
  (venv / "bin" / "python").write_text(
    "#!/bin/bash\n"
    'if [[ "$1" == -m && "$2" == pip ]]; then echo "fake venv-te: pip refused" >&2; exit 1; fi\n'
    f'PYTHONPATH="{tmp_path / "site"}:{REPO}" JAX_PLATFORMS=cpu exec {sys.executable} "$@"\n'
  )
  (venv / "bin" / "python").chmod(0o755)
  return venv


def _build_env(venv):
  cache = venv.parent / "cache"
  return {"TE_VENV": str(venv), "PYTHON": sys.executable, "PIP_CONFIG_FILE": os.devnull, "MAXTEXT_NVFP4_CACHE": cache}


def test_make_te_started_twice_builds_once(tmp_path):
  """The second waits on the first's lock (its line says so), then finds the venv the first finished: up to date."""
  venv = _fake_te_venv(tmp_path)
  stamp = harness.run(["bash", BUILD, "--stamp"], **_build_env(venv)).stdout.strip()
  assert stamp.startswith("te-")
  with open(f"{venv}.lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # the first `make te`, building
    lock.write("4242")
    lock.flush()
    second = subprocess.Popen(
      ["bash", BUILD], env=harness.env(**_build_env(venv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
      first_line = second.stdout.readline()
      assert first_line.startswith("te: [1/6] checking Python"), first_line
      waiting = second.stdout.readline()
      assert waiting.strip() == f"te: another make te (pid 4242) is building {venv}; waiting for it to finish"
      (venv / ".te-installed").write_text(stamp + "\n")  # the first one finishes
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
    out, err = second.communicate(timeout=300)
  assert second.returncode == 0 and not err.strip(), err
  assert out.strip().startswith("te: up to date") and "[2/6]" not in out


def test_an_interrupted_make_te_leaves_nothing_taken_for_finished(tmp_path):
  """SIGINT while the build waits (a defined point: its waiting line): one line, exit 130; the venv it had not
  finished is refused by scripts/te/python.sh, and a build that fails removes the stamp before changing anything."""
  venv = _fake_te_venv(tmp_path)
  with open(f"{venv}.lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    build = subprocess.Popen(
      ["bash", BUILD],
      env=harness.env(**_build_env(venv)),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,  # its own process group, as a terminal's job: Ctrl-C reaches the build and its flock
    )
    while "waiting for it to finish" not in build.stdout.readline():
      assert build.poll() is None, build.stderr.read()
    os.killpg(build.pid, signal.SIGINT)
    _, err = build.communicate(timeout=60)
  assert build.returncode == 130
  assert err.strip() == "make te: interrupted; the venv is not marked finished (run make te again)"
  proc = harness.run(["bash", REPO / "scripts" / "te" / "python.sh", "-c", "print('ran')"], TE_VENV=str(venv))
  harness.assert_one_line(proc, 2, f"error: {venv} is not finished (a make te was interrupted, or is still running)")
  (venv / ".te-installed").write_text("a stamp of another build\n")  # stale: the next build rebuilds
  offline = harness.run(["bash", BUILD], **_build_env(venv), PIP_INDEX_URL="http://127.0.0.1:9/simple")
  harness.assert_one_line(offline, 2, "make te: error: cannot download transformer-engine==", prefix="make te:")
  assert not (venv / ".te-installed").exists()


def _parity(tmp_path, *args, **environ):
  argv = [sys.executable, REPO / "benchmarks" / "parity.py", "--steps", "2", "--modes", "bf16", *args]
  return harness.run(argv, tmp_path, **environ)


def test_parity_out_naming_a_file_is_refused_before_training(tmp_path):
  (tmp_path / "results.md").write_text("mine")
  proc = _parity(tmp_path, "--out", tmp_path / "results.md")
  harness.assert_one_line(proc, 2, f"error: --out {tmp_path / 'results.md'} is a file, not a directory")
  assert "===" not in proc.stdout and (tmp_path / "results.md").read_text() == "mine"


def test_parity_config_naming_a_directory_says_so(tmp_path):
  proc = _parity(tmp_path, "--config", REPO / "configs", "--out", tmp_path / "out")
  harness.assert_one_line(proc, 2, f"config file {REPO / 'configs'} is a directory; give a YAML file (in it: ")
  assert not (tmp_path / "out").exists()


def test_parity_with_an_unknown_xla_flag_is_one_line(tmp_path):
  proc = _parity(tmp_path, "--out", tmp_path / "out", XLA_FLAGS="--xla_no_such_flag=1")
  harness.assert_one_line(proc, 2, "error: XLA_FLAGS='--xla_no_such_flag=1': XLA has no flag --xla_no_such_flag=1")
  assert not (tmp_path / "out").exists()
