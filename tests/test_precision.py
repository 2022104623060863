"""The precision plan: scopes, attention recipe, BF16 edge layers, the BF16 switch, reproducible SR."""

import numpy as np
import pytest

from MaxText import config, precision, train, train_step
from tests.conftest import REPO
from tests.test_train import SMALL


def _cfg(*extra, tmp=None):
  out = [f"base_output_directory={tmp}", "run_name=p"] if tmp else []
  return config.load(REPO / "configs" / "llama3_tiny.yml", SMALL + out + list(extra))


def _recipes(plan):
  return [(a, b, {g: p.recipe.name for g, p in prec.items()}) for a, b, prec in plan.layer_ranges]


def test_default_scope_is_mlp_only_and_all_dense_quantizes_attention_too():
  (a, b, r), = _recipes(precision.plan_from_config(_cfg("quantization=te_nvfp4")))
  assert (a, b) == (0, 2)
  assert [r[g] for g in ("q", "k", "v", "o")] == [""] * 4 and [r[g] for g in ("gate", "up", "down")] == ["te_nvfp4"] * 3
  (_, _, r), = _recipes(precision.plan_from_config(_cfg("quantization=te_nvfp4", "quantization_scope=all_dense")))
  assert set(r.values()) == {"te_nvfp4"}
  (_, _, r), = _recipes(precision.plan_from_config(
      _cfg("quantization=te_nvfp4", "attention_quantization=te_fp8_currentscaling")))
  assert r["q"] == "te_fp8_currentscaling" and r["down"] == "te_nvfp4"


def test_bf16_edge_layers_and_flops_share():
  cfg = _cfg("quantization=te_nvfp4", "base_num_decoder_layers=6", "quantization_bf16_first_layers=1",
             "quantization_bf16_last_layers=2")
  plan = precision.plan_from_config(cfg)
  ranges = _recipes(plan)
  assert [(a, b) for a, b, _ in ranges] == [(0, 1), (1, 4), (4, 6)]
  assert ranges[0][2]["gate"] == "" and ranges[1][2]["gate"] == "te_nvfp4" and ranges[2][2]["down"] == ""
  share = precision.flops_share(plan, cfg)
  assert abs(sum(share.values()) - 1) < 1e-12
  per_gemm, total = precision.gemm_flops(cfg)
  mlp_per_layer = per_gemm["gate"] + per_gemm["up"] + per_gemm["down"]
  assert abs(share["te_nvfp4"] - 3 * mlp_per_layer / total.total) < 1e-12
  assert all(p.recipe.name == "" for _, _, prec in precision.plan_from_config(cfg, high_precision=True).layer_ranges
             for p in prec.values())
  with pytest.raises(config.ConfigError, match="must be between 0"):
    _cfg("quantization_bf16_first_layers=2", "quantization_bf16_last_layers=1")


@pytest.mark.parametrize("scan", [True, False])
def test_edge_layers_train_with_and_without_scan(tmp_path, scan):
  extra = ["quantization=te_nvfp4", "disable_stochastic_rounding=true", "quantization_bf16_last_layers=1",
           "dtype=float32", "steps=3"]
  losses = train.train(_cfg(*extra, f"scan_layers={scan}", tmp=tmp_path / "a"))
  ref = train.train(_cfg(*extra, f"scan_layers={not scan}", tmp=tmp_path / "b"))
  np.testing.assert_allclose(losses, ref, rtol=1e-5)


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


def test_telemetry_is_logged_for_quantized_gemms_and_does_not_change_training(tmp_path):
  import json
  run = lambda period: train.train(_cfg("quantization=te_nvfp4", "steps=3", f"quantization_stats_period={period}",
                                        "gradient_accumulation_steps=2", tmp=tmp_path / str(period)))
  assert run(2) == run(0)
  records = [json.loads(l) for l in (tmp_path / "2" / "p" / "metrics.jsonl").read_text().splitlines()]
  assert [any(k.startswith("quant/") for k in r) for r in records] == [True, False, True]
  keys = {k for k in records[0] if k.startswith("quant/")}
  assert keys == {f"quant/{g}/{r}/{s}" for g in ("gate", "up", "down")
                  for r in ("x", "w", "dy", "w_t", "x_t", "dy_t") for s in ("rel_err", "saturated", "underflow")}
  assert all(0.03 < records[0][f"quant/{g}/x/rel_err"] < 0.2 for g in ("gate", "up", "down"))
  with pytest.raises(config.ConfigError, match="quantization_stats_period=-1 must be >= 0"):
    _cfg("quantization_stats_period=-1")


def test_delayed_scaling_carries_the_amax_history_across_steps(tmp_path):
  import orbax.checkpoint as ocp
  cfg = _cfg("quantization=te_fp8_delayedscaling", "amax_history_len=5", "steps=3", "enable_checkpointing=true",
             "gradient_accumulation_steps=2", tmp=tmp_path)
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
