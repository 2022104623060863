"""The streamed parameter checkpoint is the checkpoint the installed Orbax writes for the same tree (its tree record
and array layout) and restores through Orbax, bf16 storage cast to the f32 template."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp

from MaxText.checkpointing.hf.orbax_writer import ParamCheckpointWriter, leaf_keys

ARRAYS = {
  "embed/embedding": np.arange(40, dtype=np.float32).reshape(8, 5),
  "layers/mlp/gate/kernel": np.arange(60, dtype=np.float32).reshape(3, 5, 4) / 7,
}


def _tree(arrays):
  tree = {}
  for path, a in arrays.items():
    node = tree
    for part in path.split("/")[:-1]:
      node = node.setdefault(part, {})
    node[path.split("/")[-1]] = {"value": a}
  return {"params": tree}


def test_tree_record_matches_orbax_and_orbax_restores_it(tmp_path):
  ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=False)).save(
    tmp_path / "orbax", _tree({k: jnp.asarray(v) for k, v in ARRAYS.items()})
  )
  ours = tmp_path / "ours"
  stored = {k: v.astype(ml_dtypes.bfloat16) for k, v in ARRAYS.items()}
  writer = ParamCheckpointWriter(
    ours, {k: (v.shape, v.dtype, v.ndim - 1, (0,) * (v.ndim == 3)) for k, v in stored.items()}
  )
  for layer in range(3):  # one layer at a time, in two column blocks
    for cols in (slice(0, 2), slice(2, 4)):
      writer.write(
        "layers/mlp/gate/kernel", (layer, slice(None), cols), stored["layers/mlp/gate/kernel"][layer, :, cols]
      )
  writer.write("embed/embedding", (slice(None), slice(None)), stored["embed/embedding"])
  writer.finish()
  record, theirs = (json.loads((d / "_METADATA").read_text()) for d in (ours, tmp_path / "orbax"))
  assert record == theirs  # the same tree record, key for key
  assert sorted(p.name for p in ours.iterdir() if p.is_dir()) == sorted(".".join(leaf_keys(k)) for k in ARRAYS)
  cpu = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=cpu), _tree(ARRAYS))
  restored = ocp.StandardCheckpointer().restore(ours, target)
  for path, a in stored.items():
    got = restored
    for part in ["params", *path.split("/"), "value"]:
      got = got[part]
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), a.astype(np.float32))
