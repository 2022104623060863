"""The benchmark harnesses on a few steps: parity's analysis, files and resume; throughput's table (memory
included); the attention benchmark's CPU exit; quant_error's table."""

import json
import os

import jax
import numpy as np
import pytest

from benchmarks import attention_bench, modes, parity, quant_error, throughput
from MaxText.model import accounting
from MaxText import config
from tests.conftest import REPO
from tests.trainer.test_train import SMALL


def test_parse_mode(capsys):
  assert modes.parse_mode("bf16") == ("bf16", ["quantization="])
  assert modes.parse_mode("te_nvfp4:disable_rht=true") == (
    "te_nvfp4:disable_rht=true",
    ["quantization=te_nvfp4", "disable_rht=true"],
  )
  with pytest.raises(SystemExit) as e:
    modes.parse_mode("te_nvfp4:disable_rht")
  assert e.value.code == 2 and "is not key=value" in capsys.readouterr().err
  assert modes.peak_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989.2, abs=0.1)  # NVIDIA's data sheet: 989
  assert modes.peak_tflops("NVIDIA GB200") == pytest.approx(2398.0, abs=0.5)  # XLA's spec (data sheet: 2500)
  assert modes.peak_tflops("cpu") is None


def test_records_name_a_repository_config_by_its_path_in_the_repository(tmp_path):
  """A record (JSON, header line) written from any clone names the same config the same way; one outside the
  repository keeps the path it was given."""
  assert modes.recorded_path(REPO / "configs" / "llama3_tiny.yml") == "configs/llama3_tiny.yml"
  assert modes.described(str(REPO / "configs" / "llama3_tiny.yml"), ["steps=3"]) == "configs/llama3_tiny.yml steps=3"
  assert modes.recorded_path(tmp_path / "mine.yml") == str(tmp_path / "mine.yml")
  modes.write_json(tmp_path / "r.json", {}, str(REPO / "configs" / "llama3_8b.yml"), [], [])
  assert json.loads((tmp_path / "r.json").read_text())["config"] == "configs/llama3_8b.yml"


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


@pytest.mark.slow
def test_parity_harness_writes_curves_table_plot_and_resumes(tmp_path, capsys, monkeypatch):
  # From another directory, with a relative --config and --out (read against it), a third directory in between.
  (tmp_path / "work").mkdir()
  monkeypatch.chdir(tmp_path / "work")
  args = [
    "--config",
    os.path.relpath(REPO / "configs" / "llama3_tiny.yml"),
    "--steps",
    "4",
    "--out",
    "..",
    "--modes",
    "bf16,te_fp8_currentscaling",
    *SMALL,
  ]  # any two recipes (FP8 compiles faster than NVFP4)
  assert parity.main(args) == 0
  monkeypatch.chdir(tmp_path)
  args[args.index("--config") + 1] = str(REPO / "configs" / "llama3_tiny.yml")
  args[args.index("--out") + 1] = "."
  curves = json.loads((tmp_path / "curves.json").read_text())
  assert list(curves["losses"]) == ["bf16", "te_fp8_currentscaling"]
  assert curves["seeds"] == [0] and all(len(v["0"]) == 4 for v in curves["losses"].values())
  assert (tmp_path / "parity.png").stat().st_size > 10_000 and "| bf16 |" in (tmp_path / "parity.md").read_text()
  capsys.readouterr()
  assert parity.main(args) == 0  # everything done: nothing retrained
  assert "completed step" not in capsys.readouterr().out


