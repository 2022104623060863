"""Micro-benchmark: each operand quantizer per implementation (XLA path, Pallas kernels), in GB/s and % of copy
bandwidth.

    python benchmarks/quantize_bench.py [--shape 8192x16384] [--impls xla,pallas] [--iters 20] [--json out.json]
                                        [--only nvfp4] [--matmul-shapes 1024x1024x1024,...]

Each quantizer runs as the trainer calls it (emulated.quantize_for_gemm with its recipe and role; the
wgrad operands and the weight are transposed views) on a [rows, cols] operand: bf16 activations and
gradients, the f32 master weight for the 16x16 tiles. GB/s counts the bytes one read of the input and
one write of the output take (an amax pass reads the input again, so memory speed on a quantizer with
one shows as ~2/3 of copy bandwidth, not 100%); `copy` is a plain bf16 read + write of the same
tensor, timed in the same run, and the last column is each quantizer's GB/s as a share of it. The Four Over Six
rows (te_nvfp4 with nvfp4_4over6=all, mse) also give their time as a multiple of the same quantizer without 4/6:
the median of the per-round ratios (each round times every quantizer in turn, --iters rounds) and their range.
--matmul-shapes adds the emulated qmatmul fwd+bwd time as a ratio to a BF16 matmul.
Pallas runs on NVIDIA GPUs only; on CPU this measures the XLA path.
"""

import argparse
import json
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from benchmarks import provenance  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from MaxText.quantization.backends import emulated  # noqa: E402
from MaxText.quantization import backends, get_recipe, qmatmul  # noqa: E402
from MaxText.quantization.kernels import quantizer_impl  # noqa: E402
from MaxText.quantization.kernels.quantizer_impl import Kernels  # noqa: E402

# name: (recipe, role, transposed operand, input dtype)
QUANTIZERS = {
  "nvfp4 1x16 (x)": ("te_nvfp4", "x", False, jnp.bfloat16),
  "nvfp4 1x16 SR (dy)": ("te_nvfp4", "dy", False, jnp.bfloat16),
  "nvfp4 16x16 (w, f32)": ("te_nvfp4", "w", True, jnp.float32),
  "nvfp4 RHT (x_t)": ("te_nvfp4", "x_t", True, jnp.bfloat16),
  "nvfp4 RHT+SR (dy_t)": ("te_nvfp4", "dy_t", True, jnp.bfloat16),
  "mxfp8 (x)": ("te_mxfp8", "x", False, jnp.bfloat16),
  "mxfp4 (x)": ("mxfp4", "x", False, jnp.bfloat16),
  "fp8 current (x)": ("te_fp8_currentscaling", "x", False, jnp.bfloat16),
}
FOUR_OVER_SIX = " + 4/6"  # the NVFP4 quantizers again with Four Over Six (mse) on every operand
FOUR_OVER_SIX_KNOBS = {"nvfp4_4over6": "all", "nvfp4_4over6_err_mode": "mse"}
QUANTIZERS.update({name + FOUR_OVER_SIX: spec for name, spec in QUANTIZERS.items() if spec[0] == "te_nvfp4"})


def _nbytes(tree):
  return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree))


def _timed_rounds(fns, iters, inner=5):
  """{name: [seconds per call, one per round]}: every round times each fn in turn (`inner` back-to-back calls,
  dispatch overlapping as in a step), so a ratio of two fns is taken within each round, not across minutes of a
  shared machine's changing load."""
  for fn, args in fns.values():
    jax.block_until_ready(fn(*args))  # compile
  times = {name: [] for name in fns}
  for _ in range(iters):
    for name, (fn, args) in fns.items():
      start = time.perf_counter()
      for _ in range(inner):
        out = fn(*args)
      jax.block_until_ready(out)
      times[name].append((time.perf_counter() - start) / inner)
  return times


def _quantizer_fn(name, impl):
  recipe_name, role, transposed, _ = QUANTIZERS[name]
  recipe = get_recipe(recipe_name, **(FOUR_OVER_SIX_KNOBS if name.endswith(FOUR_OVER_SIX) else {}))
  return jax.jit(
    lambda a, k: emulated.quantize_for_gemm(a, recipe, role, k, kernels=Kernels(impl), transpose=transposed)
  )


