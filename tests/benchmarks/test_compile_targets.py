"""benchmarks/compile_targets.py: the published setups' table -- ours beside the published figure, and the NVFP4 /
FP8 ratio each scenario gives (its point and its range's ends) beside the published ratio."""

import pytest

from benchmarks import compile_targets as ct


def _report(total, low, high, flops=1e15, fits=True):
  tflops = lambda ms: flops / (ms / 1e3) / 1e12
  estimate = {
    "ms_per_step": {"total": total, "collectives_exposed": 10.0, "collectives_hidden": 90.0},
    "range_ms": {"low": low, "high": high},
    "model_tflops_per_s_per_device": tflops(total),
    "model_tflops_range": [tflops(high), tflops(low)],
  }
  memory = {"peak_bytes": 100 * 2**30, "available_bytes": 138 * 2**30}
  return {"estimate": estimate, "memory": memory, "fits": fits, "target": "gb200-4", "num_devices": 4}


def _record(mode, report, candidate="preset"):
  return {"model": "Llama 3 8B", "gpu": "gb200", "mode": mode, "candidate": candidate, "report": report}


def test_ours_beside_the_published_and_the_ratio_each_scenario_gives(capsys):
  records = [_record("fp8", _report(1000.0, 900.0, 1200.0)), _record("nvfp4", _report(800.0, 700.0, 1000.0))]
  ct.setup_table(records)
  ct.ratio_table(records)
  out = capsys.readouterr().out.splitlines()
  fp8 = next(line for line in out if line.startswith("| Llama 3 8B | gb200-4 | fp8 |")).split(" | ")
  assert fp8[5] == "1000 (900 - 1200)" and fp8[6] == "10 / 90" and fp8[8] == "1,497"
  assert fp8[7] == "1,000 (833 - 1,111)" and fp8[9] == f"{1000 / 1497:.2f} |"
  ratio = next(line for line in out if line.startswith("| Llama 3 8B, 4 GB200 |")).split(" | ")
  assert ratio[1] == "1,000 (833 - 1,111) / 1,497" and ratio[2] == "1,250 (1,000 - 1,429) / 2,017"
  # point 1000 / 800; the range's ends pair each scenario's own steps: 900 / 700 and 1200 / 1000.
  assert ratio[3] == f"{1000 / 800:.3f} ({1200 / 1000:.3f} - {900 / 700:.3f})"
  assert ratio[4] == f"{2017 / 1497:.3f}" and ratio[5] == f"{1.25 / (2017 / 1497):.3f}" == "0.928"
  assert ratio[6] == "yes |"  # 0.928 is within 10% of the published ratio


def test_every_published_setup_has_its_presets_and_a_source():
  assert {(m, g) for m, g, *_ in ct.SETUPS} == set(ct.PUBLISHED)
  assert "NVFP4 on NVIDIA Blackwell" in ct.SOURCE
  rows = ct.rows(candidates=True)
  assert sum(1 for r in rows if r[3] == "preset") == 8 and all(r[2] == "nvfp4" for r in rows if r[3] != "preset")
  assert [r[4] for r in ct.rows(only="405B gb300 fp8")] == ["configs/gb300/llama3.1_405b_fp8.yml"]
  assert ct.PUBLISHED[("Llama 3.1 405B", "gb300")][1] / ct.PUBLISHED[("Llama 3.1 405B", "gb300")][0] == pytest.approx(
    1.73, abs=0.01
  )
