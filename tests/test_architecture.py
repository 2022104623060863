"""The layout's rules, read from the source: the quantization library imports nothing from the rest of MaxText,
packages import only downwards (config -> runtime/data/checkpointing -> precision -> model -> trainer -> hooks ->
run setup -> the CLI), modules import in no cycle, every user-facing error has one of the two roots the CLI
catches, and no function is longer than 60 lines."""

import ast
import importlib
import inspect
import pathlib

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "MaxText"
# Lower ranks never import higher ones; within a rank only the same package imports itself.
RANKS = [
  ("MaxText.errors", 0),
  ("MaxText.quantization", 0),
  ("MaxText.config", 1),
  ("MaxText.storage", 1),  # local paths and URLs (fsspec), for everything above that reads or writes files
  ("MaxText.runtime", 2),
  ("MaxText.cli", 2.5),  # what the command lines share: one-line errors, the signals and environment (runtime)
  ("MaxText.aot", 2),  # GPU targets, compile-only devices, optimized-HLO reading, the roofline (no trainer)
  ("MaxText.data", 2),
  ("MaxText.precision", 3),
  ("MaxText.checkpointing", 4),  # Orbax, starting parameters, Hugging Face files (shardings, tokenizers, the plan)
  ("MaxText.model", 5),
  ("MaxText.trainer", 6),  # its step functions, optimizer, preflight and loop
  ("MaxText.inference", 6),  # generation from a model: prefill, KV-cache decode steps, sampling
  ("MaxText.trainer.hooks", 7),  # what the loop calls
  ("MaxText.trainer.run_setup", 8),  # building a run: its hooks included
  ("MaxText.trainer.aot_step", 8.5),  # the run's step compiled ahead of time (train_compile, dry_run, preflight)
  ("MaxText.trainer.run", 9),  # a run from start to end
  ("MaxText.train", 10),  # the CLI
  ("MaxText.convert_hf", 10),  # the Hugging Face conversion CLI
  ("MaxText.decode", 10),  # the generation CLI
  ("MaxText.train_compile", 10),  # the ahead-of-time compilation CLI
]


def _module_name(path: pathlib.Path):
  parts = path.relative_to(REPO).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _target(name):
  """The module an import of `name` loads: the longest known module that `name` starts with."""
  while name and name not in MODULES:
    name = name.rpartition(".")[0]
  return name


def imports(module):
  """{imported MaxText module} of `module`: import statements anywhere in it (lazy ones too) and
  importlib.import_module("MaxText....") calls."""
  tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      # `from pkg import name` loads pkg.name where that is a module, else pkg itself.
      found.update(
        f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
        for alias in node.names
      )
    elif (
      isinstance(node, ast.Call)
      and getattr(node.func, "attr", None) == "import_module"
      and node.args
      and isinstance(node.args[0], ast.Constant)
      and isinstance(node.args[0].value, str)
    ):
      found.add(node.args[0].value)
  return {_target(n) for n in found if n == "MaxText" or n.startswith("MaxText.")} - {module, ""}


def _rank(module):
  """(the RANKS prefix `module` falls under, its rank); a module under none must be given a place there."""
  matches = [(p, r) for p, r in RANKS if module == p or module.startswith(p + ".")]
  assert matches, f"{module} has no place in RANKS (tests/test_architecture.py): add it where its data flows"
  return max(matches, key=lambda pr: len(pr[0]))


def test_the_quantization_library_imports_nothing_from_the_rest_of_maxtext():
  outside = {
    m: sorted(i for i in imports(m) if not i.startswith("MaxText.quantization"))
    for m in MODULES
    if m.startswith("MaxText.quantization")
  }
  assert not {m: i for m, i in outside.items() if i}
  assert len(outside) > 20  # every module of the library was read


def test_packages_import_only_downwards():
  upward = []
  for module in MODULES:
    if module == "MaxText":
      continue
    package, rank = _rank(module)
    for imported in imports(module):
      other_package, other_rank = _rank(imported)
      if other_rank > rank or (other_rank == rank and other_package != package):
        upward.append(f"{module} -> {imported}")
  assert not upward


def test_modules_import_in_no_cycle():
  graph = {m: imports(m) for m in MODULES}
  state, cycles = {}, []

  def visit(module, path):
    state[module] = "open"
    for other in sorted(graph[module]):
      if state.get(other) == "open":
        cycles.append(" -> ".join(path[path.index(other) :] + [other]))
      elif other not in state:
        visit(other, path + [other])
    state[module] = "done"

  for module in sorted(graph):
    if module not in state:
      visit(module, [module])
  assert not cycles


def test_every_error_has_one_of_the_two_roots_the_cli_catches():
  from MaxText import train  # pylint: disable=import-outside-toplevel
  from MaxText.errors import UserError  # pylint: disable=import-outside-toplevel
  from MaxText.quantization.errors import QuantizationError  # pylint: disable=import-outside-toplevel

  assert train.USER_ERRORS == (UserError, QuantizationError)
  errors = {}
  for module in MODULES:
    if module.endswith("__main__"):
      continue
    for name, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass):
      if name.endswith("Error") and cls.__module__ == module:
        errors[f"{module}.{name}"] = cls
  assert len(errors) >= 12
  for name, cls in errors.items():
    root = QuantizationError if name.startswith("MaxText.quantization.") else UserError
    assert issubclass(cls, root), name


@pytest.mark.parametrize("directory", ["model", "config", "trainer"])
def test_no_recipe_name_is_compared_outside_precision_and_quantization(directory):
  """The model, the config and the trainer ask a recipe what it is (recipe.format, .stateful, .te_name ...)."""
  for path in (PACKAGE / directory).rglob("*.py"):
    text = path.read_text(encoding="utf-8")
    assert '"te_' not in text and 'startswith("te_' not in text, path


# Short functions, nanodo's style: a function past this many lines (decorators and docstring included) is split.
MAX_FUNCTION_LINES = 60


def test_no_function_in_maxtext_is_longer_than_the_style_allows():
  long = []
  for module, path in MODULES.items():
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        if node.end_lineno - first + 1 > MAX_FUNCTION_LINES:
          long.append(f"{module}.{node.name}: {node.end_lineno - first + 1} lines")
  assert not long
  assert len(MODULES) > 100  # the whole package was read
