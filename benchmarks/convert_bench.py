"""Import and export of a Llama-shaped checkpoint of random weights: peak host memory and speed.

    python benchmarks/convert_bench.py [--dir /tmp/convert_bench] [--layers 16 --emb 2048 --mlp 8192 --heads 32
                                        --kv-heads 8 --head-dim 64 --vocab 128256] [--shard-gb 1] [--nvfp4] [--keep]

Writes a bf16 Hugging Face checkpoint of that shape (default: Llama 3.2 1B's, with an untied lm head: 1.50B
parameters, 3.0 GB, in 1 GB shards with the index), then runs, each in a fresh process, the import
(`python -m MaxText.convert_hf to-maxtext`) and the export of the imported checkpoint (`to-hf`). For each it
reports the peak resident memory above the process's baseline (VmHWM after the peak is reset once jax, Orbax and
tensorstore are imported, minus VmRSS then) as a fraction of the checkpoint's size, and GB/s (checkpoint bytes
over wall seconds). Page-cache reads are not resident memory of the process: the figure is what the conversion
itself holds. --nvfp4 also exports the imported checkpoint as a te_nvfp4 run with `to-hf --nvfp4` (input_scale
calibrated on 2 synthetic batches of 256 tokens, which loads the model in f32 for that forward pass) and prints the
size of its safetensors against the bf16 export's.
"""

import argparse
import json
import pathlib
import platform
import shutil
import subprocess
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import provenance  # noqa: E402

# Runs in the child: imports, resets the peak, converts, prints the numbers as JSON.
CHILD = r"""
import json, sys, time, pathlib
import jax, orbax.checkpoint, tensorstore  # noqa: F401  (the baseline includes the libraries)
from MaxText import convert_hf

def status(key):
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith(key + ":"):
      return int(line.split()[1]) * 1024

pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
baseline = status("VmRSS")
start = time.perf_counter()
code = convert_hf.main(sys.argv[1:])
seconds = time.perf_counter() - start
print(json.dumps({"code": code, "seconds": seconds, "baseline": baseline, "peak": status("VmHWM")}))
"""


def write_checkpoint(out, args):
  """A bf16 LlamaForCausalLM checkpoint of random weights in shards of --shard-gb (with the index)."""
  from MaxText.checkpointing.hf import checkpoint, model_config, names  # pylint: disable=import-outside-toplevel
  from MaxText.checkpointing.hf.exporter import ExportTensor, whole, write_tensors  # pylint: disable=import-outside-toplevel
  from MaxText.checkpointing.hf.importer import config_from_keys  # pylint: disable=import-outside-toplevel
  import ml_dtypes  # pylint: disable=import-outside-toplevel

  hf_config = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": args.emb,
    "intermediate_size": args.mlp,
    "num_hidden_layers": args.layers,
    "num_attention_heads": args.heads,
    "num_key_value_heads": args.kv_heads,
    "head_dim": args.head_dim,
    "vocab_size": args.vocab,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "rope_scaling": {
      "rope_type": "llama3",
      "factor": 32.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
  }
  cfg = config_from_keys(model_config.to_keys(hf_config), "benchmark")
  rng = np.random.default_rng(0)

  def random_bf16(shape):
    return (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)

  tensors = [
    ExportTensor(
      name, ml_dtypes.bfloat16, names.hf_shape(cfg, entry), whole(lambda s=names.hf_shape(cfg, entry): random_bf16(s))
    )
    for name, (entry, _) in names.hf_names(cfg).items()
  ]
  out.mkdir(parents=True)
  write_tensors(out, tensors, int(args.shard_gb * 1e9))
  (out / "config.json").write_text(json.dumps(hf_config))
  assert checkpoint.is_hf_dir(out)
  return sum(t.nbytes for t in tensors), sum(int(np.prod(t.shape)) for t in tensors)


def run_child(argv):
  result = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=REPO, capture_output=True, text=True, check=False)
  record = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}
  if result.returncode or record.get("code"):
    sys.exit(f"{' '.join(argv)} failed:\n{result.stderr[-3000:]}")
  return record


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dir", default="/tmp/convert_bench")
  parser.add_argument("--layers", type=int, default=16)
  parser.add_argument("--emb", type=int, default=2048)
  parser.add_argument("--mlp", type=int, default=8192)
  parser.add_argument("--heads", type=int, default=32)
  parser.add_argument("--kv-heads", type=int, default=8)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--vocab", type=int, default=128256)
  parser.add_argument("--shard-gb", type=float, default=1.0)
  parser.add_argument("--nvfp4", action="store_true", help="also export with to-hf --nvfp4 (ModelOpt NVFP4 MLPs)")
  parser.add_argument("--keep", action="store_true", help="leave the checkpoints in --dir")
  args = parser.parse_args()
  root = pathlib.Path(args.dir)
  if root.exists():
    shutil.rmtree(root)
  start = time.perf_counter()
  size, count = write_checkpoint(root / "hf", args)
  print(
    f"random bf16 checkpoint: {count / 1e9:.2f}B parameters, {size / 1e9:.2f} GB in "
    f"{len(list((root / 'hf').glob('*.safetensors')))} files ({time.perf_counter() - start:.0f} s to write)",
    flush=True,
  )
  rows = []
  steps = [
    ("import (to-maxtext)", ["to-maxtext", str(root / "hf"), str(root / "imported")]),
    ("export (to-hf, bf16)", ["to-hf", str(root / "imported"), str(root / "exported")]),
  ]
  if args.nvfp4:
    nvfp4_run = ["quantization=te_nvfp4", "dataset_type=synthetic", "per_device_batch_size=1", "max_target_length=256"]
    argv = ["to-hf", str(root / "imported"), str(root / "nvfp4"), *nvfp4_run, "--nvfp4", "--calibration-batches", "2"]
    steps.append(("export (to-hf --nvfp4)", argv))
  for name, argv in steps:
    r = run_child(argv)
    above = r["peak"] - r["baseline"]
    rows.append((name, above / 1e9, above / size, size / 1e9 / r["seconds"], r["seconds"]))
  commit = provenance.commit() or "unknown"
  print(
    f"\ncommit {commit}, {platform.node()}, {platform.processor() or platform.machine()}, "
    f"checkpoint {size / 1e9:.2f} GB bf16 ({count / 1e9:.2f}B parameters)"
  )
  print(f"| {'step':<22} | peak RSS above baseline | / checkpoint size | GB/s  | seconds |")
  print(f"|{'-' * 24}|{'-' * 25}|{'-' * 19}|{'-' * 7}|{'-' * 9}|")
  for name, gb, fraction, rate, seconds in rows:
    print(f"| {name:<22} | {gb:>20.3f} GB | {fraction:>17.3f} | {rate:>5.2f} | {seconds:>7.1f} |")
  if args.nvfp4:
    sizes = {d: sum(p.stat().st_size for p in (root / d).glob("*.safetensors")) for d in ("exported", "nvfp4")}
    print(
      f"\nsafetensors: bf16 export {sizes['exported'] / 1e9:.3f} GB, --nvfp4 export {sizes['nvfp4'] / 1e9:.3f} GB "
      f"({sizes['nvfp4'] / sizes['exported']:.3f} of bf16)"
    )
  if not args.keep:
    shutil.rmtree(root)


if __name__ == "__main__":
  main()
