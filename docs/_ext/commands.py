"""The shell blocks of the docs and README and how each is tested: the comment line right before a fenced block says
`<!-- docs-test: run -->` (make test runs it), `<!-- docs-test: slow -->` (make test-all) or
`<!-- docs-test: skip (why) -->` (never run, and says why); `run (continues)` or `slow (continues)` runs the page's
previous shell block first, in the same directory (a block that uses what the one before made). A `console` block
is `$ command` lines, each followed by output lines that must appear in what it printed (a line ending in `...` is a
prefix)."""

import dataclasses
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
SHELL_LANGS = ("bash", "sh", "shell", "console")
_MARK = re.compile(r"^\s*<!-- docs-test: (run|slow|skip)\b\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


@dataclasses.dataclass(frozen=True)
class Block:
  """A fenced block: where it is, its language, its text (fence indentation removed) and its docs-test mark."""

  path: pathlib.Path
  line: int  # 1-based line of the opening fence
  lang: str
  text: str
  mark: str  # "run", "slow", "skip" or "" (unmarked)
  reason: str = ""

  @property
  def continues(self):
    """Whether the block uses what the page's previous shell block made (its mark says `(continues)`)."""
    return self.mark in ("run", "slow") and "continues" in self.reason

  @property
  def where(self):
    return f"{self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path}:{self.line}"


def blocks(path):
  """Every fenced block of the Markdown file `path`, in order."""
  lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
  out, i = [], 0
  while i < len(lines):
    m = _FENCE.match(lines[i])
    if not m:
      i += 1
      continue
    indent, fence, lang = m.group(1), m.group(2), m.group(3)
    prev = lines[i - 1] if i else ""
    mark = _MARK.match(prev)
    body, j = [], i + 1
    while j < len(lines) and not lines[j].strip().startswith(fence[0] * len(fence)):
      body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
      j += 1
    out.append(
      Block(
        pathlib.Path(path),
        i + 1,
        lang,
        "\n".join(body) + "\n",
        mark.group(1) if mark else "",
        mark.group(2) if mark else "",
      )
    )
    i = j + 1
  return out


def documented_files():
  """README.md and every page of the site (the generated and the included measured record aside)."""
  docs = REPO / "docs"
  pages = [p for p in sorted(docs.rglob("*.md")) if not p.relative_to(docs).parts[0].startswith("_")]
  return [REPO / "README.md", *pages]


def shell_blocks(files=None):
  """The shell and console blocks of `files` (default: documented_files())."""
  return [b for f in (files or documented_files()) for b in blocks(f) if b.lang in SHELL_LANGS]


def chain(block, all_blocks):
  """The blocks to run for `block`, in order: the page's earlier shell blocks it continues from, then itself."""
  same_page = [b for b in all_blocks if b.path == block.path and b.lang in SHELL_LANGS]
  i = same_page.index(block)
  start = i
  while start > 0 and same_page[start].continues:
    start -= 1
  return same_page[start : i + 1]


def console_steps(text):
  """[(command, [expected output lines])] of a console block: `$ ` starts a command (a trailing backslash continues
  it), the lines up to the next `$ ` are its output."""
  steps, lines = [], text.splitlines()
  i = 0
  while i < len(lines):
    line = lines[i]
    if not line.startswith("$ "):
      if steps:
        steps[-1][1].append(line)
      i += 1
      continue
    command = line[2:]
    while command.endswith("\\") and i + 1 < len(lines):
      i += 1
      command = command[:-1] + " " + lines[i].strip()
    steps.append((command, []))
    i += 1
  return [(c, [e for e in expected if e.strip()]) for c, expected in steps]


def output_matches(expected, output):
  """Whether the expected line appears in `output`: whole, or as a prefix where it ends in '...'."""
  stripped = expected.rstrip()
  if stripped.endswith("..."):
    return stripped[:-3].rstrip() in output
  return stripped in output
