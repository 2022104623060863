"""The sharded train step on 8 virtual CPU devices: per mesh and mode, the share of the optimizer state's
bytes replicated on every device, the compiled step's collective data per device (and its ratio to bf16's on the
same mesh), and its peak memory (XLA's memory analysis). One table; compiled here, nothing run.

    python benchmarks/scale_out.py [--config configs/llama3_tiny.yml] [key=value ...]

The process starts with 8 CPU devices (XLA_FLAGS' --xla_force_host_platform_device_count, unless $XLA_FLAGS sets
one). Meshes: fsdp 8, and fsdp 4 x tensor 2; modes: bf16 and te_nvfp4 (the emulated backend on CPU).
"""

import argparse
import os
import pathlib
import sys

# Run as a script: 8 CPU devices, before jax starts (imported, e.g. by its test, it leaves the process's jax alone).
if __name__ == "__main__" and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402

from benchmarks import provenance  # noqa: E402
from MaxText import cli, config as config_lib  # noqa: E402
from MaxText.runtime import sharding  # noqa: E402
from MaxText.trainer import aot_step, optimizer, run_setup  # noqa: E402

MESHES = {
  "fsdp 8": ["ici_fsdp_parallelism=8"],
  "fsdp 4 x tensor 2": ["ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"],
}
MODES = {"bf16": ["quantization="], "te_nvfp4": ["quantization=te_nvfp4"]}
SMALL = ["dataset_type=synthetic", "per_device_batch_size=2"]


def replicated_fraction(cfg, mesh):
  """The share of the optimizer state's bytes whose sharding replicates them on every device, as the run builds it."""
  _, state = run_setup.abstract_train_state(cfg, mesh, optimizer.make_optimizer(cfg))
  leaves = jax.tree.leaves(state.opt_state)
  nbytes = lambda a: a.size * a.dtype.itemsize
  return sum(nbytes(a) for a in leaves if a.sharding.is_fully_replicated) / sum(nbytes(a) for a in leaves)


def measure(config, overrides):
  """{(mesh, mode): {replicated, collectives (bytes per device per step by kind), peak_bytes}}."""
  out = {}
  for mesh_name, mesh_keys in MESHES.items():
    for mode, mode_keys in MODES.items():
      cfg = config_lib.load(config, [*SMALL, *mesh_keys, *mode_keys, *overrides])
      mesh = sharding.make_mesh(cfg, jax.devices())
      step = aot_step.compile_step(cfg, jax.devices(), compile_only=False)
      out[mesh_name, mode] = {
        "replicated": replicated_fraction(cfg, mesh),
        "collectives": step.summary()["collectives"],
        "peak_bytes": step.memory["peak_bytes"],
      }
  return out


def table(results):
  lines = [
    "| mesh | mode | optimizer state replicated | collectives MB/step/device (by kind) | vs bf16 | peak MiB/device |",
    "|---|---|---:|---|---:|---:|",
  ]
  for (mesh, mode), got in results.items():
    total = sum(got["collectives"].values())
    bf16 = sum(results[mesh, "bf16"]["collectives"].values())
    kinds = ", ".join(f"{k} {v / 1e6:.2f}" for k, v in sorted(got["collectives"].items()))
    lines.append(
      f"| {mesh} | {mode} | {got['replicated']:.2%} | {total / 1e6:.2f} ({kinds}) | {total / bf16:.2f}x "
      f"| {got['peak_bytes'] / 2**20:.1f} |"
    )
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=str(REPO / "configs" / "llama3_tiny.yml"))
  parser.add_argument("overrides", nargs="*", help="key=value config overrides")
  args = parser.parse_args(argv)
  try:
    results = measure(args.config, args.overrides)
  except cli.USER_ERRORS as e:  # a config or mesh the user can fix: one line, as the trainer's CLI
    print(f"error: {e}", file=sys.stderr, flush=True)
    return 2
  print(
    f"{len(jax.devices())} {jax.devices()[0].platform} devices, jax {jax.__version__}, commit {provenance.commit()}"
  )
  print(table(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
