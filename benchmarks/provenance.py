"""The commit a benchmark's figures name (no jax import: gpu_bench records it before jax starts)."""

import pathlib
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[1]


def commit(repo=REPO, mark_dirty=False):
  """The checkout's short commit, "+" appended with `mark_dirty` when its tracked files differ from it; None outside
  git."""
  run = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True, check=False)
  head = run("rev-parse", "--short", "HEAD")
  if head.returncode != 0:
    return None
  dirty = mark_dirty and run("diff", "--quiet", "HEAD").returncode != 0
  return head.stdout.strip() + ("+" if dirty else "")