@pytest.mark.slow
def test_throughput_table(tmp_path, capsys):
  assert (
    throughput.main(
      [
        "--config",
        str(REPO / "configs" / "llama3_tiny.yml"),
        "--steps",
        "2",
        "--warmup",
        "1",
        "--profile-steps",
        "1",
        "--modes",
        "bf16,te_fp8_currentscaling",
        "--json",
        str(tmp_path / "t.json"),
        "--out",
        str(tmp_path / "runs"),
        *SMALL,
      ]
    )
    == 0
  )
  out = capsys.readouterr().out
  assert "| mode | median step (s) |" in out and "| te_fp8_currentscaling |" in out
  rows = json.loads((tmp_path / "t.json").read_text())["rows"]
  assert rows[0]["ratio"] == 1.0 and rows[1]["tokens_per_device"] == pytest.approx(8 * 32 / rows[1]["median_s"])
  # The breakdown in aot.hlo's categories, GEMMs by kind (the compiled ops' operand types, which cpu_gemm's auto
  # picks per CPU kind). Each mode's trace is read against its own compiled step: nearly all device time maps to
  # an HLO op (the "other" fallback stays small), and FP8's casts are kernels the BF16 step does not have. Times
  # at this size are noise, so no time is compared across modes.
  assert "| mode | device ms/step |" in out
  for row in rows:
    by_category = {c["category"]: c["ms_per_step"] for c in row["profile"]["categories"]}
    assert by_category["gemm"] > 0 and by_category["elementwise"] > 0
    other = sum(k["share"] for k in row["profile"]["kinds"] if k["kind"] == "elementwise/other")
    assert other < 0.1
  bf16_kernels, fp8_kernels = ({k["name"] for k in r["profile"]["top_kernels"]} for r in rows)
  assert fp8_kernels - bf16_kernels
  assert any(k["kind"].startswith("gemm/") and k["ms_per_step"] > 0 for k in rows[0]["profile"]["kinds"])
  # The trace itself, for TensorBoard's profile plugin and for Perfetto.
  profile_dir = tmp_path / "runs" / "te_fp8_currentscaling" / "tensorboard" / "plugins" / "profile"
  assert list(profile_dir.glob("*/*.xplane.pb")) and list(profile_dir.glob("*/perfetto_trace.json.gz"))
  # Peak memory per mode, from the compiled step: at least the parameters, gradients' worth and AdamW state
  # it takes and returns (f32: 4 + 8 bytes per parameter), and below what the host has.
  assert "| step memory (GiB) | allocator peak (GiB) |" in out and "attention TFLOP/s" in out
  cfg = config.load(REPO / "configs" / "llama3_tiny.yml", SMALL)
  state_bytes = accounting.param_count(cfg) * (4 + 8)
  for row in rows:
    memory = row["step_memory"]
    assert row["peak_memory_bytes"] == memory["peak_bytes"] > state_bytes
    assert memory["argument_bytes"] >= state_bytes and memory["temp_bytes"] > 0
    assert row["peak_memory_bytes"] < 2**30
    assert row["attention_tflops"] is None  # XLA attention: its dots count as GEMMs
  assert rows[0]["peak_memory_bytes"] != rows[1]["peak_memory_bytes"]  # FP8 keeps other residuals


def test_attention_bench_needs_a_gpu_for_cudnn_and_times_the_xla_variants(tmp_path, capsys):
  if jax.default_backend() == "gpu":
    pytest.skip("measures on a GPU: run benchmarks/attention_bench.py")
  assert attention_bench.main(["--config", str(REPO / "configs" / "bench" / "llama3_8b_4layers_seq8192.yml")]) == 0
  assert "need an NVIDIA GPU" in capsys.readouterr().out
  assert (
    attention_bench.main(
      [
        "--config",
        str(REPO / "configs" / "llama3_tiny.yml"),
        "--variants",
        "xla,layer_rope",
        "--iters",
        "2",
        "--json",
        str(tmp_path / "a.json"),
        *SMALL,
      ]
    )
    == 0
  )
  assert "| xla |" in capsys.readouterr().out
  rows = json.loads((tmp_path / "a.json").read_text())["rows"]
  flops = accounting.training_flops_per_device(config.load(REPO / "configs" / "llama3_tiny.yml", SMALL))
  for row in rows:  # one layer's causal attention FLOPs over the measured time
    assert row["tflops"] == pytest.approx(flops.attention_core / 2 / (row["ms"] / 1e3) / 1e12)


