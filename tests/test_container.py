"""The container build's Transformer Engine check (scripts/te/check_version.py, run by the Dockerfile): by default it
names the image's TE beside the tested release and goes on; only TE_CHECK=strict stops the build."""

import importlib.util
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_version", REPO / "scripts" / "te" / "check_version.py")
check_version = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_version)
PINNED, CUDA = check_version.pinned()


def _dockerfile():
  return (REPO / "Dockerfile").read_text()


def test_the_dockerfile_passes_te_check_whose_default_reports():
  text = _dockerfile()
  default = re.search(r"^ARG TE_CHECK=(\S+)$", text, re.M).group(1)
  assert default == "report" and default in check_version.MODES
  run = re.search(r"^RUN python scripts/te/check_version.py (.*)$", text, re.M).group(1)
  assert run == '--mode "$TE_CHECK"'
  assert re.search(r"^ARG BASE_IMAGE=ghcr.io/nvidia/jax:maxtext$", text, re.M)


def _run(monkeypatch, capsys, found, *argv):
  monkeypatch.setattr(check_version, "installed", lambda: found)
  code = check_version.main(list(argv))
  out, err = capsys.readouterr()
  return code, out.strip().splitlines(), err.strip().splitlines()


def test_the_pinned_release_passes_in_both_modes(monkeypatch, capsys):
  for argv in ((), ("--mode", "strict")):
    code, out, err = _run(monkeypatch, capsys, {"transformer_engine": f"{PINNED}+abc1234"}, *argv)
    assert code == 0 and not err and len(out) == 1 and PINNED in out[0]


def test_another_release_is_reported_by_default_and_stops_only_under_strict(monkeypatch, capsys):
  nightly = {"transformer_engine": "2.99.0.dev0+0123abc"}
  code, out, err = _run(monkeypatch, capsys, nightly)
  assert code == 0 and not err and len(out) == 1
  assert "2.99.0.dev0+0123abc" in out[0] and PINNED in out[0]
  code, out, err = _run(monkeypatch, capsys, nightly, "--mode", "strict")
  assert code == 2 and not out and len(err) == 1
  assert err[0].startswith("error: ") and "2.99.0.dev0+0123abc" in err[0] and "TE_CHECK=strict" in err[0]


def test_no_te_is_a_note_by_default_and_an_error_under_strict(monkeypatch, capsys):
  code, out, err = _run(monkeypatch, capsys, {})
  assert code == 0 and len(out) == 1 and f"{PINNED}" in out[0] and f"core_{CUDA}" in out[0]
  code, out, err = _run(monkeypatch, capsys, {}, "--mode", "strict")
  assert code == 2 and len(err) == 1


@pytest.mark.parametrize("mode", ["warn", "Strict", ""])
def test_an_unknown_mode_is_one_line(monkeypatch, capsys, mode):
  code, out, err = _run(monkeypatch, capsys, {}, "--mode", mode)
  assert code == 2 and not out and len(err) == 1 and "report, strict" in err[0]
