"""XLA:CPU's GEMM on f32 and on bf16 operands (the same values, f32 accumulation), per CPU kind: which dtype
MaxText/quantization/cpu_gemm.py should hand it, and what its `auto` picks.

    python benchmarks/cpu_gemm_bench.py [--shapes 1024x256x768] [--rounds 15] [--kinds native,avx2,avx512,avx512_bf16]

Each kind runs in its own process: `native` is this CPU as it is; avx2, avx512 and avx512_bf16 are this CPU with
newer instructions hidden from every library (benchmarks/isa_cap.py: an emulation of what the libraries pick on that
CPU kind, run on this machine's cores, not a measurement of such a machine). Rounds are interleaved (each times f32
then bf16, `--calls` calls each), so a load that drifts falls on both; the ratio is the median of per-round ratios.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import isa_cap, provenance  # noqa: E402

KINDS = ("native", *isa_cap.LEVELS)
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "bf16")  # what the choice and the kernels turn on


def parse_shape(text):
  m, k, n = (int(v) for v in text.lower().split("x"))
  return m, k, n


def time_gemms(shape, rounds, calls):
  """{f32_ms, bf16_ms (medians per call), ratio (median of per-round bf16/f32), ratio_min, ratio_max}."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  m, k, n = shape
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
  dot = jax.jit(lambda x, y: jax.lax.dot(x, y, preferred_element_type=jnp.float32))
  cases = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    x, y = jnp.asarray(a, jnp.bfloat16).astype(dtype), jnp.asarray(b, jnp.bfloat16).astype(dtype)  # the same values
    dot(x, y).block_until_ready()
    cases[jnp.dtype(dtype).name] = (x, y)
  ms = {name: [] for name in cases}
  for _ in range(rounds):
    for name, (x, y) in cases.items():
      start = time.perf_counter()
      for _ in range(calls):
        out = dot(x, y)
      out.block_until_ready()
      ms[name].append((time.perf_counter() - start) / calls * 1e3)
  ratios = [b16 / f32 for f32, b16 in zip(ms["float32"], ms["bfloat16"])]
  return {
    "f32_ms": statistics.median(ms["float32"]),
    "bf16_ms": statistics.median(ms["bfloat16"]),
    "ratio": statistics.median(ratios),
    "ratio_min": min(ratios),
    "ratio_max": max(ratios),
  }


def child(shapes, rounds, calls):
  """One kind, in this process: the flags it sees, cpu_gemm's choice, each shape's timings; one JSON line."""
  from MaxText.quantization import cpu_gemm  # pylint: disable=import-outside-toplevel

  flags = cpu_gemm.cpu_flags()
  result = {
    "flags": sorted(f for f in REPORTED_FLAGS if flags and f in flags),
    "auto": cpu_gemm.operand_dtype().name,
    "load": os.getloadavg()[0],
    "shapes": {"x".join(map(str, s)): time_gemms(s, rounds, calls) for s in shapes},
  }
  print(json.dumps(result), flush=True)


def run_kind(kind, args):
  """The child's result for `kind` (a subprocess, under the ISA cap unless native), or {'error': why}."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  if kind != "native":
    try:
      env.update(isa_cap.env(kind))
    except isa_cap.IsaCapError as e:
      return {"error": str(e)}
  cmd = [sys.executable, __file__, "--child", "--shapes", args.shapes, "--rounds", str(args.rounds)]
  done = subprocess.run([*cmd, "--calls", str(args.calls)], env=env, capture_output=True, text=True)
  lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
  if done.returncode != 0 or not lines:
    return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
  return json.loads(lines[-1])


def markdown_table(results):
  lines = [
    "| CPU kind | flags seen | cpu_gemm auto | shape (MxKxN) | f32 (ms) | bf16 (ms) | bf16 / f32 | load |",
    "|---|---|---|---|---:|---:|---|---:|",
  ]
  for kind, r in results.items():
    if "error" in r:
      lines.append(f"| {kind} | {r['error']} | | | | | | |")
      continue
    for shape, t in r["shapes"].items():
      lines.append(
        f"| {kind} | {' '.join(r['flags']) or '-'} | {r['auto']} | {shape} | {t['f32_ms']:.2f} | {t['bf16_ms']:.2f} "
        f"| **{t['ratio']:.2f}** ({t['ratio_min']:.2f}-{t['ratio_max']:.2f}) | {r['load']:.1f} |"
      )
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument(
    "--shapes", default="1024x256x768", help="comma-separated MxKxN (default: llama3_tiny's MLP GEMM, 8 x 128 tokens)"
  )
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--calls", type=int, default=10, help="GEMM calls timed together per round and dtype")
  parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
  parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  try:
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
  except ValueError:
    parser.error(f"--shapes {args.shapes!r}: expected MxKxN[,MxKxN...] (e.g. 1024x256x768)")
  if args.child:
    return child(shapes, args.rounds, args.calls)
  kinds = [k for k in args.kinds.split(",") if k]
  unknown = [k for k in kinds if k not in KINDS]
  if unknown or not kinds:
    parser.error(f"--kinds: unknown {unknown}; known: {', '.join(KINDS)}")
  print(f"commit {provenance.commit(REPO, mark_dirty=True)}, {os.cpu_count()} CPUs", flush=True)
  results = {}
  for kind in kinds:
    results[kind] = run_kind(kind, args)
    print(f"{kind}: {json.dumps(results[kind])}", flush=True)
  print(markdown_table(results))
  if args.json:
    args.json.write_text(json.dumps(results, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
