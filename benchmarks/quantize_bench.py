"""Micro-benchmark: NVFP4 quantize throughput, and emulated qmatmul fwd+bwd time as a ratio to a BF16 matmul.

    python benchmarks/quantize_bench.py [--shapes 1024x1024x1024,2048x2048x2048] [--iters 10] [--json out.json]

All timings come from one process, interleaved per shape, median of --iters runs; ratios are what to
compare across machines (absolute times are noisy).
"""

import argparse
import json
import pathlib
import platform
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from MaxText.quantization import get_recipe, nvfp4, qmatmul  # noqa: E402


def _median_seconds(fn, *args, iters):
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(iters):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def _fwd_bwd(recipe):
  # A random output cotangent, as in training: with sum()'s constant ones XLA would constant-fold the
  # gradient's quantization at compile time and time less than a training step does.
  def fwd_bwd(x, w, dy, key):
    _, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=key, backend="emulate"), x, w)
    return vjp(dy)
  return jax.jit(fwd_bwd)


def bench_shape(m, k, n, iters):
  kx, kw, kdy = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (m, k), jnp.bfloat16)
  w = jax.random.normal(kw, (k, n), jnp.float32)
  dy = jax.random.normal(kdy, (m, n), jnp.bfloat16)
  key = jax.random.key(1)
  quantize_1d = jax.jit(lambda a: nvfp4.quantize(a))
  quantize_rht_sr = jax.jit(lambda a, key: nvfp4.quantize(a, rht=True, stochastic_rounding=True, key=key))
  t_q = _median_seconds(quantize_1d, x, iters=iters)
  t_q_rht = _median_seconds(quantize_rht_sr, x, key, iters=iters)
  t_bf16 = _median_seconds(_fwd_bwd(get_recipe("")), x, w, dy, key, iters=iters)
  t_nvfp4 = _median_seconds(_fwd_bwd(get_recipe("te_nvfp4")), x, w, dy, key, iters=iters)
  t_fp8 = _median_seconds(_fwd_bwd(get_recipe("te_fp8_currentscaling")), x, w, dy, key, iters=iters)
  return {"shape": f"{m}x{k}x{n}", "quantize_Melem_per_s": m * k / t_q / 1e6,
          "quantize_rht_sr_Melem_per_s": m * k / t_q_rht / 1e6,
          "bf16_fwd_bwd_ms": t_bf16 * 1e3, "nvfp4_fwd_bwd_ms": t_nvfp4 * 1e3, "fp8_fwd_bwd_ms": t_fp8 * 1e3,
          "nvfp4_over_bf16": t_nvfp4 / t_bf16, "fp8_over_bf16": t_fp8 / t_bf16}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", default="512x512x512,1024x1024x1024,2048x2048x2048",
                      help="comma-separated MxKxN (M tokens, K in, N out)")
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--json", help="also write the rows as JSON here")
  args = parser.parse_args()
  try:
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    assert all(len(s) == 3 and min(s) > 0 and s[1] % 16 == 0 and s[0] % 16 == 0 for s in shapes)
  except (ValueError, AssertionError):
    parser.error(f"--shapes {args.shapes!r}: expected MxKxN with M and K multiples of 16, e.g. 1024x1024x1024")
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).parent).stdout.strip()
  device = jax.devices()[0]
  print(f"device: {device.platform} ({getattr(device, 'device_kind', '')}), {platform.machine()}, "
        f"jax {jax.__version__}, commit {commit}")
  rows = [bench_shape(*s, iters=args.iters) for s in shapes]
  print("| M x K x N | quantize (Melem/s) | quantize+RHT+SR (Melem/s) | bf16 fwd+bwd (ms) | "
        "nvfp4 fwd+bwd (ms) | nvfp4 / bf16 | fp8 / bf16 |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['shape']} | {r['quantize_Melem_per_s']:.1f} | {r['quantize_rht_sr_Melem_per_s']:.1f} | "
          f"{r['bf16_fwd_bwd_ms']:.2f} | {r['nvfp4_fwd_bwd_ms']:.2f} | {r['nvfp4_over_bf16']:.2f}x | "
          f"{r['fp8_over_bf16']:.2f}x |")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps({"commit": commit, "device": str(device), "rows": rows}, indent=1))


if __name__ == "__main__":
  main()
