"""The precision plan: scopes, attention recipe, BF16 edge layers, the BF16 switch, reproducible SR."""

import jax
import numpy as np
import pytest

from MaxText import config, precision, train
from MaxText.model import accounting
from MaxText.quantization.backends import Choice
from MaxText.quantization.kernels import quantizer_impl
from MaxText.trainer import train_step
from tests.conftest import REPO
from tests.trainer.test_train import SMALL


def _cfg(*extra, tmp=None):
  out = [f"base_output_directory={tmp}", "run_name=p"] if tmp else []
  return config.load(REPO / "configs" / "llama3_tiny.yml", SMALL + out + list(extra))


def _recipes(plan):
  return [(a, b, {g: p.recipe.name for g, p in prec.items()}) for a, b, prec in plan.layer_ranges]


def test_default_scope_is_mlp_only_and_all_dense_quantizes_attention_too():
  ((a, b, r),) = _recipes(precision.plan_from_config(_cfg("quantization=te_nvfp4")))
  assert (a, b) == (0, 2)
  assert [r[g] for g in ("q", "k", "v", "o")] == [""] * 4 and [r[g] for g in ("gate", "up", "down")] == ["te_nvfp4"] * 3
  ((_, _, r),) = _recipes(precision.plan_from_config(_cfg("quantization=te_nvfp4", "quantization_scope=all_dense")))
  assert set(r.values()) == {"te_nvfp4"}
  ((_, _, r),) = _recipes(
    precision.plan_from_config(_cfg("quantization=te_nvfp4", "attention_quantization=te_fp8_currentscaling"))
  )
  assert r["q"] == "te_fp8_currentscaling" and r["down"] == "te_nvfp4"


def test_the_attention_projections_take_their_own_backend_request():
  """attention_quantization_backend: the seeds' recipe on our NVFP4 (xla) beside FP8 projections (auto); unset, the
  projections take quantization_backend's request."""
  seeds = ("quantization=te_nvfp4", "attention_quantization=te_fp8_currentscaling", "quantization_backend=xla")
  ((_, _, prec),) = precision.plan_from_config(_cfg(*seeds, "attention_quantization_backend=auto")).layer_ranges
  assert {g: prec[g].backend for g in ("q", "o", "gate", "down")} == {
    "q": Choice.AUTO,
    "o": Choice.AUTO,
    "gate": Choice.XLA,
    "down": Choice.XLA,
  }
  ((_, _, prec),) = precision.plan_from_config(_cfg(*seeds)).layer_ranges
  assert {prec[g].backend for g in ("q", "k", "v", "o", "gate", "up", "down")} == {Choice.XLA}
  with pytest.raises(config.ConfigError, match="attention_quantization_backend"):
    _cfg("attention_quantization_backend=cudnn")


def test_bf16_edge_layers_and_flops_share():
  cfg = _cfg(
    "quantization=te_nvfp4",
    "base_num_decoder_layers=6",
    "quantization_bf16_first_layers=1",
    "quantization_bf16_last_layers=2",
  )
  plan = precision.plan_from_config(cfg)
  ranges = _recipes(plan)
  assert [(a, b) for a, b, _ in ranges] == [(0, 1), (1, 4), (4, 6)]
  assert ranges[0][2]["gate"] == "" and ranges[1][2]["gate"] == "te_nvfp4" and ranges[2][2]["down"] == ""
  share = precision.flops_share(plan, accounting.gemm_flops(cfg))
  assert abs(sum(share.values()) - 1) < 1e-12
  per_gemm, total = accounting.gemm_flops(cfg)
  mlp_per_layer = per_gemm["gate"] + per_gemm["up"] + per_gemm["down"]
  assert abs(share["te_nvfp4"] - 3 * mlp_per_layer / total.total) < 1e-12
  assert all(
    p.recipe.name == ""
    for _, _, prec in precision.plan_from_config(cfg, high_precision=True).layer_ranges
    for p in prec.values()
  )
  with pytest.raises(config.ConfigError, match="must be between 0"):
    _cfg("quantization_bf16_first_layers=2", "quantization_bf16_last_layers=1")


@pytest.mark.slow
@jax.default_matmul_precision("highest")  # f32 means f32 (a GPU's default for f32 dots is TF32)
def test_edge_layers_train_with_and_without_scan(tmp_path):
  """The BF16 last layer as its own scan equals the unscanned layers (any quantized recipe splits the layers: FP8's
  step compiles in half NVFP4's time)."""
  extra = ["quantization=te_fp8_currentscaling", "quantization_bf16_last_layers=1", "dtype=float32", "steps=3"]
  losses = train.train(_cfg(*extra, "scan_layers=true", tmp=tmp_path / "scan"))
  ref = train.train(_cfg(*extra, "scan_layers=false", tmp=tmp_path / "loop"))
  np.testing.assert_allclose(losses, ref, rtol=1e-5)


