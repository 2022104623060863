"""Greedy continuations of an exported model in Hugging Face transformers against our decode's JSONL, token for token.

Run outside CI, in a throwaway environment with torch and transformers (see scripts/make_tiny_llama.py):

    python -m MaxText.decode CONFIG load_parameters_path=EXPORT dtype=float32 prompts_file=P \
        max_target_length=48 decode_output_file=ours.jsonl
    /tmp/hfref/bin/python scripts/compare_with_transformers.py EXPORT ours.jsonl 48

transformers runs the export in float32, greedy, stopping at EOS or at the same total length (prompt + completion)
as our max_target_length; every prompt must encode to our prompt_ids and continue to our completion_ids.
"""

import json
import sys

import torch
import transformers

torch.set_num_threads(1)
export, ours_file, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = transformers.LlamaForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
tok = transformers.AutoTokenizer.from_pretrained(export)
ours = [json.loads(l) for l in open(ours_file)]
same = 0
for rec in ours:
  ids = tok(rec["prompt"])["input_ids"]
  assert ids == rec["prompt_ids"], (ids, rec["prompt_ids"])
  g = m.generate(
    torch.tensor([ids]),
    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
    max_new_tokens=total - len(ids),
    do_sample=False,
    pad_token_id=m.config.eos_token_id,
  )
  theirs = g[0, len(ids) :].tolist()
  same += theirs == rec["completion_ids"]
  print(f"{rec['prompt']!r}: transformers {len(theirs)} tokens, equal to ours: {theirs == rec['completion_ids']}")
print(f"transformers {transformers.__version__}: {same}/{len(ours)} greedy continuations equal")
sys.exit(0 if same == len(ours) else 1)
