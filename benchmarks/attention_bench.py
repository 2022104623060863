"""cuDNN flash attention alone against attention as our layer runs it, forward + backward, at a config's shape.

    python benchmarks/attention_bench.py --config configs/bench/llama3_8b_4layers_seq8192.yml [--iters 20] \\
        [--json out.json] [key=value ...]

One layer's attention core on bf16 q [B, S, H, Dh], k and v [B, S, KV, Dh] from the config
(per_device_batch_size, max_target_length, heads, head_dim), each variant jitted as forward + backward
(the vjp with a random output gradient):

  cudnn        jax.nn.dot_product_attention(is_causal=True, implementation="cudnn"): the library alone
  cudnn_mask   the same plus a dense same-segment mask [B, 1, S, S] (what packed documents pay on this path)
  layer        the kernel our Attention layer calls for this config (`attention`; a mask only for packed data)
  layer_rope   RoPE on q and k, then that kernel: the layer's attention core without its projections
  xla          the XLA dot_product kernel, for reference

Times are medians over --iters runs after warm-up (wall clock around block_until_ready). TFLOP/s counts one
layer's causal attention FLOPs as MaxText does (MaxText/model/accounting.py: forward + backward = 3 x forward;
FA2-style counts add the backward's recomputed QK^T, 3.5 x). Needs an NVIDIA GPU for the cuDNN variants:
elsewhere it says so and exits 0 (--variants xla,layer runs the XLA ones anywhere). On an NVIDIA GPU the run
uses scripts/xla_flags.py's flags.
"""

import argparse
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from MaxText.config import absolute_path  # noqa: E402
from scripts import xla_flags  # noqa: E402  (no jax import: flags go in before jax starts its backend)

VARIANTS = ("cudnn", "cudnn_mask", "layer", "layer_rope", "xla")
CUDNN_VARIANTS = ("cudnn", "cudnn_mask")


def attention_fns(cfg):
  """{variant: fn(q, k, v) -> out} for the config's attention."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from MaxText.model import attention  # pylint: disable=import-outside-toplevel
  from MaxText import data  # pylint: disable=import-outside-toplevel

  b, s = int(cfg.per_device_batch_size), cfg.max_target_length
  segments = jnp.ones((b, s), jnp.int32) if data.packed_documents(cfg) else None
  positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
  inv_freq = attention.rope_frequencies(
    cfg.head_dim,
    cfg.rope_max_timescale,
    cfg.rope_type,
    cfg.rope_scaling_factor,
    cfg.rope_low_freq_factor,
    cfg.rope_high_freq_factor,
    cfg.rope_original_max_position,
  )
  kernel = attention.attention_kernel(cfg.attention)
  mask = jnp.ones((b, 1, s, s), bool)
  return {
    "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"),
    "cudnn_mask": lambda q, k, v: jax.nn.dot_product_attention(
      q, k, v, mask=mask, is_causal=True, implementation="cudnn"
    ),
    "layer": lambda q, k, v: kernel(q, k, v, segments),
    "layer_rope": lambda q, k, v: kernel(
      attention.apply_rope(q, positions, inv_freq), attention.apply_rope(k, positions, inv_freq), v, segments
    ),
    "xla": lambda q, k, v: attention.dot_product_attention(q, k, v, segments),
  }


def _median_ms(fn, args, iters):
  import jax  # pylint: disable=import-outside-toplevel

  for _ in range(3):  # compile, then warm
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * sorted(times)[len(times) // 2]


def measure(cfg, variants, iters):
  """[{variant, ms, tflops}] of forward + backward of one layer's attention core."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from MaxText.model import accounting  # pylint: disable=import-outside-toplevel

  b, s, h, kv, d = (
    int(cfg.per_device_batch_size),
    cfg.max_target_length,
    cfg.base_num_query_heads,
    cfg.base_num_kv_heads,
    cfg.head_dim,
  )
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (b, s, h, d), jnp.bfloat16)
  k, v = (jax.random.normal(key, (b, s, kv, d), jnp.bfloat16) for key in keys[1:3])
  d_out = jax.random.normal(keys[3], (b, s, h, d), jnp.bfloat16)
  flops = accounting.training_flops_per_device(cfg).attention_core / cfg.base_num_decoder_layers
  fns = attention_fns(cfg)
  rows = []
  for name in variants:
    fwd_bwd = jax.jit(lambda q, k, v, g, f=fns[name]: jax.vjp(f, q, k, v)[1](g))
    ms = _median_ms(fwd_bwd, (q, k, v, d_out), iters)
    rows.append({"variant": name, "ms": ms, "tflops": flops / (ms / 1e3) / 1e12})
  return rows


def markdown(rows, reference="cudnn"):
  base = next((r["ms"] for r in rows if r["variant"] == reference), None)
  lines = [f"| variant | ms (fwd+bwd, one layer) | TFLOP/s | vs {reference} |", "|---|---:|---:|---:|"]
  for r in rows:
    ratio = f"{r['ms'] / base:.2f}x" if base else "n/a"
    lines.append(f"| {r['variant']} | {r['ms']:.3f} | {r['tflops']:.1f} | {ratio} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", type=absolute_path, default=str(REPO / "configs/bench/llama3_8b_4layers_seq8192.yml"))
  parser.add_argument("--variants", type=lambda v: [x for x in v.split(",") if x], default=list(VARIANTS))
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--json", type=absolute_path, default="")
  args, overrides = parser.parse_known_args(argv)
  unknown = [v for v in args.variants if v not in VARIANTS]
  if unknown or not args.variants or args.iters < 1:
    print(
      f"error: --variants must name some of {', '.join(VARIANTS)} (got {','.join(args.variants)}) and --iters "
      "must be >= 1",
      file=sys.stderr,
    )
    raise SystemExit(2)
  xla_flags.apply_if_gpu()
  import jax  # pylint: disable=import-outside-toplevel
  from benchmarks import modes as modes_lib  # pylint: disable=import-outside-toplevel
  from MaxText import config  # pylint: disable=import-outside-toplevel

  if jax.default_backend() != "gpu" and any(v in CUDNN_VARIANTS for v in args.variants):
    print(
      f"attention_bench: the cuDNN variants need an NVIDIA GPU (this machine runs {jax.default_backend()}); "
      "nothing measured (--variants xla,layer,layer_rope run anywhere)"
    )
    return 0
  try:
    cfg = config.load(args.config, overrides)
  except config.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(2) from None
  rows = measure(cfg, args.variants, args.iters)
  info = modes_lib.machine()
  print(
    f"\nattention: {modes_lib.described(args.config, overrides)} (B {int(cfg.per_device_batch_size)}, S "
    f"{cfg.max_target_length}, {cfg.base_num_query_heads} q / {cfg.base_num_kv_heads} kv heads of "
    f"{cfg.head_dim}, attention={cfg.attention}; commit {info['commit']}, {info['device']})\n"
  )
  print(markdown(rows, "cudnn" if "cudnn" in args.variants else args.variants[0]))
  if args.json:
    modes_lib.write_json(args.json, info, args.config, overrides, rows)
  return 0


if __name__ == "__main__":
  sys.exit(main())
