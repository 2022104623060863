"""The benchmark harnesses on a few steps: parity's analysis, files and resume; throughput's table."""

import json

import numpy as np
import pytest

from benchmarks import modes, parity, throughput
from tests.conftest import REPO
from tests.test_train import SMALL


def test_parse_mode(capsys):
  assert modes.parse_mode("bf16") == ("bf16", ["quantization="])
  assert modes.parse_mode("te_nvfp4:disable_rht=true") == ("te_nvfp4:disable_rht=true",
                                                           ["quantization=te_nvfp4", "disable_rht=true"])
  with pytest.raises(SystemExit) as e:
    modes.parse_mode("te_nvfp4:disable_rht")
  assert e.value.code == 2 and "is not key=value" in capsys.readouterr().err
  assert modes.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and modes.peak_tflops("NVIDIA GB200") == 2500.0
  assert modes.peak_tflops("cpu") is None


def test_analysis_on_known_curves():
  steps = np.arange(1, 1001)
  base = 2.0 + 3.0 / np.sqrt(steps)
  worse = 2.0 + 3.0 / np.sqrt(steps / 1.5)  # needs 1.5x the steps for any given loss
  noisy = base + 0.01 * np.sin(steps)
  rows = parity.analyse({"bf16": base.tolist(), "slow": worse.tolist(), "noisy": noisy.tolist()}, converged=0.3)
  assert [r["mode"] for r in rows] == ["bf16", "slow", "noisy"]
  assert rows[0]["gap_nats"] == 0 and rows[0]["tokens_ratio"] == 1.0
  tail = slice(700, 1000)
  assert rows[1]["gap_nats"] == pytest.approx(np.mean(worse[tail] - base[tail]), rel=1e-12)
  assert rows[1]["gap_percent"] == pytest.approx(100 * rows[1]["gap_nats"] / np.mean(base[tail]), rel=1e-12)
  assert rows[1]["tokens_ratio"] is None and rows[1]["tokens_ratio_lower_bound"] == pytest.approx(1.0, abs=0.02)
  assert abs(rows[2]["gap_nats"]) < 1e-3 and rows[0]["noise_band_nats"] == pytest.approx(np.std(base[tail]))
  assert rows[2]["gap_spread_nats"] == pytest.approx(np.std(0.01 * np.sin(steps[tail])))
  shorter = parity.analyse({"bf16": worse.tolist(), "fast": base.tolist()})
  assert shorter[1]["tokens_ratio"] < 0.8  # reaches the baseline's final loss sooner
  assert "| slow |" in parity.markdown(rows, 0.3) and "> 1.00x" in parity.markdown(rows, 0.3)


def test_parity_harness_writes_curves_table_plot_and_resumes(tmp_path, capsys):
  args = ["--config", str(REPO / "configs" / "llama3_tiny.yml"), "--steps", "4", "--out", str(tmp_path),
          "--modes", "bf16,te_nvfp4:disable_stochastic_rounding=true", *SMALL]
  assert parity.main(args) == 0
  curves = json.loads((tmp_path / "curves.json").read_text())
  assert list(curves["losses"]) == ["bf16", "te_nvfp4:disable_stochastic_rounding=true"]
  assert all(len(v) == 4 for v in curves["losses"].values())
  assert (tmp_path / "parity.png").stat().st_size > 10_000 and "| bf16 |" in (tmp_path / "parity.md").read_text()
  capsys.readouterr()
  assert parity.main(args) == 0  # everything done: nothing retrained
  assert "completed step" not in capsys.readouterr().out


def test_throughput_table(tmp_path, capsys):
  assert throughput.main(["--config", str(REPO / "configs" / "llama3_tiny.yml"), "--steps", "2", "--warmup", "1",
                          "--profile-steps", "1", "--modes", "bf16,te_nvfp4", "--json", str(tmp_path / "t.json"),
                          "--out", str(tmp_path / "runs"), *SMALL]) == 0
  out = capsys.readouterr().out
  assert "| mode | median step (s) |" in out and "| te_nvfp4 |" in out
  rows = json.loads((tmp_path / "t.json").read_text())["rows"]
  assert rows[0]["ratio"] == 1.0 and rows[1]["tokens_per_device"] == pytest.approx(8 * 32 / rows[1]["median_s"])
  # The breakdown, by the compiled ops' dtypes: XLA on CPU keeps the forward GEMMs on bf16 operands (it
  # widens bf16-output ones to f32); the quantizers make te_nvfp4's elementwise share the larger.
  assert "| mode | device ms/step |" in out
  bf16, nvfp4 = ({c["category"]: c["ms_per_step"] for c in r["profile"]["categories"]} for r in rows)
  assert bf16["gemm bf16"] > 0 and nvfp4["gemm bf16"] > 0
  assert nvfp4["quantization/elementwise"] > bf16["quantization/elementwise"]
  # The trace itself, for TensorBoard's profile plugin and for Perfetto.
  profile_dir = tmp_path / "runs" / "te_nvfp4" / "tensorboard" / "plugins" / "profile"
  assert list(profile_dir.glob("*/*.xplane.pb")) and list(profile_dir.glob("*/perfetto_trace.json.gz"))


def test_user_errors_exit_2_before_anything_trains(tmp_path, capsys):
  tiny = ["--config", str(REPO / "configs" / "llama3_tiny.yml"), *SMALL]
  for main, extra in ((throughput.main, ["--modes", ","]), (parity.main, ["--modes", ","]),
                      (throughput.main, ["--modes", "bf16,te_nvfp5"]), (parity.main, ["--modes", "bf16,te_nvfp5"]),
                      (parity.main, ["--modes", "bf16,te_nvfp4:disable_rht"]), (throughput.main, ["--steps", "0"])):
    with pytest.raises(SystemExit) as e:
      main(tiny + ["--out", str(tmp_path / "out")] + extra)
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and len(captured.err.strip().splitlines()) == 1, captured.err
    assert "completed step" not in captured.out  # the bad mode is found before the good one trains


def test_parity_never_relabels_runs_from_other_overrides(tmp_path, capsys):
  args = ["--config", str(REPO / "configs" / "llama3_tiny.yml"), "--steps", "2", "--out", str(tmp_path),
          "--modes", "bf16", *SMALL]
  assert parity.main(args) == 0
  with pytest.raises(SystemExit) as e:
    parity.main(args + ["learning_rate=1e-2"])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "holds a bf16 run from config" in err and "use another --out or delete" in err
