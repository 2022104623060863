"""python -m MaxText.train_compile's user errors: each one line on stderr and exit code 2, before anything compiles
(what it compiles is tested with jax's CUDA plugin in tests/te/test_aot_step.py)."""

import subprocess
import sys

import pytest

from MaxText import train_compile
from MaxText.aot import devices
from tests.conftest import REPO

TINY = [str(REPO / "configs" / "llama3_tiny.yml"), "dataset_type=synthetic"]


@pytest.mark.parametrize(
  "args, message",
  [
    ([], "error: compile_topology is required: the GPU target to compile for, e.g. compile_topology=h100-8"),
    (["compile_topology=v5p-8"], "error: compile_topology='v5p-8' is not a GPU target this knows; use one of"),
    (["compile_topology=h100-8", "compile_topology_num_slices=0"], "error: command line: compile_topology_num_slices"),
    # The mesh must cover the target's GPUs: checked before compiling.
    (["compile_topology=h100-8", "ici_fsdp_parallelism=4"], "error: the mesh (ici_fsdp_parallelism=4) has 4 devices"),
    (["compile_topology=h100-1", "compile_topology_slices=2"], "error: command line: unknown key"),
  ],
)
def test_mistakes_are_one_line(capsys, args, message):
  assert train_compile.main([*TINY, *args]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(message), err
  assert "\n" not in err


@pytest.mark.skipif(devices.plugin_missing_reason() is None, reason="jax's CUDA plugin is installed here")
def test_without_the_cuda_plugin_says_how_to_get_it(capsys):
  assert train_compile.main([*TINY, "compile_topology=h100-1"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: compiling for a GPU target needs jax's CUDA plugin, which this Python lacks; run it as")
  assert "make train-compile" in err and "\n" not in err


def test_help_from_any_directory(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "MaxText.train_compile", "--help"], cwd=tmp_path, capture_output=True, text=True, check=False
  )
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith("Compile the trainer's own train step for an NVIDIA GPU target")
  assert "compile_topology" in out.stdout


def test_a_report_records_what_was_compiled_not_where_it_was_written():
  argv = ["configs/llama3_8b.yml", "compile_topology=gb200-8", "compile_report=/tmp/r.json", "compile_hlo=/tmp/s.hlo"]
  assert train_compile.recorded_command(argv) == [
    "python",
    "-m",
    "MaxText.train_compile",
    "configs/llama3_8b.yml",
    "compile_topology=gb200-8",
  ]
