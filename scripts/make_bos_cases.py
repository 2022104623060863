"""Makes tests/data/hf_bos: tokenizer files of tests/data/hf_tiny's model that start a prompt with BOS or without,
and what Hugging Face transformers does with each (the reference the add_bos tests compare against).

Run once, offline, in a throwaway environment (transformers and torch are not dependencies of this project):

    python3.11 -m venv /tmp/tfvenv
    /tmp/tfvenv/bin/pip install torch==2.13.0 transformers safetensors tokenizers
    /tmp/tfvenv/bin/python scripts/make_bos_cases.py

Each case is a directory of tokenizer files (tokenizer.json, and tokenizer_config.json where the case has one);
with tests/data/hf_tiny's weights and config.json beside them it is a checkpoint (the script and the tests build it
so). reference.json holds, per case, the tokenizer class transformers picks and the ids of every prompt as
`tokenizer(prompt)["input_ids"]`; for the case without BOS also transformers' float32 greedy continuation
(`generate`, do_sample=False, up to CONTINUATION new tokens or EOS) of the first prompts whose greedy path keeps every
top-1/top-2 logit margin above MIN_MARGIN, with those margins. `--check DIR` prints the prompt ids only (any
transformers version, no torch needed), e.g. to see what transformers 4 makes of the same files.
"""

import argparse
import copy
import json
import pathlib
import shutil
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
HF_TINY = REPO / "tests" / "data" / "hf_tiny"
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
PROMPTS = (
  "ROMEO.",
  "To be, or not to be,",
  "What is the matter, my lord?",
  "Enter",
  "Good night,",
  "MACBETH.",
  "O Romeo, Romeo!",
  "My lord,",
  "The king",
  "Thou art",
)
GREEDY_CASE, GREEDY_KEPT, CONTINUATION, MIN_MARGIN = "no_post_processor", 3, 40, 0.005
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def cases():
  """{name: (post-processor of tokenizer.json, tokenizer_config.json or None, one line saying what it is)}."""
  tok = json.loads((HF_TINY / "tokenizer.json").read_text(encoding="utf-8"))
  config = json.loads((HF_TINY / "tokenizer_config.json").read_text(encoding="utf-8"))
  llama = {**config, "tokenizer_class": "LlamaTokenizerFast"}  # as Llama 2/3 checkpoints name it
  bos_template = tok["post_processor"]
  return {
    "post_processor_bos": (bos_template, config, "Llama 3's: a TemplateProcessing post-processor puts BOS first"),
    "no_post_processor": (
      None,
      None,
      "no post-processor, no tokenizer_config.json (a checkpoint whose tokenizer adds no BOS)",
    ),
    "add_bos_token_false": (
      bos_template,
      {**llama, "add_bos_token": False},
      "BOS post-processor, tokenizer_config.json add_bos_token false",
    ),
    "add_bos_token_true_no_post_processor": (
      None,
      {**llama, "add_bos_token": True},
      "no post-processor, tokenizer_config.json add_bos_token true",
    ),
    "byte_level_post_processor": (BYTE_LEVEL, config, "a ByteLevel post-processor (GPT-2, Qwen): adds no token"),
  }


