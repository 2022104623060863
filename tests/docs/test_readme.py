"""README.md is the short front page: at most 10 KB, the two commands (train, test), and links that land on files
and headings of the docs that exist."""

import re

from tests.conftest import REPO

README = REPO / "README.md"


def _slug(heading):
  """A heading's anchor as GitHub and MyST make it: lower case, punctuation dropped, spaces to hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path):
  text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
  return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_readme_is_short_and_has_the_two_commands():
  text = README.read_text(encoding="utf-8")
  assert len(text.encode("utf-8")) <= 10 * 1024
  block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1)
  assert [line.split()[:2] for line in block.splitlines()] == [["make", "train"], ["make", "test"]]


def test_readme_links_land():
  text = README.read_text(encoding="utf-8")
  links = [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"^[a-z]+://", m)]
  assert len(links) >= 10
  for link in links:
    path, _, anchor = link.partition("#")
    target = REPO / path
    assert target.exists(), link
    if anchor:
      assert anchor in _anchors(target), link


def test_slug_is_myst_and_githubs():
  assert _slug("The precision plan") == "the-precision-plan"
  assert (
    _slug("Hugging Face import / export: memory (CPU, issue #33)") == "hugging-face-import--export-memory-cpu-issue-33"
  )
