"""Generate text from a trained or imported model (MaxText's decode.py and its keys):

    python -m MaxText.decode CONFIG [key=value ...]

prompt (or prompts_file, one prompt per line), load_parameters_path (else the newest checkpoint of the config's
run), max_prefill_predict_length, max_target_length, decode_sampling_strategy (greedy, weighted, topk, nucleus),
decode_sampling_temperature, decode_sampling_top_k, decode_sampling_nucleus_p, per_device_batch_size, seed,
decode_output_file (JSONL). The model runs the config's precision plan (quantization=te_nvfp4: the NVFP4 MLP forward
it was trained with, no stochastic rounding).
"""

import contextlib
import functools
import json
import os
import pathlib
import sys

import jax

from MaxText import checkpointing, cli, config as config_lib
from MaxText import data, precision
from MaxText.checkpointing import parameters
from MaxText.inference import sampling
from MaxText.model.decoder import abstract_model
from MaxText.runtime import distributed, sharding
from MaxText.errors import STORAGE_ERRNOS, UserError
from MaxText.inference.generate import Generator
from MaxText.quantization import cpu_gemm
from MaxText.trainer.run import matmul_precision


def check_decode_keys(cfg):
  """The decode keys' relations MaxText's key table can't check alone."""
  if cfg.max_prefill_predict_length >= cfg.max_target_length:
    raise UserError(
      f"max_prefill_predict_length={cfg.max_prefill_predict_length} must be < max_target_length="
      f"{cfg.max_target_length} (the prompt plus its completion)"
    )
  if cfg.decode_sampling_strategy == "topk" and not 1 <= cfg.decode_sampling_top_k <= cfg.vocab_size:
    raise UserError(
      f"decode_sampling_strategy=topk needs decode_sampling_top_k in [1, vocab_size={cfg.vocab_size}], "
      f"got {cfg.decode_sampling_top_k}"
    )
  if cfg.decode_sampling_strategy == "nucleus" and not 0 < cfg.decode_sampling_nucleus_p <= 1:
    raise UserError(
      f"decode_sampling_strategy=nucleus needs decode_sampling_nucleus_p in (0, 1], got {cfg.decode_sampling_nucleus_p}"
    )


def read_prompts(cfg):
  if not cfg.prompts_file:
    if not cfg.prompt:
      raise UserError("prompt is empty; give prompt=... or prompts_file=...")
    return [cfg.prompt]
  path = pathlib.Path(cfg.prompts_file)
  try:
    lines = [l for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
  except FileNotFoundError:
    raise UserError(f"prompts_file={path}: no such file") from None
  except OSError as e:  # a directory, no permission, ...
    raise UserError(
      f"prompts_file={path}: can't read it ({e.strerror or e}); give a text file, one prompt per line"
    ) from None
  except UnicodeDecodeError as e:
    raise UserError(f"prompts_file={path}: not UTF-8 text (byte {e.start})") from None
  if not lines:
    raise UserError(f"prompts_file={path} holds no prompt (one per line)")
  return lines


def encode_prompts(cfg, tokenizer, prompts):
  ids = [tokenizer.encode_prompt(p) for p in prompts]
  for n, (p, i) in enumerate(zip(prompts, ids), 1):
    if not i:
      raise UserError(f"prompt {n} ({p[:40]!r}) encodes to no tokens")
    if len(i) > cfg.max_prefill_predict_length:
      raise UserError(
        f"prompt {n} ({p[:40]!r}...) is {len(i)} tokens, more than max_prefill_predict_length="
        f"{cfg.max_prefill_predict_length}; raise it (below max_target_length={cfg.max_target_length})"
      )
  return ids


def load_params(cfg, params_template, log=print):
  """load_parameters_path, else the newest readable checkpoint of the config's run."""
  if cfg.load_parameters_path:
    return parameters.load(cfg, cfg.load_parameters_path, params_template), cfg.load_parameters_path
  run_dir = pathlib.Path(cfg.base_output_directory) / cfg.run_name if cfg.run_name else None
  restore = functools.partial(checkpointing.restore_params, params_template=params_template)
  found = parameters.read_newest(run_dir, restore, log) if run_dir else None
  if found is None:
    raise UserError(
      "nothing to decode: set load_parameters_path (a checkpoint step or Hugging Face directory, or an "
      "import's config.yml sets it) or run_name of a run with checkpoints"
    )
  step_dir, params = found
  return params, step_dir


def _decode_plan(cfg):
  """The config's precision plan for the forward pass alone: no stochastic rounding (it only touches gradients)."""
  plan = precision.plan_from_config(cfg.replace(disable_stochastic_rounding=True))
  stateful = {p.recipe.name for _, _, prec in plan.layer_ranges for p in prec.values() if p.recipe.stateful}
  if stateful:
    raise UserError(
      f"decode doesn't run {', '.join(sorted(stateful))} (its scales live in the training state's amax "
      "histories); decode with quantization='' or a current-scaling recipe"
    )
  return plan


def write_jsonl(path, records):
  """All records or none: a temporary file renamed into place."""
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
  try:
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)
  except OSError as e:
    with contextlib.suppress(OSError):  # the failure to say is the write's
      tmp.unlink(missing_ok=True)
    advice = STORAGE_ERRNOS.get(e.errno, "give a file in a directory you can write")
    raise UserError(f"decode_output_file={path}: can't write it ({e.strerror or e}): {advice}") from None


