"""The commands the docs and README show are the tested ones: every shell or console block is marked run, slow or
skip (with a reason); the run blocks run here (make test), the slow ones under make test-all, each in a fresh copy of
the repository's layout, and a console block's shown output must appear in what its command printed."""

import os
import pathlib
import subprocess
import sys

import pytest

import commands
from tests.conftest import JAX_CACHE, REPO

BLOCKS = commands.shell_blocks()
# What a fresh clone holds besides the tracked files, and what a test must not see of this checkout.
LEFT_OUT = {".git", "outputs", ".pytest_cache", "__pycache__", ".venv-te", ".venv-maxtext", ".whl"}


def test_every_shell_block_says_how_it_is_tested():
  assert len(BLOCKS) >= 10, [b.where for b in BLOCKS]
  unmarked = [b.where for b in BLOCKS if not b.mark]
  assert not unmarked, f"mark these blocks <!-- docs-test: run|slow|skip (why) -->: {unmarked}"
  no_reason = [b.where for b in BLOCKS if b.mark == "skip" and not b.reason]
  assert not no_reason, f"a skipped block says why: {no_reason}"
  assert sum(b.mark == "run" for b in BLOCKS) >= 5


def test_console_steps_parse_commands_and_their_output():
  text = "$ python a.py \\\n    x=1\nout: 1\n\n$ b --help\nusage: b ...\n"
  assert commands.console_steps(text) == [("python a.py  x=1", ["out: 1"]), ("b --help", ["usage: b ..."])]
  assert commands.output_matches("usage: b ...", "usage: b [-h]\n")
  assert not commands.output_matches("parameters: 8030261248", "parameters: 8030261249\n")


def _workspace(tmp_path):
  """A directory that looks like the repository's root (its entries linked), with its own empty outputs/, and a
  HOME whose compilation cache is the test run's."""
  root = tmp_path / "repo"
  root.mkdir()
  for entry in REPO.iterdir():
    if entry.name not in LEFT_OUT:
      (root / entry.name).symlink_to(entry)
  home = tmp_path / "home"
  (home / ".cache" / "maxtext_nvfp4").mkdir(parents=True)
  (home / ".cache" / "maxtext_nvfp4" / "jax").symlink_to(JAX_CACHE)
  env = dict(
    os.environ,
    HOME=str(home),
    PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    JAX_PLATFORMS="cpu",
  )
  return root, env


def _run(command, root, env):
  return subprocess.run(
    ["bash", "-o", "pipefail", "-c", command],
    cwd=root,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    timeout=600,
  )


def _params():
  out = []
  for b in BLOCKS:
    if b.mark == "run":
      out.append(pytest.param(b, id=b.where))
    elif b.mark == "slow":
      out.append(pytest.param(b, id=b.where, marks=pytest.mark.slow))
  return out


def _run_block(block, root, env):
  if block.lang == "console":
    steps = commands.console_steps(block.text)
    assert steps, f"{block.where}: a console block without a `$ ` command"
    for command, expected in steps:
      result = _run(command, root, env)
      missing = [e for e in expected if not commands.output_matches(e, result.stdout)]
      assert not missing, f"{block.where}: `{command}` did not print {missing}; it printed:\n{result.stdout[-3000:]}"
  else:
    result = _run("set -eu\n" + block.text, root, env)
    assert result.returncode == 0, f"{block.where} exited {result.returncode}:\n{result.stdout[-3000:]}"


def test_a_continuing_block_runs_after_the_one_before(tmp_path):
  page = tmp_path / "page.md"
  page.write_text(
    "<!-- docs-test: run -->\n```bash\necho a\n```\n\ntext\n\n<!-- docs-test: slow (continues) -->\n"
    "```bash\necho b\n```\n\n<!-- docs-test: skip (why) -->\n```bash\nfalse\n```\n",
    encoding="utf-8",
  )
  first, second, third = commands.blocks(page)
  assert (first.mark, second.mark, second.continues, third.continues) == ("run", "slow", True, False)
  assert commands.chain(second, [first, second, third]) == [first, second]
  assert commands.chain(first, [first, second, third]) == [first]


@pytest.mark.parametrize("block", _params())
def test_documented_block_runs(block, tmp_path):
  root, env = _workspace(tmp_path)
  blocks = commands.chain(block, BLOCKS)
  if any("data/shakespeare" in b.text for b in blocks) and not (REPO / "data/shakespeare/metadata.json").exists():
    pytest.skip("needs `make data` (data/shakespeare), which downloads the corpus")
  for b in blocks:
    _run_block(b, root, env)
