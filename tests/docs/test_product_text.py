"""The product speaks of itself: no line of the pages, code, configs, benchmarks or results names an issue number,
the machines or sandbox its work was done on, or an absolute path of such a machine; no committed symlink leaves the
repository."""

import os
import pathlib
import re
import subprocess

import pytest

from tests.conftest import REPO

CHECKED = ("README.md", "docs", "MaxText", "configs", "benchmarks", "scripts", "Dockerfile", "Makefile", ".ci")
TEXT_SUFFIXES = {"", ".md", ".py", ".yml", ".yaml", ".json", ".jsonl", ".txt", ".sh", ".sbatch", ".toml", ".c", ".cfg"}
# What a line may not say, with why: development history and where the work was done are not the product.
FORBIDDEN = {
  "an issue number": re.compile(r"\bissues? #?\d+|(?<![\w&/#])#\d{2,3}\b", re.I),
  "the lending of a machine": re.compile(r"\bwas lent\b|\bdevice machine\b", re.I),
  "the development sandbox": re.compile(r"\.\./shared\b|/work/(main|wt|shared)\b"),
  "an absolute path of a machine": re.compile(r"(?<![\w.])/(?:root|home/[a-z_][\w-]*)/|(?<![\w.:/])/work/\w"),
}
JSON_TMP = re.compile(r'"/tmp/')  # a recorded command or path of the machine that produced a result


def _tracked():
  """Committed files (git ls-files), else every file under the checked paths (a tree without .git)."""
  try:
    out = subprocess.run(["git", "ls-files", "-z", *CHECKED], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / p for p in out.decode().split("\0") if p]
  except (OSError, subprocess.CalledProcessError):
    return [p for c in CHECKED for p in (REPO / c).rglob("*") if p.is_file()]


def _text_files():
  return [p for p in _tracked() if p.suffix in TEXT_SUFFIXES and p.is_file() and not p.is_symlink()]


def violations(path, text):
  """[(line number, what, the line)] of what `text` (the file at `path`) may not say."""
  found = []
  for number, line in enumerate(text.splitlines(), 1):
    for what, pattern in FORBIDDEN.items():
      if pattern.search(line):
        found.append((number, what, line.strip()[:120]))
    if path.suffix in (".json", ".jsonl") and JSON_TMP.search(line):
      found.append((number, "an absolute path of a machine", line.strip()[:120]))
  return found


def test_the_patterns_catch_what_they_mean_and_pass_ordinary_text():
  bad = [
    "fixed in #46 (the xla backend)",
    "see issue 20",
    "the GPU was lent to the session",
    "copied from ../shared/gpu/H100.md",
    '"config": "/work/wt/aot/configs/gb200/llama3_8b_fp8.yml"',
    "TE_VENV=/root/.cache/maxtext_nvfp4/venv",
  ]
  assert all(violations(pathlib.Path("x.md"), line) for line in bad)
  assert violations(pathlib.Path("x.json"), '"command": "/tmp/tfvenv/bin/python make.py"')
  ok = [
    "16x16 weight tiles; see [the plan](precision/index.md#the-precision-plan)",
    "color: #1f77b4; &#123;",
    "compile_report=/tmp/r.json (any path)",
    "s3://bucket/work/x and ./work/y",
    "## 2. The second step",
  ]
  assert not any(violations(pathlib.Path("x.md"), line) for line in ok)


def test_no_committed_line_talks_about_the_making_of_the_product():
  found = []
  for path in _text_files():
    text = path.read_text(encoding="utf-8", errors="replace")
    found += [f"{path.relative_to(REPO)}:{n}: {what}: {line}" for n, what, line in violations(path, text)]
  assert not found, f"{len(found)} line(s):\n" + "\n".join(found[:40])


def test_no_committed_symlink_points_outside_the_repository():
  try:
    out = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=REPO, capture_output=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")
  links = [e.split("\t", 1)[1] for e in out.decode().split("\0") if e.startswith("120000 ")]
  outside = []
  for link in links:
    target = os.readlink(REPO / link) if (REPO / link).is_symlink() else ""
    resolved = (REPO / link).parent / target
    if os.path.isabs(target) or not os.path.normpath(resolved).startswith(str(REPO) + os.sep):
      outside.append(f"{link} -> {target}")
  assert not outside, outside