def bench_quantizers(rows, cols, impls, iters, only=""):
  """[{quantizer, impl, ms, gb_s, pct_copy[, x_plain, x_plain_min, x_plain_max]}], the copy row first. ms is the
  median over `iters` rounds; a 4/6 row's x_plain is the median of its per-round ratio to the plain quantizer
  (min and max: the spread)."""
  x = jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32)
  key = jax.random.key(1)
  x16 = x.astype(jnp.bfloat16)
  fns = {("copy (bf16 read + write)", "xla"): (jax.jit(lambda a: a + 1), (x16,))}
  for name, (_, _, transposed, dtype) in QUANTIZERS.items():
    if only in name:
      operand = (x.T if transposed else x).astype(dtype)  # stored as the trainer stores it
      fns.update({(name, impl): (_quantizer_fn(name, impl), (operand, key)) for impl in impls})
  times = _timed_rounds(fns, iters)
  out, copy_gb_s = [], None
  for (name, impl), (fn, args) in fns.items():
    t = float(np.median(times[(name, impl)]))
    gb_s = (args[0].nbytes + _nbytes(jax.eval_shape(fn, *args))) / t / 1e9
    copy_gb_s = copy_gb_s or gb_s  # the copy row comes first
    row = {"quantizer": name, "impl": impl, "ms": t * 1e3, "gb_s": gb_s, "pct_copy": 100 * gb_s / copy_gb_s}
    plain = (name[: -len(FOUR_OVER_SIX)], impl)
    if name.endswith(FOUR_OVER_SIX) and plain in times:
      ratios = np.asarray(times[(name, impl)]) / np.asarray(times[plain])
      row.update(x_plain=float(np.median(ratios)), x_plain_min=float(ratios.min()), x_plain_max=float(ratios.max()))
    out.append(row)
  return out


def _fwd_bwd(recipe, kernels):
  # A random output cotangent, as in training: with sum()'s constant ones XLA would constant-fold the
  # gradient's quantization at compile time and time less than a training step does.
  def fwd_bwd(x, w, dy, key):
    matmul = lambda x, w: qmatmul(x, w, recipe, key=key, backend=backends.Choice.EMULATE, kernels=Kernels(kernels))
    _, vjp = jax.vjp(matmul, x, w)
    return vjp(dy)

  return jax.jit(fwd_bwd)


def bench_matmul(m, k, n, kernels, iters):
  kx, kw, kdy = jax.random.split(jax.random.key(0), 3)
  args = (
    jax.random.normal(kx, (m, k), jnp.bfloat16),
    jax.random.normal(kw, (k, n), jnp.float32),
    jax.random.normal(kdy, (m, n), jnp.bfloat16),
    jax.random.key(1),
  )
  recipes = {
    "bf16": get_recipe(""),
    "nvfp4": get_recipe("te_nvfp4"),
    "nvfp4_4over6": get_recipe("te_nvfp4", **FOUR_OVER_SIX_KNOBS),
    "fp8": get_recipe("te_fp8_currentscaling"),
  }
  rounds = _timed_rounds({name: (_fwd_bwd(recipe, kernels), args) for name, recipe in recipes.items()}, iters, inner=1)
  t = {name: float(np.median(v)) for name, v in rounds.items()}
  return {
    "shape": f"{m}x{k}x{n}",
    "kernels": kernels,
    **{f"{name}_fwd_bwd_ms": v * 1e3 for name, v in t.items()},
    **{f"{name}_over_bf16": t[name] / t["bf16"] for name in ("nvfp4", "nvfp4_4over6", "fp8")},
  }


def _parse_shapes(text, dims, parser, flag):
  try:
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]
    assert shapes and all(len(s) == dims and min(s) > 0 and all(v % 32 == 0 for v in s[:2]) for s in shapes)
  except (ValueError, AssertionError):
    parser.error(f"{flag} {text!r}: expected {'x'.join('ABC'[:dims])} with the first two multiples of 32")
  return shapes