def test_user_errors_exit_2_before_anything_trains(tmp_path, capsys):
  tiny = ["--config", str(REPO / "configs" / "llama3_tiny.yml"), *SMALL]
  for main, extra in (
    (throughput.main, ["--modes", ","]),
    (parity.main, ["--modes", ","]),
    (throughput.main, ["--modes", "bf16,te_nvfp5"]),
    (parity.main, ["--modes", "bf16,te_nvfp5"]),
    (parity.main, ["--modes", "bf16,te_nvfp4:disable_rht"]),
    (throughput.main, ["--steps", "0"]),
  ):
    with pytest.raises(SystemExit) as e:
      main(tiny + ["--out", str(tmp_path / "out")] + extra)
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and len(captured.err.strip().splitlines()) == 1, captured.err
    assert "completed step" not in captured.out  # the bad mode is found before the good one trains


def test_parity_never_relabels_runs_from_other_overrides(tmp_path, capsys):
  args = [
    "--config",
    str(REPO / "configs" / "llama3_tiny.yml"),
    "--steps",
    "2",
    "--out",
    str(tmp_path),
    "--modes",
    "bf16",
    *SMALL,
  ]
  assert parity.main(args) == 0
  with pytest.raises(SystemExit) as e:
    parity.main(args + ["learning_rate=1e-2"])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "holds a bf16 run from config" in err and "use another --out or delete" in err


def test_step_memory_without_a_profile_compiles_the_step_here():
  cfg = config.load(REPO / "configs" / "llama3_tiny.yml", SMALL + ["base_num_decoder_layers=1"])
  memory = throughput.step_memory(cfg)
  n = accounting.param_count(cfg)
  # Takes parameters + AdamW state (4 + 8 bytes per f32 parameter) and returns them updated (donated: aliased).
  assert memory["argument_bytes"] >= 12 * n and memory["alias_bytes"] >= 12 * n
  assert (
    memory["peak_bytes"]
    == (memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"] + memory["temp_bytes"])
    > 12 * n
  )
  assert throughput.step_memory(cfg, {"memory": {"peak_bytes": 1}}) == {"peak_bytes": 1}  # the profiled step's


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--steps", "x"], "argument --steps: invalid int value: 'x' (see --help)"),
    (["--stpes", "3"], "unrecognized arguments: --stpes (see --help)"),
    (["--modes"], "argument --modes: expected one argument (see --help)"),
  ],
)
def test_argument_errors_are_the_one_line_form(capsys, argv, message):
  """argparse's usage + error becomes the project's one line, exit 2; an unknown --option is not taken for a
  trainer override."""
  parser = modes.argument_parser("doc", ["bf16"], 10)
  with pytest.raises(SystemExit) as e:
    parser.parse_known_args(argv)
  assert e.value.code == 2 and capsys.readouterr().err == f"error: {parser.prog}: {message}\n"
  assert parser.parse_known_args(["--steps", "3", "seed=-1"])[1] == ["seed=-1"]  # overrides pass through


def test_quant_error_table_gives_each_modes_error_and_mse_change(capsys):
  errors = {
    "te_nvfp4": {("gate", "x"): 0.1, ("gate", "dy"): 0.2},
    "te_nvfp4:nvfp4_4over6=all": {("gate", "x"): 0.09, ("gate", "dy"): 0.2},
  }
  lines = quant_error.markdown(errors).splitlines()
  assert lines[0].startswith("| GEMM | operand | te_nvfp4 rel. err | te_nvfp4:nvfp4_4over6=all rel. err |")
  assert lines[2] == "| gate | x | 0.1000 | 0.0900 | -19.0% |"  # MSE: 0.9**2 - 1
  assert lines[3] == "| gate | dy | 0.2000 | 0.2000 | +0.0% |"
  with pytest.raises(SystemExit) as e:
    quant_error.main(["--steps", "0"])
  assert e.value.code == 2 and capsys.readouterr().err.strip() == "error: --steps must be > 0"