@pytest.mark.slow
def test_stochastic_rounding_is_reproducible_from_the_seed(tmp_path):
  run = lambda name: train.train(_cfg("quantization=te_nvfp4", "steps=3", tmp=tmp_path / name))
  a, b = run("a"), run("b")
  assert a == b
  bf16 = train.train(_cfg("steps=3", tmp=tmp_path / "bf16"))
  assert a[0] == pytest.approx(bf16[0], abs=0.05) and a != bf16


def test_high_precision_switch_compiles_two_steps_only(tmp_path, monkeypatch):
  built = []
  real = train_step.make_train_step
  monkeypatch.setattr(train_step, "make_train_step", lambda *a, **k: built.append(a[2]) or real(*a, **k))
  losses = train.train(_cfg("quantization=te_nvfp4", "steps=5", "high_precision_from_step=2", tmp=tmp_path))
  assert len(losses) == 5 and len(built) == 2
  assert built[0].quantized and not built[1].quantized


def test_dry_run_prints_the_plan(capsys):
  train.train(_cfg("quantization=te_nvfp4", "dry_run=true"))
  out = capsys.readouterr().out
  assert "gate                       0-1      te_nvfp4                 emulated" in out
  assert "q                          0-1      bf16                     bf16" in out
  assert "share of training FLOPs: te_nvfp4" in out


@pytest.mark.heavy
@pytest.mark.parametrize(
  "recipe, x_err",
  [
    # E4M3's 3 mantissa bits: ~3.6% RMS on Gaussian-like values
    pytest.param("te_fp8_currentscaling", (0.01, 0.08), marks=pytest.mark.slow),
    pytest.param("te_nvfp4", (0.03, 0.2), marks=pytest.mark.slow),  # E2M1: ~10%; its stats step compiles for ~40 s
  ],
)
def test_telemetry_is_logged_for_quantized_gemms_and_does_not_change_training(tmp_path, recipe, x_err):
  import json

  run = lambda period: train.train(
    _cfg(
      f"quantization={recipe}",
      "disable_stochastic_rounding=true",
      "steps=3",
      f"quantization_stats_period={period}",
      "gradient_accumulation_steps=2",
      tmp=tmp_path / str(period),
    )
  )
  assert run(2) == run(0)
  records = [json.loads(l) for l in (tmp_path / "2" / "p" / "metrics.jsonl").read_text().splitlines()]
  assert [any(k.startswith("quant/") for k in r) for r in records] == [True, False, True]
  keys = {k for k in records[0] if k.startswith("quant/")}
  assert keys == {
    f"quant/{g}/{r}/{s}"
    for g in ("gate", "up", "down")
    for r in ("x", "w", "dy", "w_t", "x_t", "dy_t")
    for s in ("rel_err", "saturated", "underflow")
  }
  assert all(x_err[0] < records[0][f"quant/{g}/x/rel_err"] < x_err[1] for g in ("gate", "up", "down"))
  with pytest.raises(config.ConfigError, match="quantization_stats_period=-1 must be >= 0"):
    _cfg("quantization_stats_period=-1")


@pytest.mark.slow
def test_delayed_scaling_carries_the_amax_history_across_steps(tmp_path):
  import orbax.checkpoint as ocp

  cfg = _cfg(
    "quantization=te_fp8_delayedscaling",
    "amax_history_len=5",
    "steps=3",
    "enable_checkpointing=true",
    "gradient_accumulation_steps=2",
    tmp=tmp_path,
  )
  losses = train.train(cfg)
  assert len(losses) == 3 and all(np.isfinite(losses))
  state = ocp.StandardCheckpointer().restore(tmp_path / "p" / "checkpoints" / "3" / "state")
  layers = state["amax_history"]["layers"]
  gate = np.asarray(layers["mlp"]["gate"]["amax_history"]["value"])  # [layers, (x, w, dy), history]
  assert gate.shape == (2, 3, 5)
  # 3 steps x 2 micro-batches pushed 6 amaxes into a history of 5: all filled, newest first, all positive.
  assert (gate > 0).all()
  weight_amax = gate[:, 1, :]
  assert np.all(np.abs(weight_amax[:, 0] - weight_amax[:, 1]) < 0.05 * weight_amax[:, 0])  # weights move slowly
  query = np.asarray(layers["attention"]["query"]["amax_history"]["value"])
  assert (query == 0).all()  # attention stays BF16 (scope mlp): its history is never written


# -- NVFP4 options: Four Over Six and backward_override -------------------------------------------------------------


