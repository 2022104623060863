"""Quantized GEMMs partitioned over 8 GPUs, compiled for a B200 x 8 target (compile-only devices, .venv-te): every
backend's te_nvfp4 step moves no more collective data than the bf16 step, whose gradients are reduce-scattered;
Transformer Engine's GEMMs compile under its MeshResource (runtime/sharding.use_mesh) and gather FP4 weights. The
presets at scale: Llama 3 8B on 8 GB200s and Llama 3.1 405B on 128 GB300s, te_nvfp4 against bf16 and dry_run's
estimate."""

import pytest

from MaxText import config
from MaxText.aot import targets
from MaxText.trainer import aot_step
from tests.conftest import REPO

pytestmark = pytest.mark.te

TINY = REPO / "configs" / "llama3_tiny.yml"
MLP = ("gate", "up", "down")


def _preset_report(preset, target, slices, *overrides):
  cfg = config.load(REPO / "configs" / preset, [f"compile_topology={target}", *overrides])
  return aot_step.report(aot_step.compile_for_target(cfg, targets.parse(target, slices)), cfg)


def _report(*overrides):
  cfg = config.load(TINY, ["dataset_type=synthetic", "per_device_batch_size=2", *overrides])
  return aot_step.report(aot_step.compile_for_target(cfg, targets.parse("b200-8")), cfg)


@pytest.mark.heavy
def test_b200_8_te_nvfp4_moves_no_more_than_bf16_on_every_backend():
  bf16 = _report()
  # FSDP's gradients: reduce-scattered, not all-reduced (the all-reduces left are scalars: the loss, the norm).
  assert bf16["collectives"]["reduce-scatter"] > 0 and bf16["collectives"].get("all-reduce", 0) < 1e5
  total = lambda report: sum(report["collectives"].values())
  for backend, gemm_kind in (("te", "te"), ("xla", "fp4_block_scaled"), ("emulate", "bf16")):
    report = _report("quantization=te_nvfp4", f"quantization_backend={backend}")
    assert all(set(report["gemm_sites"][g]) == {gemm_kind} for g in MLP), (backend, report["gemm_sites"])
    assert total(report) <= 1.2 * total(bf16), (backend, report["collectives"], bf16["collectives"])
    # the weights gathered quantized (TE, xla: FP4 and E4M3 scales; emulated: bf16 block-scaled values), never more
    assert report["collectives"]["all-gather"] <= bf16["collectives"]["all-gather"], backend
    if backend == "emulate":  # the Pallas quantizers run on each device's shard
      assert report["kernels"].get("elementwise/pallas", 0) > 0


@pytest.mark.heavy
@pytest.mark.parametrize(
  "preset, target, slices, overrides",
  [
    ("gb200/llama3_8b_nvfp4.yml", "gb200-8", 1, ["ici_fsdp_parallelism=8", "dcn_data_parallelism=1"]),
    ("gb300/llama3.1_405b_nvfp4.yml", "gb300-64", 2, []),
  ],
)
def test_presets_te_nvfp4_peak_near_bf16_fits_and_dry_run_agrees(preset, target, slices, overrides):
  """Compiled for the target (XLA's memory analysis, per GPU): te_nvfp4 on Transformer Engine peaks within 1.1x of
  bf16 (8B on gb200-8: 111.4 vs 112.9 GiB; 405B on 128 GB300s: 99.2 vs 103.3), fits the GPU, and dry_run's analytic
  estimate is within 15% of the compiled peak (118.1 GiB, +6%; 102.7 GiB, +4%)."""
  nvfp4 = _preset_report(preset, target, slices, *overrides)
  bf16 = _preset_report(preset, target, slices, *overrides, "quantization=")
  assert nvfp4["backends"] == {"te_nvfp4": "te"} and all(set(nvfp4["gemm_sites"][g]) == {"te"} for g in MLP)
  assert nvfp4["mesh"]["fsdp"] == nvfp4["num_devices"] == (8 if target == "gb200-8" else 128)
  peak = {"te_nvfp4": nvfp4["memory"]["peak_bytes"], "bf16": bf16["memory"]["peak_bytes"]}
  assert peak["te_nvfp4"] <= 1.1 * peak["bf16"], peak
  assert nvfp4["fits"] and bf16["fits"]
  for report in (nvfp4, bf16):
    assert report["analytic_memory_bytes"] == pytest.approx(report["memory"]["peak_bytes"], rel=0.15)
