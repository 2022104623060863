"""Decode speed: the KV cache against recomputing the whole sequence every step, and NVFP4 against BF16 MLPs.

    python benchmarks/decode_bench.py [--config configs/llama3_tiny.yml] [--contexts 128,1024] [--new-tokens 32]
                                      [--batch 1] [--repeats 3] [key=value ...]

For each context length C: a prompt of C random tokens, prefilled, then --new-tokens generated greedily
(max_target_length = C + new tokens) by (a) the compiled one-token step over the KV cache and (b) the full forward
pass over the whole sequence each step; and (c) the KV-cache decode with quantization=te_nvfp4. Decode tokens/s
(prefill excluded, compilation excluded; the median of --repeats runs) and the ratios, measured in one process.
The model is the config's, randomly initialised (speed doesn't depend on the weights).
"""

import argparse
import pathlib
import platform
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402

from benchmarks import provenance  # noqa: E402
from flax import nnx  # noqa: E402

from MaxText import config as config_lib  # noqa: E402
from MaxText import precision  # noqa: E402
from MaxText.inference.generate import Generator  # noqa: E402
from MaxText.model.decoder import Transformer, abstract_model  # noqa: E402


def tokens_per_second(cfg, params, use_cache, prompts, repeats):
  graphdef, _, rest = abstract_model(cfg)
  plan = precision.plan_from_config(cfg.replace(disable_stochastic_rounding=True))
  generate = Generator(cfg, graphdef, rest, plan.layer_ranges, len(prompts), use_cache=use_cache)
  rates = []
  for _ in range(repeats):
    result = generate(params, prompts)
    rates.append(result.decode_tokens / result.decode_seconds)
  return float(np.median(rates))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default=str(REPO / "configs" / "llama3_tiny.yml"))
  parser.add_argument("--contexts", default="128,1024")
  parser.add_argument("--new-tokens", type=int, default=32)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  rows = []
  for context in (int(c) for c in args.contexts.split(",")):
    base = [
      "dataset_type=synthetic",
      f"max_prefill_predict_length={context}",
      f"max_target_length={context + args.new_tokens}",
      f"per_device_batch_size={args.batch}",
      *args.overrides,
    ]
    cfg = config_lib.load(args.config, base)
    _, params, _ = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, cfg.vocab_size, context).tolist() for _ in range(args.batch * jax.device_count())]
    cached = tokens_per_second(cfg, params, True, prompts, args.repeats)
    recomputed = tokens_per_second(cfg, params, False, prompts, args.repeats)
    nvfp4 = tokens_per_second(cfg.replace(quantization="te_nvfp4"), params, True, prompts, args.repeats)
    rows.append((context, cached, recomputed, nvfp4))
  commit = provenance.commit() or "unknown"
  print(
    f"commit {commit}, {platform.node()}, {jax.devices()[0].platform} x{jax.device_count()}, "
    f"{pathlib.Path(args.config).name} ({cfg.dtype}), batch {args.batch * jax.device_count()}, "
    f"{args.new_tokens} new tokens, median of {args.repeats}"
  )
  print(
    "| context | KV cache tok/s | recompute tok/s | cache / recompute | KV cache te_nvfp4 tok/s | te_nvfp4 / bf16 |"
  )
  print(
    "|--------:|---------------:|----------------:|------------------:|------------------------:|----------------:|"
  )
  for context, cached, recomputed, nvfp4 in rows:
    print(
      f"| {context:>7} | {cached:>14.1f} | {recomputed:>15.1f} | {cached / recomputed:>16.1f}x | {nvfp4:>23.1f} | "
      f"{nvfp4 / cached:>14.2f}x |"
    )


if __name__ == "__main__":
  main()
