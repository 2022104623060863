"""The distribution's metadata: pyproject.toml declares what training needs, the same packages requirements.txt pins
(each pin within its range), and the development tools stay out of both."""

import tomllib

from packaging.requirements import Requirement

from tests.conftest import REPO

DEV_TOOLS = {"pytest", "pytest-xdist", "ruff", "matplotlib"}


def _pins(path):
  lines = (l.split("#")[0].strip() for l in path.read_text(encoding="utf-8").splitlines())
  return {Requirement(l).name.lower(): Requirement(l) for l in lines if l}


def test_pyproject_declares_the_packages_requirements_txt_pins():
  declared = {
    Requirement(r).name.lower(): Requirement(r)
    for r in tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
  }
  pinned = _pins(REPO / "requirements.txt")
  assert set(declared) == set(pinned) - {"jaxlib"}  # jaxlib: jax's own dependency, pinned with it
  for name, requirement in declared.items():
    (version,) = [s.version for s in pinned[name].specifier]
    assert requirement.specifier.contains(version), (name, str(requirement.specifier), version)
  assert not DEV_TOOLS & set(pinned)
  assert DEV_TOOLS <= set(_pins(REPO / "requirements-dev.txt"))