def test_nvfp4_option_keys_are_validated_in_one_line():
  with pytest.raises(
    config.ConfigError,
    match=r"nvfp4_4over6='most' is not one of: none, weights, activations, "
    r"gradients, all",
  ):
    _cfg("quantization=te_nvfp4", "nvfp4_4over6=most")
  with pytest.raises(
    config.ConfigError,
    match=r"nvfp4_backward_override=dequantized applies to the NVFP4 recipes "
    r"only, but quantization='te_fp8_currentscaling'",
  ):
    _cfg("quantization=te_fp8_currentscaling", "nvfp4_backward_override=dequantized")
  with pytest.raises(config.ConfigError, match="nvfp4_4over6_err_mode=mae applies to the NVFP4 recipes only"):
    _cfg("nvfp4_4over6_err_mode=mae")
  with pytest.raises(config.ConfigError, match="nvfp4_4over6=gradients does nothing with nvfp4_backward_override"):
    _cfg("quantization=te_nvfp4", "nvfp4_4over6=gradients", "nvfp4_backward_override=high_precision")
  # An NVFP4 recipe on the attention projections is enough.
  _cfg("attention_quantization=te_nvfp4", "nvfp4_4over6=weights")


def test_plan_shows_the_nvfp4_options_and_the_flops_they_leave_in_bf16(monkeypatch):
  cfg = _cfg(
    "quantization=te_nvfp4", "nvfp4_4over6=all", "nvfp4_4over6_err_mode=mae", "nvfp4_backward_override=dequantized"
  )
  plan = precision.plan_from_config(cfg)
  recipe = plan.layer_ranges[0][2]["gate"].recipe
  assert (recipe.nvfp4_4over6, recipe.nvfp4_4over6_err_mode, recipe.backward_override) == ("all", "mae", "dequantized")
  text = precision.format_plan(plan, cfg, accounting.gemm_flops(cfg))
  assert (
    "te_nvfp4: Four Over Six (mae) on x, w: each block's max to 6 or 4, the smaller error kept; global scale "
    "6*256/amax; backward_override=dequantized: dgrad and wgrad in the compute dtype on the forward's quantized "
    "x and w, dequantized, and unquantized dy"
  ) in text
  per_gemm, total = accounting.gemm_flops(cfg)
  fprop_only = sum(per_gemm[g] for g in ("gate", "up", "down")) * cfg.base_num_decoder_layers / 3
  share = precision.flops_share(plan, (per_gemm, total))
  assert share["te_nvfp4"] == pytest.approx(fprop_only / total.total, rel=1e-12)
  # The Pallas kernels implement 4/6: its operands take them too.
  monkeypatch.setattr(quantizer_impl, "resolve", lambda kernels: quantizer_impl.Kernels.PALLAS)
  assert {q for g, _, _, b, q in precision.rows(plan, cfg) if g == "gate"} == {"pallas"}
  plain = precision.plan_from_config(_cfg("quantization=te_nvfp4"))
  assert {q for g, _, _, b, q in precision.rows(plain, cfg) if g == "gate"} == {"pallas"}


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_backward_override_step_quantizes_fprop_only_and_runs_bf16_gemms(override):
  from tests.trainer.test_train_step import _count_calls, _step_and_args  # pylint: disable=import-outside-toplevel
  from tests import stablehlo  # pylint: disable=import-outside-toplevel

  for remat in ("none", "minimal_with_quantization"):
    cfg = _cfg(
      "quantization=te_nvfp4",
      f"nvfp4_backward_override={override}",
      "scan_layers=false",
      "gradient_accumulation_steps=1",
      f"remat_policy={remat}",
    )
    step, args = _step_and_args(cfg)
    assert _count_calls(jax.make_jaxpr(step)(*args).jaxpr, "quantize_for_gemm") == 2 * 3 * 2  # x, w per MLP GEMM
  by_dtype = stablehlo.dot_flops_by_dtype(step.trace(*args).lower(lowering_platforms=("cuda",)).as_text())
  assert set(by_dtype) == {("bf16", "bf16")}, by_dtype


@pytest.mark.slow
def test_four_over_six_trains_from_the_command_line_and_te_refuses_it(tmp_path, capsys):
  base = [
    str(REPO / "configs" / "llama3_tiny.yml"),
    *SMALL,
    "quantization=te_nvfp4",
    "nvfp4_4over6=all",
    f"base_output_directory={tmp_path}",
    "run_name=fos",
  ]
  assert train.main(base + ["steps=2"]) == 0
  losses = [float(l.rsplit("loss: ", 1)[1]) for l in capsys.readouterr().out.splitlines() if "completed step" in l]
  assert len(losses) == 2 and all(np.isfinite(losses))
  assert train.main(base + ["quantization_backend=te", "dry_run=true", "run_name=te"]) == 2
  err = capsys.readouterr().err.strip()
  assert (
    err.startswith(
      "error: quantization_backend=te: te_nvfp4: nvfp4_4over6=all: Transformer Engine's JAX "
      "bindings (2.20) read neither nvfp4_4over6 nor backward_override"
    )
    and "\n" not in err
  )