def write_case(out, post_processor, tokenizer_config):
  """The case's tokenizer files into `out`."""
  tok = json.loads((HF_TINY / "tokenizer.json").read_text(encoding="utf-8"))
  tok["post_processor"] = copy.deepcopy(post_processor)
  out.mkdir(parents=True, exist_ok=True)
  (out / "tokenizer.json").write_text(json.dumps(tok, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
  if tokenizer_config is not None:
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")


def checkpoint(case_dir, out):
  """hf_tiny's weights and config.json with the case's tokenizer files: a checkpoint directory `out`."""
  out.mkdir(parents=True)
  for f in HF_TINY.iterdir():
    if f.name not in ("tokenizer.json", "tokenizer_config.json", "reference.json", "reference.npz"):
      shutil.copyfile(f, out / f.name)
  for f in case_dir.iterdir():
    shutil.copyfile(f, out / f.name)
  return out


def greedy(model, tok, prompt):
  """transformers' greedy continuation of `prompt` and the top-1 minus top-2 logit margin at every new token."""
  import torch  # pylint: disable=import-outside-toplevel

  ids = tok(prompt)["input_ids"]
  with torch.no_grad():
    out = model.generate(
      torch.tensor([ids]),
      attention_mask=torch.ones(1, len(ids), dtype=torch.long),
      max_new_tokens=CONTINUATION,
      do_sample=False,
      pad_token_id=model.config.eos_token_id,
    )[0].tolist()
    logits = model(input_ids=torch.tensor([out])).logits[0].double()
  top = torch.topk(logits[len(ids) - 1 : len(out) - 1], 2).values
  return out[len(ids) :], (top[:, 0] - top[:, 1]).tolist()


def prompt_ids(directory):
  import transformers  # pylint: disable=import-outside-toplevel

  tok = transformers.AutoTokenizer.from_pretrained(directory)
  return tok, {p: tok(p)["input_ids"] for p in PROMPTS}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=str(REPO / "tests" / "data" / "hf_bos"))
  parser.add_argument("--check", metavar="DIR", help="print what transformers makes of the cases in DIR; write nothing")
  args = parser.parse_args()
  import transformers  # pylint: disable=import-outside-toplevel

  if args.check:
    for case in sorted(p for p in pathlib.Path(args.check).iterdir() if p.is_dir()):
      with tempfile.TemporaryDirectory() as tmp:
        try:
          tok, ids = prompt_ids(checkpoint(case, pathlib.Path(tmp) / "ckpt"))
          print(f"transformers {transformers.__version__} {case.name}: {type(tok).__name__} {ids[PROMPTS[0]]}")
        except Exception as e:  # pylint: disable=broad-except  (an older transformers may not read a case)
          print(f"transformers {transformers.__version__} {case.name}: can't load it ({type(e).__name__}: {e})")
    return 0

  import torch  # pylint: disable=import-outside-toplevel

  torch.set_num_threads(1)
  out = pathlib.Path(args.out)
  reference = {
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "command": "python scripts/make_bos_cases.py (in a venv with transformers and torch)",
    "model": "tests/data/hf_tiny (weights, config.json) with each case's tokenizer files",
    "prompts": list(PROMPTS),
    "cases": {},
  }
  for name, (post_processor, tokenizer_config, what) in cases().items():
    write_case(out / name, post_processor, tokenizer_config)
    with tempfile.TemporaryDirectory() as tmp:
      ckpt = checkpoint(out / name, pathlib.Path(tmp) / "ckpt")
      tok, ids = prompt_ids(ckpt)
      record = {"what": what, "tokenizer_class": type(tok).__name__, "prompt_ids": ids}
      bos = tok.convert_tokens_to_ids(BOS)
      record["starts_with_bos"] = all(i[0] == bos for i in ids.values())
      assert record["starts_with_bos"] or not any(i[0] == bos for i in ids.values()), ids
      if name == GREEDY_CASE:
        model = transformers.LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        kept = []
        for prompt in PROMPTS:
          completion, margins = greedy(model, tok, prompt)
          text = tok.decode(completion)
          print(f"{name} {prompt!r} -> {text!r} (smallest margin {min(margins):.4f})", flush=True)
          if min(margins) >= MIN_MARGIN:
            kept.append({"prompt": prompt, "greedy_ids": completion, "greedy_text": text, "margins": margins})
          if len(kept) == GREEDY_KEPT:
            break
        assert len(kept) == GREEDY_KEPT, "too few prompts with clear greedy margins"
        record["greedy"] = {"dtype": "float32", "max_new_tokens": CONTINUATION, "min_margin": MIN_MARGIN}
        record["greedy"]["prompts"] = kept
      reference["cases"][name] = record
      print(f"{name}: {type(tok).__name__}, starts with BOS: {record['starts_with_bos']}", flush=True)
  (out / "reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
  print(f"wrote {out}: {sorted(p.name for p in out.iterdir())}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
