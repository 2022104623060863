"""docs/_ext/figures.py: the precision plan picture is the trainer's plan (and README's committed copy is today's),
SVGs are reproducible, and the results tables recomputed from the committed JSONs are the harnesses' own."""

import json

import pytest

import figures
from benchmarks import gpu_bench
from tests.conftest import REPO


def test_plan_grid_is_the_printed_plan():
  rows, head, shares, cfg = figures.plan_grid(figures.PLAN_CONFIG)
  assert [g for g, _ in rows] == ["q", "k", "v", "o", "attention core", "gate", "up", "down"]
  by_gemm = dict(rows)
  assert all(len(r) == 32 for r in by_gemm.values())
  assert set(by_gemm["gate"] + by_gemm["up"] + by_gemm["down"]) == {"te_nvfp4"}
  assert set(by_gemm["q"] + by_gemm["o"] + by_gemm["attention core"]) == {"bf16"}
  assert head == "bf16"
  # The dry run prints "share of training FLOPs: te_nvfp4 65.7%, bf16 34.3%" for this preset.
  assert round(shares["te_nvfp4"], 3) == 0.657 and round(shares["bf16"], 3) == 0.343


def test_plan_grid_shows_bf16_edge_layers():
  rows, _, shares, _ = figures.plan_grid(
    figures.PLAN_CONFIG, ["quantization_bf16_first_layers=1", "quantization_bf16_last_layers=2"]
  )
  gate = dict(rows)["gate"]
  assert gate[0] == "bf16" and gate[1:30] == ["te_nvfp4"] * 29 and gate[30:] == ["bf16", "bf16"]
  assert shares["te_nvfp4"] == pytest.approx(0.657 * 29 / 32, abs=2e-3)


def test_readme_picture_is_todays_plan_and_reproducible(tmp_path):
  figures.precision_plan_figure(tmp_path / "a.svg")
  figures.precision_plan_figure(tmp_path / "b.svg")
  drawn = (tmp_path / "a.svg").read_bytes()
  assert drawn == (tmp_path / "b.svg").read_bytes()
  assert drawn == figures.README_FIGURE.read_bytes(), "run: python docs/_ext/figures.py --readme-figure"
  assert b"te_nvfp4 65.7%" in drawn  # text kept as text


@pytest.mark.parametrize("name", figures.PARITY_RUNS)
def test_parity_tables_are_the_harness_tables(name, tmp_path):
  text = figures.parity_section(REPO / "benchmarks" / name / "curves.json", tmp_path / f"{name}.svg")
  committed = (REPO / "benchmarks" / name / "parity.md").read_text(encoding="utf-8").split("\n\n", 1)[1]
  assert text.split(".svg)\n\n", 1)[1] == committed
  assert (tmp_path / f"{name}.svg").stat().st_size > 10_000
  record = json.loads((REPO / "benchmarks" / name / "curves.json").read_text(encoding="utf-8"))
  assert f"commit {record['machine']['commit']}" in text


def test_throughput_table_is_the_json(tmp_path):
  text = figures.throughput_section(REPO / "benchmarks" / "throughput_tiny_cpu.json", tmp_path / "t.svg")
  record = json.loads((REPO / "benchmarks" / "throughput_tiny_cpu.json").read_text(encoding="utf-8"))
  for row in record["rows"]:
    assert f"| {row['mode']} | {row['median_s']:.4f} | {row['tflops_per_device']:.3f} |" in text
  assert "commit c58e977" in text and (tmp_path / "t.svg").exists()


def _part(tmp_path, name, **fields):
  record = {
    "schema": 1,
    "part": "quantize",
    "status": "ok",
    "error": None,
    "smoke": False,
    "command": "scripts/gpu_bench.sh quantize",
    "started": "2026-11-27T12:00:00Z",
    "seconds": 60.0,
    "machine": {"commit": "abc1234", "device": "1x NVIDIA H100 80GB HBM3 (gpu)", "host": "h", "jax": "0.11.2"},
    "metrics": [
      {"name": "time", "subject": "nvfp4 1x16 (x) [pallas]", "value": 0.497, "unit": "ms", "target": None, "met": None},
      {
        "name": "share of copy bandwidth",
        "subject": "nvfp4 1x16 (x) [pallas]",
        "value": 50.19,
        "unit": "%",
        "target": ">= 60",
        "met": False,
      },
    ],
    "detail": {},
    **fields,
  }
  path = tmp_path / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(record), encoding="utf-8")
  return record


def test_gpu_bench_parts_committed_are_shown_smoke_runs_are_not(tmp_path):
  real = _part(tmp_path, "h100/quantize.json")
  _part(tmp_path, "h100/smoke.json", smoke=True)
  _part(tmp_path, "cpu-smoke/quantize.json")
  (tmp_path / "other.json").write_text("[1, 2]", encoding="utf-8")
  records = figures.gpu_bench_records(tmp_path)
  assert [p.relative_to(tmp_path).as_posix() for p, _ in records] == ["h100/quantize.json"]
  text = figures.gpu_bench_section(records[0][0], records[0][1], tmp_path / "q.svg", root=tmp_path)
  assert gpu_bench.markdown(real) in text
  assert "| share of copy bandwidth | nvfp4 1x16 (x) [pallas] | 50.19 | % | >= 60 | NO |" in text
  assert (tmp_path / "q.svg").exists()
