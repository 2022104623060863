"""Building a run: a setup that fails closes what it had opened (data, prefetch thread, writer, checkpointer,
profiler, lock), newest first, even when one of those closes fails, and the error that stopped it is the one
raised."""

import logging
import threading
import time

import jax
import pytest

from MaxText import config, precision
from MaxText.config import RunShape
from MaxText.runtime import run_lock
from MaxText.trainer import run_setup
from MaxText.trainer.hooks import profiler
from tests.conftest import REPO, run_on_cpu_devices
from tests.data.corpus import grain_overrides
from tests.trainer.test_train import SMALL


def _build(cfg, out_dir):
  devices = jax.devices()
  return run_setup.build(
    cfg, precision.plan_from_config(cfg), RunShape.of(cfg, len(devices)), devices, 0, 1, str(out_dir)
  )


def test_a_failed_setup_closes_everything_it_opened(tmp_path, corpus, monkeypatch, caplog):
  cfg = config.load(
    REPO / "configs" / "llama3_tiny.yml",
    SMALL
    + grain_overrides(corpus)
    + ["enable_checkpointing=true", "enable_tensorboard=true", "data_prefetch_depth=2", "profiler=xplane"]
    + [f"base_output_directory={tmp_path}", "run_name=r", "eval_interval=5", "steps=10"],
  )
  out_dir = tmp_path / "r"
  # Once whole (the process-wide threads jax, Orbax and grain start at their first use exist after it).
  _build(cfg, out_dir).close()
  before = set(threading.enumerate())

  def late_failure(*args, **kwargs):
    raise RuntimeError("setup failed after everything was opened")

  def failing_close(self):
    raise RuntimeError("the profiler's close failed too")

  monkeypatch.setattr(run_setup, "Run", late_failure)
  monkeypatch.setattr(profiler.Profiler, "close", failing_close)  # closed before the checkpointer, writer, data
  with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="^setup failed after everything"):
    _build(cfg, out_dir)
  # The prefetch thread, grain's readers, Orbax's and tensorboardX's writer: stopped (grain's pool ends its threads
  # once their current read is done, so they are given a few seconds).
  deadline = time.monotonic() + 10.0
  for t in set(threading.enumerate()) - before:
    t.join(max(0.0, deadline - time.monotonic()))
  left = [t.name for t in set(threading.enumerate()) - before]
  assert left == [], left
  assert "closing ProfilerHook after the failure failed too: the profiler's close failed too" in caplog.text
  run_lock.RunLock(str(out_dir)).acquire().release()  # the lock was released: the next run may start


STATE_SHARDING_SCRIPT = r"""
import json, sys
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from MaxText import checkpointing, config
from MaxText.runtime import sharding
from MaxText.trainer import optimizer, run_setup
small, tmp = json.loads(sys.argv[1]), sys.argv[2]
out = {}
for label, keys in {
  "bf16/fsdp8": ["ici_fsdp_parallelism=8"],
  "te_nvfp4/fsdp8": ["ici_fsdp_parallelism=8", "quantization=te_nvfp4"],
  "te_fp8_delayedscaling/fsdp4_tensor2": ["ici_fsdp_parallelism=4", "ici_tensor_parallelism=2",
                                          "quantization=te_fp8_delayedscaling"],
}.items():
  cfg = config.load("configs/llama3_tiny.yml", small + keys + ["base_emb_dim=128", f"base_output_directory={tmp}"])
  mesh = sharding.make_mesh(cfg)
  tx = optimizer.make_optimizer(cfg)
  _, abstract = run_setup.abstract_train_state(cfg, mesh, tx)
  with jax.set_mesh(mesh):
    _, fresh = run_setup.init_sharded(cfg, mesh, tx, jax.random.key(0))
  params = {sharding.param_path(p): a.sharding for p, a in jax.tree_util.tree_flatten_with_path(fresh.params)[0]}
  moments, other = {}, []
  for path, leaf in jax.tree_util.tree_flatten_with_path(fresh.opt_state)[0]:
    name = jax.tree_util.keystr(path)  # with the moment's name (mu, nu), which param_path drops
    owner = next((p for p in params if sharding.param_path(path).endswith("/" + p)), None)
    if owner is None:
      other.append([name, leaf.sharding.is_fully_replicated, leaf.nbytes])
    else:
      moments[name] = leaf.sharding.is_equivalent_to(params[owner], leaf.ndim)
  replicated = sum(a.nbytes for a in jax.tree.leaves(fresh.opt_state) if a.sharding.is_fully_replicated)
  same = lambda a, b: all(x.sharding.is_equivalent_to(y.sharding, x.ndim) for x, y in zip(jax.tree.leaves(a),
                                                                                          jax.tree.leaves(b)))
  out[label] = {
    "moments_like_params": moments,
    "other_leaves": other,
    "replicated_fraction": replicated / sum(a.nbytes for a in jax.tree.leaves(fresh.opt_state)),
    "init_equals_abstract": same(fresh.params, abstract.params) and same(fresh.opt_state, abstract.opt_state)
                            and same(fresh.rest, abstract.rest),
    "amax_histories": len(jax.tree.leaves(fresh.rest)),
  }
  if label.startswith("bf16"):
    # A checkpoint written with replicated moments (as runs before the fix wrote them) resumes onto the sharded layout.
    tree = jax.device_put(fresh.checkpoint_tree(), NamedSharding(mesh, P()))
    tree = jax.tree.map(lambda a: a + 1 if a.dtype == np.float32 else a, tree)
    ckpt = checkpointing.Checkpointer(f"{tmp}/ckpt", period=1, max_to_keep=0, async_save=False, cfg=cfg)
    ckpt.save(3, tree, {}, force=True)
    ckpt.wait()
    _, _, resumed, _ = run_setup._state(cfg, mesh, ckpt, None, 0, jax.random.key(0))
    ckpt.close()
    out["resumed"] = {
      "step": resumed.step,
      "sharded_like_fresh": same(resumed.opt_state, fresh.opt_state) and same(resumed.params, fresh.params),
      "values_equal": all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                          zip(jax.tree.leaves(resumed.checkpoint_tree()), jax.tree.leaves(tree))),
    }
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_train_state_is_sharded_like_the_params_on_8_devices(tmp_path):
  """Every optimizer-state copy of a parameter (AdamW's mu, nu) has that parameter's sharding, from init and from a
  checkpoint written with replicated moments; only AdamW's count and the amax histories are replicated (MaxText's
  rule; before, mu and nu came out replicated: 100% of the optimizer state on every device)."""
  import json

  out = run_on_cpu_devices(STATE_SHARDING_SCRIPT, json.dumps(SMALL), str(tmp_path), timeout=600)
  resumed = out.pop("resumed")
  for label, got in out.items():
    # 2 layers x 9 parameters + embedding, lm_head (untied), final norm: each with a mu and a nu.
    assert len(got["moments_like_params"]) == 2 * 12, (label, sorted(got["moments_like_params"]))
    assert all(got["moments_like_params"].values()), (label, got["moments_like_params"])
    assert got["init_equals_abstract"], label
    # What isn't a copy of a parameter: AdamW's count (twice: the schedule's and Adam's), nothing large.
    assert all(replicated for _, replicated, _ in got["other_leaves"]) and len(got["other_leaves"]) <= 3, got
    assert got["replicated_fraction"] <= 0.01, (label, got["replicated_fraction"])
  assert out["te_fp8_delayedscaling/fsdp4_tensor2"]["amax_histories"] > 0
  assert resumed == {"step": 3, "sharded_like_fresh": True, "values_equal": True}
