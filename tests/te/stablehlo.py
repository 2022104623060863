"""Custom calls read from a module exported for CUDA (jax.export's StableHLO text, with its locations): each call as it
runs (calls of private functions expanded), its target, backend config, operand and result types, the name scope
that issued it and, for each operand, the custom call result it is."""

import dataclasses
import re

_FUNC = re.compile(r"func\.func (?:public |private )?@([\w$.-]+)")
_LOC_DEF = re.compile(r"^(#loc\d*) = (.*)$", re.M)
_CALL = re.compile(r"^\s*(?:%[\w#:, ]+ = )?(?:func\.)?call @([\w$.-]+)\(")
_CUSTOM = re.compile(r"^\s*(?P<result>%[\w.]+)(?::\d+)? = stablehlo\.custom_call @(?P<target>[\w$.]+)\(")
_LOC_REF = re.compile(r"loc\((#loc\d*)\)\s*$")


@dataclasses.dataclass(frozen=True)
class CustomCall:
  """One custom call as it runs: `scope` is the name stack of its call sites and itself, outermost first."""

  target: str
  result: str  # its SSA name (%14), local to `function`
  operands: tuple  # SSA references (%14#1, %arg3)
  attributes: str  # the whole {...} attribute dictionary as printed
  operand_types: tuple
  result_types: tuple
  scope: str
  function: str

  @property
  def backend_config(self) -> dict:
    """mhlo.backend_config's scalar entries ({'use_rht': 'true', 'q_layout': '2', ...}, nested dicts flattened)."""
    match = re.search(r"mhlo\.backend_config = \{", self.attributes)
    if not match:
      return {}
    body = _balanced(self.attributes, match.end() - 1)
    return {k: v.split(" : ")[0].strip() for k, v in re.findall(r"(\w+) = ([^,{}]+)", body)}

  def signature(self):
    """What must agree for two calls to be the same call: target, attributes and types."""
    return self.target, self.attributes, self.operand_types, self.result_types


def _balanced(text, start):
  """The text of the bracketed group opening at text[start] ('{', '(' or '['), brackets included."""
  close = {"{": "}", "(": ")", "[": "]"}[text[start]]
  depth = 0
  for i in range(start, len(text)):
    depth += text[i] == text[start]
    depth -= text[i] == close
    if depth == 0:
      return text[start : i + 1]
  raise ValueError(f"unbalanced {text[start]} in {text[start : start + 200]}")


def _types(text):
  text = text.strip()
  if text.startswith("("):
    text = text[1:-1]
  return tuple(t.strip() for t in re.split(r",\s*(?=tensor<)", text) if t.strip())


def _parse_custom_call(line, scope, function):
  head = _CUSTOM.match(line)
  open_paren = head.end() - 1
  operands_text = _balanced(line, open_paren)
  rest = line[open_paren + len(operands_text) :].lstrip()
  attributes = _balanced(rest, 0) if rest.startswith("{") else ""
  signature = rest[len(attributes) :].split(" loc(")[0].strip().lstrip(":").strip()
  ins, outs = signature.split(" -> ")
  return CustomCall(
    head.group("target"),
    head.group("result"),
    tuple(o.strip() for o in operands_text[1:-1].split(",") if o.strip()),
    attributes,
    _types(ins),
    _types(outs),
    scope,
    function,
  )


def custom_calls(module_text):
  """[CustomCall] in program order, a private function's calls once per call of it (a loop body's once)."""
  bodies = {}
  for chunk in re.split(r"\n(?=\s*func\.func )", module_text):
    match = _FUNC.search(chunk.splitlines()[0]) if chunk.strip() else None
    if match:
      bodies[match.group(1)] = chunk
  locations = dict(_LOC_DEF.findall(module_text))

  def name(line):
    """The name-stack part of the line's location (jax's NameLoc), '' without one."""
    ref = _LOC_REF.search(line)
    text = locations.get(ref.group(1), "") if ref else ""
    for _ in range(20):
      named = re.match(r'loc\("([^"]*)"(?!:)', text)
      if named:
        return named.group(1)
      inner = re.match(r"loc\((?:callsite\()?(#loc\d*)", text)
      if not inner:
        return ""
      text = locations.get(inner.group(1), "")
    return ""

  def walk(function, scope, depth):
    if depth > 64:
      raise ValueError("call depth over 64: a recursive module?")
    for line in bodies[function].splitlines():
      if _CUSTOM.match(line):
        yield _parse_custom_call(line, f"{scope}/{name(line)}", function)
      elif (call := _CALL.match(line)) and call.group(1) in bodies:
        yield from walk(call.group(1), f"{scope}/{name(line)}", depth + 1)

  return list(walk("main", "", 0))


def producer(calls, call, operand_index):
  """(the custom call whose result `call`'s operand is, that result's index), or (None, None) for anything else."""
  ref = call.operands[operand_index]
  result, _, index = ref.partition("#")
  for candidate in calls:
    if candidate.function == call.function and candidate.result == result:
      return candidate, int(index or 0)
  return None, None
