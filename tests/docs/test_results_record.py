"""benchmarks/RESULTS.md against the committed data it records: each section's tables are the ones its harness
prints (or the docs site draws) from the committed JSON, row for row, and the section names that JSON's commit."""

import json
import re

import pytest

import figures
from benchmarks import compile_targets, nvfp4_blackwell, roofline_calibration
from tests.conftest import REPO

RESULTS = REPO / "benchmarks" / "RESULTS.md"
TRAIN_COMPILE = REPO / "benchmarks" / "results" / "train_compile"


def _sections():
  return RESULTS.read_text(encoding="utf-8").split("\n## ")


def _section(title):
  return next(s for s in _sections() if s.startswith(title))


def _data_section(directory):
  """The section whose data is `benchmarks/<directory>/`."""
  return next(s for s in _sections() if f"**Data**: `benchmarks/{directory}/`" in s)


def _rows(text):
  return [line for line in text.splitlines() if line.startswith("|")]


def _commit_line(section):
  return next(line for line in section.splitlines() if line.startswith("- **Commit**: "))


def _printed(capsys, main, data):
  assert main(["--from-json", str(data)]) == 0
  return _rows(capsys.readouterr().out)


def _parity_records():
  """The parity directories RESULTS.md's sections name as their data (those holding a parity.md)."""
  named = [m.group(1) for s in _sections() for m in [re.search(r"\*\*Data\*\*: `benchmarks/(\w+)/`", s)] if m]
  return [d for d in named if (REPO / "benchmarks" / d / "parity.md").exists()]


def test_the_record_has_its_parity_sections():
  assert set(figures.PARITY_RUNS) < set(_parity_records())  # those the docs site draws, and make compare's


@pytest.mark.parametrize("name", _parity_records())
def test_a_parity_section_shows_its_parity_md_verbatim(name):
  section = _data_section(name)
  written = (REPO / "benchmarks" / name / "parity.md").read_text(encoding="utf-8")
  assert _rows(section) == _rows(written)
  assert re.search(r"commit (\w+)", written.splitlines()[0]).group(1) in _commit_line(section)


def test_the_throughput_section_is_the_json(tmp_path):
  data = REPO / "benchmarks" / "throughput_tiny_cpu.json"
  section = next(s for s in _sections() if "throughput_tiny_cpu.json" in s)
  assert _rows(section) == _rows(figures.throughput_section(data, tmp_path / "t.svg"))
  assert json.loads(data.read_text(encoding="utf-8"))["machine"]["commit"] in _commit_line(section)


def test_the_gb200_8_section_shows_the_tables_of_the_committed_json(capsys):
  """Every row of the section is one `nvfp4_blackwell.py --from-json` prints (the kernel table only its rows of 1 ms
  or more), its step table whole."""
  data = TRAIN_COMPILE / "nvfp4_gb200_8b_step.json"
  printed = _printed(capsys, nvfp4_blackwell.main, data)
  section = _section("Llama 3 8B on 8 GB200s")
  rows = [row for row in _rows(section) if not row.startswith("| mode ")]
  assert len(rows) >= 10 and not [row for row in rows if row not in printed]
  step_rows = [row for row in printed if " | step ms (range) |" not in row][:5]
  assert all(row in rows for row in step_rows)
  assert f"- **Commit**: {json.loads(data.read_text(encoding='utf-8'))['commit']}." in section


def test_the_published_setups_section_shows_the_tables_of_the_committed_json(capsys):
  data = TRAIN_COMPILE / "published_setups.json"
  printed = _printed(capsys, compile_targets.main, data)
  section = _section("The published NVFP4 setups")
  assert len(printed) >= 19 and _rows(section) == printed
  assert f"- **Commit**: {json.loads(data.read_text(encoding='utf-8'))['commit']}." in section


def test_the_predictions_section_shows_the_committed_predictions():
  """The table is `roofline_calibration.py --predictions-table`'s, and the section names the commit the JSONs were
  written at."""
  section = _section("Predictions for `make gpu-bench`")
  assert _rows(section) == roofline_calibration.predictions_table()
  predictions = roofline_calibration.PREDICTIONS
  commits = {
    json.loads((predictions / f"{g}.json").read_text(encoding="utf-8"))["commit"]
    for g in roofline_calibration.TABLE_GPUS
  }
  assert len(commits) == 1 and f"- **Commit**: {commits.pop()}." in section
  assert "--predictions-table" in section
