"""The Slurm launch scripts: syntax, and their dry runs for 1, 32 and 128 nodes."""

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from MaxText.aot import targets
from tests.conftest import REPO

SUBMIT = REPO / "scripts" / "slurm" / "submit.sh"


def test_scripts_parse():
  for script in (SUBMIT, REPO / "scripts" / "slurm" / "train.sbatch"):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


@pytest.mark.parametrize(
  "gpu,nodes,model",
  [
    ("gb200", 1, "configs/gb200/llama3_8b_nvfp4.yml"),
    ("gb300", 32, "configs/gb300/llama3.1_405b_nvfp4.yml"),
    ("gb300", 128, "configs/gb300/llama3.1_405b_fp8.yml"),
  ],
)
def test_dry_run_prints_the_job(gpu, nodes, model):
  proc = subprocess.run(
    [
      "bash",
      str(SUBMIT),
      "--gpu",
      gpu,
      "--nodes",
      str(nodes),
      "--model",
      model,
      "--quantization",
      "te_nvfp4",
      "--partition",
      "batch",
      "--dry-run",
      "--",
      "steps=20",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=True,
  )
  lines = proc.stdout.splitlines()
  sbatch = shlex.split(lines[1])
  assert sbatch[0] == "sbatch" and f"--nodes={nodes}" in sbatch and "--gpus-per-node=4" in sbatch
  assert "--ntasks-per-node=1" in sbatch and "--partition=batch" in sbatch
  script = sbatch.index(str(REPO / "scripts" / "slurm" / "train.sbatch"))
  assert sbatch[script + 1 :] == [
    model,
    "quantization=te_nvfp4",
    f"gpu_type={gpu}",
    f"run_name=maxtext-{model.split('/')[-1][:-4]}-te_nvfp4-{nodes}n",
    "dcn_data_parallelism=-1",
    "steps=20",
  ]
  env = dict(shlex.split(l)[1].split("=", 1) for l in lines if l.startswith("export "))
  assert env["NNODES"] == str(nodes) and env["JAX_COORDINATOR_IP"] == "node0001"
  assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.90"
  flags = env["XLA_FLAGS"].split()
  assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
  assert f"--xla_gpu_all_gather_combine_threshold_bytes={2**30 // (4 * nodes)}" in flags
  assert f"--xla_gpu_reduce_scatter_combine_threshold_bytes={2**30 // (8 * nodes)}" in flags
  assert env["XLA_FLAGS"].split()[:2] == [
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_triton_gemm=false",
  ]  # scripts/xla_flags.py's
  srun = shlex.split(lines[-1])
  assert srun[0] == "srun" and "--container-image=ghcr.io/nvidia/jax:maxtext-nvfp4" in srun
  assert srun[srun.index("train.py") - 1 : srun.index("train.py") + 3] == ["python3", "train.py", model, "hardware=gpu"]
  assert "jax_distributed_heartbeat_timeout_seconds=30" in srun  # a lost node ends the job within 30 s


def test_nsys_wraps_each_task_and_captures_the_profiled_steps():
  proc = subprocess.run(
    [
      "bash",
      str(SUBMIT),
      "--gpu",
      "gb200",
      "--nodes",
      "1",
      "--model",
      "configs/gb200/llama3_8b_nvfp4.yml",
      "--quantization",
      "te_nvfp4",
      "--nsys",
      "--dry-run",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=True,
  )
  srun = shlex.split(proc.stdout.splitlines()[-1])
  nsys = srun.index("nsys")
  assert srun[nsys + 1] == "profile" and "--capture-range=cudaProfilerApi" in srun[nsys:]
  assert srun[srun.index("train.py") - 1] == "python3" and "profiler=nsys" in srun


@pytest.mark.parametrize(
  "args,message",
  [
    (
      ["--gpu", "h100", "--nodes", "1", "--model", "configs/llama3_8b.yml", "--quantization", "bf16"],
      "--gpu must be gb200 or gb300",
    ),
    (
      ["--gpu", "gb200", "--nodes", "0", "--model", "configs/llama3_8b.yml", "--quantization", "bf16"],
      "--nodes must be a positive integer",
    ),
    (["--gpu", "gb200", "--nodes", "2", "--model", "nope.yml", "--quantization", "bf16"], "no such file"),
  ],
)
def test_bad_arguments_are_one_line_errors(args, message):
  proc = subprocess.run(["bash", str(SUBMIT), *args, "--dry-run"], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 2 and proc.stderr.startswith("error: ") and message in proc.stderr


def test_gb300_405b_preset_fits_in_dry_run():
  from MaxText import config, train
  from MaxText.trainer import preflight

  cfg = config.load(REPO / "configs" / "gb300" / "llama3.1_405b_nvfp4.yml", ["dry_run=true"])
  assert train.train(cfg) == []
  mesh = {"data": 1, "fsdp": 128, "context": 1, "tensor": 1}
  text, mem = preflight.summary(cfg, config.RunShape.of(cfg, 128), mesh)
  assert "mesh: data 1 x fsdp 128 x context 1 x tensor 1 (128 device(s))" in text
  fits, need, have, _ = preflight.memory_check(cfg, mem, None)
  assert fits and 60 < need < have and have == pytest.approx(targets.GPUS["gb300"].usable_bytes() / 2**30)


@pytest.mark.parametrize(
  "args,message",
  [
    (["--image"], "--image needs a value"),
    (["--image", "--dry-run"], "--image needs a value"),
    (["--quantization", "te_nvfp5"], "quantization='te_nvfp5' is not one of"),
    (["--", "stepz=3"], "unknown key 'stepz' (did you mean 'steps'?)"),
  ],
)
def test_dry_run_checks_values_and_the_config(args, message):
  """The trainer's config check runs in --dry-run too (python3 with the project's dependencies on PATH)."""
  env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
  base = ["--gpu", "gb200", "--nodes", "1", "--model", "configs/gb200/llama3_8b_nvfp4.yml", "--dry-run"]
  if args[0] != "--quantization":
    base += ["--quantization", "te_nvfp4"]
  proc = subprocess.run(["bash", str(SUBMIT), *base, *args], cwd=REPO, capture_output=True, text=True, env=env)
  assert proc.returncode == 2 and proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1


def test_help_is_help():
  for script in (SUBMIT, REPO / "scripts" / "slurm" / "train.sbatch"):
    proc = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith(("Submit a training job", "One training job"))
    assert "set -euo" not in proc.stdout and "#" not in proc.stdout  # the header's text, no code, no comment marks
  flags = subprocess.run(
    [sys.executable, str(REPO / "scripts" / "xla_flags.py"), "--help"], capture_output=True, text=True
  )
  assert flags.returncode == 0 and flags.stdout.startswith("The XLA flags for NVIDIA GPUs")
  bad = subprocess.run([sys.executable, str(REPO / "scripts" / "xla_flags.py"), "four"], capture_output=True, text=True)
  assert bad.returncode == 2 and bad.stderr.startswith("error: expected one argument, the job's total GPU count")


def _shim(tmp_path, module):
  """A PYTHONPATH entry under which `module` can't be imported: a login node without it."""
  (tmp_path / module).mkdir()
  (tmp_path / module / "__init__.py").write_text(f"raise ImportError('no {module} on this machine (test)')\n")
  return {
    **os.environ,
    "PYTHONPATH": str(tmp_path),
    "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
  }


@pytest.mark.parametrize(
  "args,message",
  [
    (
      ["--nodes", "20", "--model", "configs/gb300/llama3.1_405b_nvfp4.yml"],
      "--nodes 20: the config's dcn_data_parallelism=-1, dcn_fsdp_parallelism=32 needs a multiple of 32 node(s)",
    ),
    (
      ["--nodes", "32", "--model", "configs/gb300/llama3.1_405b_nvfp4.yml", "--quantization", "te_nvfp5"],
      "quantization='te_nvfp5' is not one of",
    ),
    (
      ["--nodes", "32", "--model", "configs/gb300/llama3.1_405b_nvfp4.yml", "--job-name", "runs/a b"],
      "job name 'runs/a b' must be letters, digits",
    ),
    (
      ["--nodes", "32", "--model", "configs/gb300/llama3.1_405b_nvfp4.yml", "--time", "2h"],
      "--time '2h' is not a Slurm time limit",
    ),
  ],
)
def test_job_is_checked_on_a_login_node_without_jax(tmp_path, args, message):
  """Job name, node count against the preset's dcn product and the recipe: checked with pyyaml alone."""
  base = ["--gpu", "gb300", "--dry-run"] + ([] if "--quantization" in args else ["--quantization", "te_nvfp4"])
  proc = subprocess.run(
    ["bash", str(SUBMIT), *base, *args], cwd=REPO, capture_output=True, text=True, env=_shim(tmp_path, "jax")
  )
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_without_pyyaml_the_recipe_is_still_checked(tmp_path):
  base = ["--gpu", "gb200", "--nodes", "1", "--model", "configs/gb200/llama3_8b_nvfp4.yml", "--dry-run"]
  env = _shim(tmp_path, "yaml")
  bad = subprocess.run(
    ["bash", str(SUBMIT), *base, "--quantization", "te_nvfp5"], cwd=REPO, capture_output=True, text=True, env=env
  )
  assert bad.returncode == 2 and "error: --quantization te_nvfp5 is not a recipe; valid: te_nvfp4" in bad.stderr
  ok = subprocess.run(
    ["bash", str(SUBMIT), *base, "--quantization", "te_nvfp4"], cwd=REPO, capture_output=True, text=True, env=env
  )
  assert ok.returncode == 0 and ok.stdout.startswith("# sbatch command:")
  assert ok.stderr.startswith("warning: config and node count not checked here") and "pip install pyyaml" in ok.stderr


def test_paths_are_read_against_the_callers_directory(tmp_path):
  """From another directory: --model and --output-dir relative to it. The job gets the config by its path in the
  repository (the image holds the same tree); a config outside the repository is mounted; outputs are absolute."""
  (tmp_path / "work").mkdir()
  model = os.path.relpath(REPO / "configs" / "gb200" / "llama3_8b_nvfp4.yml", tmp_path / "work")
  proc = subprocess.run(
    [
      "bash",
      str(SUBMIT),
      "--gpu",
      "gb200",
      "--nodes",
      "1",
      "--model",
      model,
      "--quantization",
      "te_nvfp4",
      "--output-dir",
      "my runs",
      "--dry-run",
    ],
    cwd=tmp_path / "work",
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  sbatch, srun = shlex.split(lines[1]), shlex.split(lines[-1])
  out = tmp_path / "work" / "my runs"
  assert f"--output={out}/maxtext-llama3_8b_nvfp4-te_nvfp4-1n/slurm-%j.out" in sbatch
  script = sbatch.index(str(REPO / "scripts" / "slurm" / "train.sbatch"))
  assert sbatch[script + 1] == "configs/gb200/llama3_8b_nvfp4.yml"
  assert f"--container-mounts={out}:{out}" in srun and f"base_output_directory={out}" in srun
  # A config of one's own, outside the repository: its directory is mounted and the job reads it there.
  (tmp_path / "mine").mkdir()
  shutil.copy(REPO / "configs" / "base.yml", tmp_path / "mine" / "base.yml")
  (tmp_path / "mine" / "8b.yml").write_text("base_config: base.yml\nbase_num_decoder_layers: 2\n")
  proc = subprocess.run(
    [
      "bash",
      str(SUBMIT),
      "--gpu",
      "gb200",
      "--nodes",
      "1",
      "--model",
      "../mine/8b.yml",
      "--quantization",
      "te_nvfp4",
      "--dry-run",
    ],
    cwd=tmp_path / "work",
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 0, proc.stderr
  srun = shlex.split(proc.stdout.splitlines()[-1])
  mine = tmp_path / "mine"
  assert f"--container-mounts={tmp_path}/work/outputs:{tmp_path}/work/outputs,{mine}:{mine}:ro" in srun
  assert srun[srun.index("train.py") + 1] == str(mine / "8b.yml")
