"""Quantized GEMMs partitioned over 8 GPUs, compiled for a B200 x 8 target (compile-only devices, .venv-te): every
backend's te_nvfp4 step moves no more collective data than the bf16 step, whose gradients are reduce-scattered;
Transformer Engine's GEMMs compile under its MeshResource (runtime/sharding.use_mesh) and gather FP4 weights."""

import pytest

from MaxText import config
from MaxText.aot import targets
from MaxText.trainer import aot_step
from tests.conftest import REPO

pytestmark = pytest.mark.te

TINY = REPO / "configs" / "llama3_tiny.yml"
MLP = ("gate", "up", "down")


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
