"""benchmarks/nvfp4_blackwell.py: the table's arithmetic (a mode's per-device difference from bf16, scaled to the
model's layers, added to bf16's step on the mesh), the kernels it calls quantization's, the presets' remat policies."""

import pytest

from benchmarks import nvfp4_blackwell as nb
from MaxText.aot import hlo


def _group(ms, nbytes, category="elementwise", quantization=False, pallas=False, memory_ms=None):
  memory_ms = ms if memory_ms is None else memory_ms
  return {
    "ms": ms,
    "memory_ms": memory_ms,
    "bytes": nbytes,
    "category": category,
    "quantization": quantization,
    "pallas": pallas,
  }


def _report(gemm, elementwise, groups, target="gb300-1"):
  total = gemm + elementwise + 5.0
  ms = {"gemm": gemm, "elementwise": elementwise, "attention": 5.0, "collectives": 0.0, "total": total}
  return {"estimate": {"ms_per_step": ms}, "kernel_groups": groups, "backends": {}, "target": target}


def test_a_mode_is_bf16_on_the_mesh_plus_its_per_layer_difference_scaled(capsys):
  base = _report(40.0, 10.0, {"gemm bf16": _group(40.0, 4e9, "gemm"), "fusion add": _group(10.0, 8e9)})
  quant = _report(
    25.0,
    14.0,
    {
      "gemm fp4": _group(25.0, 2e9, "gemm"),
      "fusion add": _group(10.0, 8e9),
      "quantize_nvfp4_16x16_narrow": _group(4.0, 1e9, quantization=True, pallas=True, memory_ms=1.0),
    },
  )
  mesh = _report(400.0, 100.0, {}, target="gb300-128")
  mesh["estimate"]["ms_per_step"]["collectives"] = 20.0
  mesh["estimate"]["ms_per_step"]["total"] = 525.0
  mesh.update(num_devices=128, flops_per_device=1e15)
  record = nb.table("405b", "test", {"bf16": base, "q": quant}, mesh, 2, 126)
  assert record["scale"] == 63
  row = capsys.readouterr().out.strip().splitlines()[-1].split(" | ")
  step = 525.0 + (44.0 - 55.0) * 63  # bf16 on the mesh, plus the 2-layer difference times 126 / 2
  assert row[1] == f"{step:.1f}" and row[2] == f"{525.0 / step:.3f}x"
  assert row[3] == f"{1e15 / step / 1e9:,.0f}"  # model TFLOP/s per GPU
  assert row[4] == f"{400.0 + (25.0 - 40.0) * 63:.1f}"
  # The extra non-GEMM bytes (1 GB x 63) against bf16's HBM bytes (12 GB x 63); the quantizer at its bytes' time.
  assert row[6] == "63.0 (8.3%)"
  assert row[7] == f"{step - 3.0 * 63:.1f}, {525.0 / (step - 3.0 * 63):.3f}x"
  # The weights' quantizer on 1/128 of each weight (per FSDP shard), the rest of the step as it is.
  sharded = step - 4.0 * 63 * (1 - 1 / 128)
  assert row[8] == f"{sharded:.1f}, {525.0 / sharded:.3f}x"
  assert row[9].startswith("quantize_nvfp4_16x16_narrow 252.0")


def _kernel(scope, kind="fusion", category="elementwise", target=""):
  return hlo.Kernel("k", "fusion", target, category, kind, 1, 0.0, 1.0, scope)


def test_what_the_table_counts_as_quantization():
  assert nb.quantizing(_kernel("jit(step_fn)/mlpwo/jit(quantize_operand)/reduce_max"))
  assert nb.quantizing(_kernel("a/quantize_nvfp4_sr_narrow/pallas_call", kind="pallas"))
  assert not nb.quantizing(_kernel("jit(step_fn)/while/body/mlpwo/add"))
  assert nb._label(_kernel("a/quantize_amax_rht/pallas_call", kind="pallas")) == "quantize_amax_rht"  # pylint: disable=protected-access


@pytest.mark.parametrize("setup,policy", [("8b", "minimal"), ("405b", "full")])
def test_the_presets_remat_policies(setup, policy):
  assert nb._remat_policy(nb.SETUPS[setup][1]) == policy  # pylint: disable=protected-access


def test_on_the_mesh_each_mode_is_its_own_compiled_step(capsys):
  """--on-mesh: every figure the mode's own compile on the mesh (no difference method); vs bf16, TFLOP/s from bf16's
  model FLOPs, its own collectives and peak memory."""
  gib = 2**30
  on_mesh = {}
  for mode, gemm, elementwise, collectives, peak in (("bf16", 400.0, 100.0, 30.0, 120), ("q", 150.0, 260.0, 25.0, 110)):
    rep = _report(gemm, elementwise, {}, target="gb200-8")
    rep["estimate"]["ms_per_step"]["collectives"] = collectives
    rep["estimate"]["ms_per_step"]["total"] = gemm + elementwise + 5.0 + collectives
    rep.update(num_devices=8, flops_per_device=1e15, memory={"peak_bytes": peak * gib})
    rep["collectives"] = {"all-gather": 3 * gib, "reduce-scatter": 1.5 * gib}
    on_mesh[mode] = rep
  on_mesh["q"]["kernel_groups"] = {"quantize_nvfp4_sr_narrow": _group(12.5, 1e9, quantization=True, pallas=True)}
  on_mesh["q"]["collectives"] = {"all-gather": 1 * gib, "reduce-scatter": 1.5 * gib}
  on_mesh["q"]["backends"] = {"te_nvfp4": "xla (pallas quantizers)"}
  nb.mesh_table("test", on_mesh)
  lines = capsys.readouterr().out.strip().splitlines()
  assert "gb200-8, 8 GPUs" in lines[0]
  bf16, q = (line.split(" | ") for line in lines[-2:])
  assert bf16[:3] == ["| bf16 (bf16)", "535.0", "1.000x"] and bf16[-1] == "- |"
  assert q[0] == "| q (te_nvfp4: xla (pallas quantizers))"
  assert q[1:4] == ["440.0", f"{535.0 / 440.0:.3f}x", f"{1e15 / 440.0 / 1e9:,.0f}"]
  assert q[4:10] == ["150.0", "290.0 (+155.0)", "25.0", "2.5", "110.0", "quantize_nvfp4_sr_narrow 12.5 |"]
