"""The persistent compilation cache: a restart compiles nothing it compiled before; a bad directory is a warning."""

import pytest
import os

import jax

from MaxText.runtime import compile_cache
from MaxText import config, train
from tests.conftest import REPO
from tests.trainer.test_train import SMALL


def _entries(path):
  return sorted(p for p in os.listdir(path) if not p.startswith("."))


@pytest.mark.slow
def test_a_second_start_compiles_nothing_new(tmp_path):
  cache = tmp_path / "cache"
  cfg = config.load(
    REPO / "configs" / "llama3_tiny.yml",
    SMALL + [f"base_output_directory={tmp_path}", "steps=2", f"jax_cache_dir={cache}"],
  )
  jax.clear_caches()  # nothing compiled in memory by earlier tests: every program of the run compiles here
  first = train.train(cfg.replace(run_name="first"))
  written = _entries(cache)
  assert len(written) >= 3  # init, optimizer init, the train step at least
  jax.clear_caches()  # as a new process: nothing compiled in memory
  second = train.train(cfg.replace(run_name="second"))
  assert _entries(cache) == written  # every program came from the cache: nothing compiled, nothing written
  assert second == first


def test_an_unusable_directory_is_a_warning_and_empty_turns_it_off(tmp_path, capsys):
  (tmp_path / "file").write_text("not a directory")
  assert compile_cache.configure(str(tmp_path / "file" / "cache")) is None
  out = capsys.readouterr().out
  assert out.startswith(f"warning: compilation cache {tmp_path}/file/cache is not usable (")
  assert jax.config.jax_compilation_cache_dir is None
  assert compile_cache.configure("") is None and jax.config.jax_compilation_cache_dir is None
  assert compile_cache.configure(str(tmp_path / "ok")) == str(tmp_path / "ok")
