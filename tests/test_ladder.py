"""configs/ladder/: each rung's parameter count is the size its name and comments state, and dry_run prints it."""

import re

import pytest

from MaxText.model import accounting
from MaxText import config, train
from tests.conftest import REPO

LADDER = {"llama3_25m.yml": 25e6, "llama3_125m.yml": 125e6, "llama3_350m.yml": 350e6}


@pytest.mark.parametrize("name,size", LADDER.items())
def test_rung_has_the_size_it_names(name, size, capsys):
  path = REPO / "configs" / "ladder" / name
  cfg = config.load(path, ["dry_run=true", "gpu_type=h100"])
  count = accounting.param_count(cfg)
  assert abs(count - size) / size < 0.02, count
  documented = re.search(r"dry_run=true\s+-> parameters: (\d+)", path.read_text(encoding="utf-8"))
  assert documented and int(documented.group(1)) == count
  # Llama 3's shape: grouped-query attention, a gated MLP wider than the model, the 512-token corpus vocabulary.
  assert cfg.base_num_query_heads % cfg.base_num_kv_heads == 0 and cfg.base_num_kv_heads < cfg.base_num_query_heads
  assert cfg.base_num_query_heads * cfg.head_dim == cfg.base_emb_dim and cfg.base_mlp_dim >= 3 * cfg.base_emb_dim
  # Paths are read against the working directory when the config is loaded (#30).
  assert cfg.vocab_size == 512 and cfg.grain_train_files == config.absolute_path("data/english/train-*.array_record")
  assert train.train(cfg) == []
  out = capsys.readouterr().out
  assert f"parameters: {count}\n" in out and "fits in" in out  # one H100 holds it