def decode(cfg, log=print):
  """The JSONL records of every prompt's completion (MaxText's `Input ... -> ...` lines printed as they come)."""
  check_decode_keys(cfg)
  prompts = read_prompts(cfg)
  tokenizer = data.tokenizers.load(cfg.tokenizer_type, cfg.tokenizer_path, cfg.vocab_size, cfg.add_bos)
  prompt_ids = encode_prompts(cfg, tokenizer, prompts)
  plan = _decode_plan(cfg)
  cpu_gemm.configure(cfg.cpu_gemm_dtype)
  distributed.initialize(cfg)
  devices = jax.devices()
  batch = config_lib.RunShape.of(cfg, len(devices)).global_batch_size
  mesh = sharding.make_mesh(cfg, devices)
  graphdef, abstract_params, rest = abstract_model(cfg)
  with sharding.use_mesh(mesh), matmul_precision(cfg):
    shardings = sharding.param_shardings(abstract_params, mesh)
    template = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params, shardings)
    params, source = load_params(cfg, template, log)
    log(
      f"decoding {len(prompts)} prompt(s) with the parameters of {source}, batch {batch}, "
      f"{cfg.decode_sampling_strategy} sampling, plan: {cfg.quantization or 'bf16'} MLP GEMMs"
    )
    generator = Generator(
      cfg, graphdef, rest, plan.layer_ranges, batch, sampling=sampling.from_config(cfg), eos_id=tokenizer.eos_id
    )
    records = []
    for start in range(0, len(prompts), batch):
      chunk = prompt_ids[start : start + batch]
      result = generator(params, chunk + [chunk[0]] * (batch - len(chunk)), seed=cfg.seed + start)
      rates = {
        "prefill_tokens_per_second": result.prefill_tokens / max(result.prefill_seconds, 1e-9),
        "decode_tokens_per_second": result.decode_tokens / max(result.decode_seconds, 1e-9),
      }
      for i, ids in enumerate(chunk):
        completion = tokenizer.decode([t for t in result.completions[i] if t != tokenizer.eos_id])
        records.append(
          {
            "prompt": prompts[start + i],
            "prompt_ids": ids,
            "completion_ids": result.completions[i],
            "completion": completion,
            **rates,
          }
        )
        log(f"Input `{prompts[start + i]}` -> `{completion}`")
  if cfg.decode_output_file:
    write_jsonl(cfg.decode_output_file, records)
  return records


def _decode(argv):
  decode(config_lib.load(*config_lib.split_argv(argv)))


def main(argv=None):
  return cli.run(__doc__, argv, _decode)


if __name__ == "__main__":
  sys.exit(main())