def _print_tables(quant_rows, matmul_rows, rows, cols):
  print(f"\n[{rows}, {cols}] operand\n")
  print("| quantizer | impl | ms | GB/s | % of copy | x without 4/6 (min-max over rounds) |")
  print("|---|---|---:|---:|---:|---:|")
  for r in quant_rows:
    ratio = f"{r['x_plain']:.2f}x ({r['x_plain_min']:.2f}-{r['x_plain_max']:.2f})" if "x_plain" in r else ""
    print(f"| {r['quantizer']} | {r['impl']} | {r['ms']:.3f} | {r['gb_s']:.1f} | {r['pct_copy']:.0f}% | {ratio} |")
  if matmul_rows:
    print(
      "\n| M x K x N | quantizers | bf16 fwd+bwd (ms) | nvfp4 fwd+bwd (ms) | nvfp4 / bf16 | nvfp4 4/6 / bf16 "
      "| fp8 / bf16 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in matmul_rows:
      print(
        f"| {r['shape']} | {r['kernels']} | {r['bf16_fwd_bwd_ms']:.2f} | {r['nvfp4_fwd_bwd_ms']:.2f} | "
        f"{r['nvfp4_over_bf16']:.2f}x | {r['nvfp4_4over6_over_bf16']:.2f}x | {r['fp8_over_bf16']:.2f}x |"
      )


def _one_line_error(message):
  """argparse's usage + error as the project's one line (exit 2)."""
  print(f"error: quantize_bench.py: {message} (see --help)", file=sys.stderr)
  sys.exit(2)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.error = _one_line_error
  on_gpu = quantizer_impl.unavailable_reason() is None
  parser.add_argument(
    "--shape",
    default="8192x16384" if on_gpu else "2048x2048",
    help="operand rows x cols (default 8192x16384 on an NVIDIA GPU, 2048x2048 elsewhere)",
  )
  parser.add_argument(
    "--impls",
    default="xla,pallas" if on_gpu else "xla",
    help="comma-separated quantizer implementations: xla, pallas (NVIDIA GPUs)",
  )
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--only", default="", help="time only the quantizers whose name contains this (e.g. nvfp4)")
  parser.add_argument("--matmul-shapes", default="", help="also time qmatmul fwd+bwd at these MxKxN")
  parser.add_argument("--json", help="also write the rows as JSON here")
  args = parser.parse_args()
  ((rows, cols),) = _parse_shapes(args.shape, 2, parser, "--shape")
  matmul_shapes = _parse_shapes(args.matmul_shapes, 3, parser, "--matmul-shapes") if args.matmul_shapes else []
  impls = [i for i in args.impls.split(",") if i]
  bad = [i for i in impls if i not in ("xla", "pallas")]
  if bad or not impls or args.iters < 1:
    parser.error(f"--impls {args.impls!r} / --iters {args.iters}: impls from xla, pallas; iters >= 1")
  if "pallas" in impls and not on_gpu:
    print(f"error: --impls pallas: {quantizer_impl.unavailable_reason()}; use --impls xla", file=sys.stderr)
    sys.exit(2)
  commit = provenance.commit() or "unknown"
  device = jax.devices()[0]
  print(
    f"device: {device.platform} ({getattr(device, 'device_kind', '')}), {platform.machine()}, "
    f"jax {jax.__version__}, commit {commit}"
  )
  quant_rows = bench_quantizers(rows, cols, impls, args.iters, args.only)
  matmul_rows = [bench_matmul(*s, kernels=impl, iters=args.iters) for s in matmul_shapes for impl in impls]
  _print_tables(quant_rows, matmul_rows, rows, cols)
  if args.json:
    pathlib.Path(args.json).write_text(
      json.dumps(
        {
          "commit": commit,
          "device": str(device),
          "shape": [rows, cols],
          "quantizers": quant_rows,
          "matmul": matmul_rows,
        },
        indent=1,
      )
    )


if __name__ == "__main__":
  main()
