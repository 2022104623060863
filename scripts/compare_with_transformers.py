"""Greedy continuations of a Hugging Face checkpoint in transformers against our decode's JSONL, token for token.

Run outside CI, in a throwaway environment with torch and transformers (see scripts/make_tiny_llama.py):

    python -m MaxText.decode CONFIG load_parameters_path=HF_DIR dtype=float32 prompts_file=P \
        max_target_length=48 decode_output_file=ours.jsonl
    /tmp/tfvenv/bin/python scripts/compare_with_transformers.py HF_DIR ours.jsonl 48 [--new-tokens N]

transformers runs HF_DIR (an export, or the checkpoint an import came from) in float32, greedy, stopping at EOS or
at the same total length (prompt + completion) as our max_target_length, or after N new tokens; every prompt must
encode to our prompt_ids (transformers' AutoTokenizer: BOS as its files say) and continue to our completion_ids.
Where the two part, the step is a near-tie if transformers' logits of the two tokens there (its own, given our
tokens before) are within --near-tie: float32 rounding (ours vs torch's) may then pick either.
"""

import argparse
import json
import sys

import torch
import transformers


def first_difference(a, b):
  return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("hf_dir")
  parser.add_argument("ours", help="our decode_output_file (JSONL)")
  parser.add_argument("total", type=int, help="our max_target_length")
  parser.add_argument("--new-tokens", type=int, default=0, help="compare at most this many new tokens (0: all)")
  parser.add_argument("--near-tie", type=float, default=1e-3, help="logit gap below which a step is a near-tie")
  args = parser.parse_args()
  torch.set_num_threads(1)
  m = transformers.LlamaForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
  tok = transformers.AutoTokenizer.from_pretrained(args.hf_dir)
  ours = [json.loads(l) for l in open(args.ours, encoding="utf-8")]
  agree = 0
  for rec in ours:
    ids = tok(rec["prompt"])["input_ids"]
    assert ids == rec["prompt_ids"], (ids, rec["prompt_ids"])
    new = args.total - len(ids) if not args.new_tokens else min(args.new_tokens, args.total - len(ids))
    g = m.generate(
      torch.tensor([ids]),
      attention_mask=torch.ones(1, len(ids), dtype=torch.long),
      max_new_tokens=new,
      do_sample=False,
      pad_token_id=m.config.eos_token_id,
    )
    theirs, mine = g[0, len(ids) :].tolist(), rec["completion_ids"][:new]
    at = first_difference(theirs, mine)
    if at is None and len(theirs) == len(mine):
      agree += 1
      print(f"{rec['prompt']!r}: {len(theirs)} tokens, all equal")
      continue
    if at is None:
      print(f"{rec['prompt']!r}: equal for {min(len(theirs), len(mine))} tokens, then one stops (EOS) first")
      continue
    with torch.no_grad():
      logits = m(input_ids=torch.tensor([ids + mine[:at]])).logits[0, -1].double()
    gap = float(logits[theirs[at]] - logits[mine[at]])
    tie = gap < args.near_tie
    agree += tie
    print(
      f"{rec['prompt']!r}: equal for {at} of {len(theirs)} tokens; at {at} transformers {theirs[at]}, ours "
      f"{mine[at]}, logit gap {gap:.2e}: {'a near-tie' if tie else 'NOT a near-tie'}"
    )
  print(f"transformers {transformers.__version__}: {agree}/{len(ours)} greedy continuations equal (up to near-ties)")
  return 0 if agree == len(ours) else 1


if __name__ == "__main__":
  sys.exit(main())
