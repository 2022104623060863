"""python -m MaxText.train_compile tried as a new user would: its outputs (compile_report, compile_hlo) checked before
the minutes of compiling, the environment variables jax and XLA read, targets past any cluster and meshes that don't
fit the target's hosts; each one line (tests/hostile/harness.py). What it compiles, and its outputs written under a
missing parent, are tested with jax's CUDA plugin (tests/te/test_aot_step.py)."""

import os

import pytest

from MaxText import storage
from tests.hostile import harness
from tests.hostile.harness import TINY

H100 = [*TINY, "compile_topology=h100-8"]


def _compile(tmp_path, *args, **environ):
  return harness.run(harness.module("train_compile", *H100, *args), tmp_path, **environ)


@pytest.mark.parametrize(
  "where, needle",
  [
    ("dir", "compile_report={d}/dir is a directory; give a file name, e.g. compile_report={d}/dir/report.json"),
    ("file/report.json", "compile_report={d}/file/report.json can't be written: {d}/file is a file, not a directory"),
  ],
)
def test_a_report_path_that_cannot_be_written_is_refused_before_compiling(tmp_path, where, needle):
  (tmp_path / "dir").mkdir()
  (tmp_path / "file").write_text("")
  proc = _compile(tmp_path, f"compile_report={tmp_path / where}")
  harness.assert_one_line(proc, 2, "error: " + needle.format(d=tmp_path))
  assert "train_compile:" not in proc.stdout  # refused before the compile started
  assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]


def test_an_hlo_path_in_a_directory_not_writable_is_refused_before_compiling(tmp_path):
  (tmp_path / "ro").mkdir()
  os.chmod(tmp_path / "ro", 0o555)
  proc = harness.run(
    harness.module("train_compile", *H100, f"compile_hlo={tmp_path / 'ro' / 'new' / 'step.hlo'}"), tmp_path, no_dac=True
  )
  harness.assert_one_line(proc, 2, f"{tmp_path / 'ro'} is not a writable directory")
  assert not (tmp_path / "ro" / "new").exists()


def test_written_files_are_whole_or_absent(tmp_path, monkeypatch):
  """storage.write_text: a temporary file renamed into place; where the write fails nothing is left (no .tmp)."""
  storage.write_text(tmp_path / "r.json", "old")
  real_replace = os.replace

  def full_disk(src, dst):
    raise OSError(28, "No space left on device", str(dst))

  monkeypatch.setattr(os, "replace", full_disk)
  with pytest.raises(OSError, match="No space left on device"):
    storage.write_text(tmp_path / "r.json", "new")
  monkeypatch.setattr(os, "replace", real_replace)
  assert (tmp_path / "r.json").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
  storage.write_file(tmp_path / "a" / "b" / "r.json", "made")  # its missing parents made
  assert (tmp_path / "a" / "b" / "r.json").read_text() == "made"


@pytest.mark.parametrize(
  "name, value, needle",
  [
    ("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true --xla_no_such=2", "XLA has no flag --xla_no_such=2"),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "abc", "must be a number in (0, 1]"),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "5", "must be a number in (0, 1]"),  # "fits in 395.5 GiB" of an 80 GB H100
  ],
)
def test_environment_variables_are_one_line_naming_them(tmp_path, name, value, needle):
  proc = _compile(tmp_path, **{name: value})
  harness.assert_one_line(proc, 2, f"error: {name}={value!r}")
  assert needle in proc.stderr


def test_a_target_past_any_cluster_is_one_line(tmp_path):
  """XLA's compile-only topology is a list of devices: 10^12 of them fail natively (std::vector's length error)."""
  proc = _compile(tmp_path, "compile_topology_num_slices=2147483647")
  harness.assert_one_line(proc, 2, "error: compile_topology=h100-8 compile_topology_num_slices=2147483647 is ")
  assert "lower compile_topology_num_slices" in proc.stderr


def test_a_dcn_mesh_the_hosts_do_not_fit_names_the_keys(tmp_path):
  """Two H100 hosts for dcn_fsdp_parallelism=4: the keys, the hosts and what to change (not '2 is not divisible by
  4')."""
  proc = _compile(tmp_path, "compile_topology_num_slices=2", "dcn_fsdp_parallelism=4", "dcn_data_parallelism=-1")
  harness.assert_one_line(
    proc,
    2,
    "error: dcn_data_parallelism=-1, dcn_fsdp_parallelism=4 needs a multiple of 4 processes (one per host), and "
    "there are 2: change the dcn_* keys, or use a multiple of 4 hosts (nodes; for train_compile, "
    "compile_topology_num_slices)",
  )


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_signal_before_the_outputs_is_one_line(tmp_path, sig, code):
  proc = _compile(tmp_path, f"compile_report={tmp_path / 'r.json'}", MAXTEXT_SIGNAL_AT=f"start:{sig}")
  harness.assert_one_line(proc, code, prefix=f"{sig}: stopped before compile_report and compile_hlo were written")
  assert not any(tmp_path.iterdir())
