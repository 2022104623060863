"""A lowered module's StableHLO text (what XLA is handed, any backend) read by the tests: one walker that expands
every function call in program order (a private function's ops once per call of it; a loop body's once), and what
the tests read from it -- GEMM FLOPs by operand dtype (`dot_flops_by_dtype`) and custom calls with their targets,
backend configs, types and name scopes (`custom_calls`, `producer`).

Lower with unrolled layers and one micro-batch to count a whole step. With `f8_dequantized`, a dot operand that is an
f8 tensor converted to a wider type, optionally times a broadcast scalar (a dequantized per-tensor FP8 operand, which
XLA:GPU's GEMM rewriter turns into an FP8 GEMM with that scalar as its scale), counts as its f8 dtype: for a module
lowered for CUDA (on a CPU the same pattern is a GEMM on the wider type).
"""

import collections
import dataclasses
import math
import re

_FUNC = re.compile(r"func\.func (?:public |private )?@([\w$.-]+)")
_CALL = re.compile(r"^\s*(?:%[\w#:, ]+ = )?(?:func\.)?call @([\w$.-]+)\(")
_DEF = re.compile(r"^\s*(%[\w#.]+)(?::\d+)? = (\"?stablehlo\.\w+\"?) (.*)$")
_DOT = re.compile(
  r"stablehlo\.dot_general (%[\w#.]+), (%[\w#.]+), .*?contracting_dims = \[([\d, ]*)\] x \[[\d, ]*\].*?"
  r":\s*\(tensor<([^>]*)>, tensor<([^>]*)>\)\s*->\s*tensor<([^>]*)>"
)
_F8_CONVERT = re.compile(r"stablehlo\.convert %[\w#.]+ : \(tensor<[\dx]*x(f8\w+)>\)")
_CUSTOM = re.compile(r"^\s*(?P<result>%[\w.]+)(?::\d+)? = stablehlo\.custom_call @(?P<target>[\w$.]+)\(")
_LOC_DEF = re.compile(r"^(#loc\d*) = (.*)$", re.M)
_LOC_REF = re.compile(r"loc\((#loc\d*)\)\s*$")
TENSOR_CORE_DTYPES = frozenset({"bf16", "f16", "f8E4M3FN", "f8E5M2", "f4E2M1FN"})


@dataclasses.dataclass(frozen=True)
class Op:
  """One op line as it runs: its function, the name stack of its call sites and itself, and the definitions of the
  function's values so far (the latest of each name: branches of a region reuse names)."""

  line: str
  function: str
  scope: str
  defs: dict


def _functions(text):
  """{function name: its text} of an MLIR module."""
  bodies = {}
  for chunk in re.split(r"\n(?=\s*func\.func )", text):
    match = _FUNC.search(chunk.splitlines()[0]) if chunk.strip() else None
    if match:
      bodies[match.group(1)] = chunk
  return bodies


def _scope_namer(text):
  """name(line): the name-stack part of a line's location (jax's NameLoc), '' without one."""
  locations = dict(_LOC_DEF.findall(text))

  def name(line):
    ref = _LOC_REF.search(line)
    loc = locations.get(ref.group(1), "") if ref else ""
    for _ in range(20):
      named = re.match(r'loc\("([^"]*)"(?!:)', loc)
      if named:
        return named.group(1)
      inner = re.match(r"loc\((?:callsite\()?(#loc\d*)", loc)
      if not inner:
        return ""
      loc = locations.get(inner.group(1), "")
    return ""

  return name


def ops(text, entry="main"):
  """Every op line reachable from `entry`, in program order, calls expanded: a generator of Op, whose `defs` are
  those at that line (read each before taking the next)."""
  bodies, name = _functions(text), _scope_namer(text)

  def walk(function, scope, depth):
    if depth > 64:
      raise ValueError("call depth over 64: a recursive module?")
    defs = {}
    for line in bodies[function].splitlines()[1:]:
      definition = _DEF.match(line)
      if definition:
        defs[definition.group(1)] = line
      call = _CALL.match(line)
      if call and call.group(1) in bodies:
        yield from walk(call.group(1), f"{scope}/{name(line)}", depth + 1)
      else:
        yield Op(line, function, f"{scope}/{name(line)}", defs)

  if entry in bodies:
    yield from walk(entry, "", 0)


# -- GEMM FLOPs by operand dtype ---------------------------------------------------------------------------------


def _shape_and_dtype(tensor_type):
  *dims, dtype = tensor_type.split("x")
  return [int(d) for d in dims], dtype


def _f8_source(name, defs, depth=0):
  """The f8 dtype `name` is dequantized from (a convert of an f8 tensor, or that times a broadcast), else None."""
  line = defs.get(name)
  if line is None or depth > 2:
    return None
  match = _F8_CONVERT.search(line)
  if match:
    return match.group(1)
  op, rest = _DEF.match(line).group(2, 3)
  if op == "stablehlo.multiply":
    operands = re.findall(r"%[\w#.]+", rest.split(":")[0])[:2]
    sources = [_f8_source(o, defs, depth + 1) for o in operands]
    others = [defs.get(o, "") for o, src in zip(operands, sources) if src is None]
    if any(sources) and all("stablehlo.broadcast_in_dim" in d for d in others):
      return next(src for src in sources if src)
  return None


def dot_flops_by_dtype(stablehlo_text, entry="main", f8_dequantized=False):
  """{(lhs dtype, rhs dtype): FLOPs} of every dot_general reachable from `entry`, 2 x (result elements) x
  (contracted elements), each as many times as it runs."""
  total = collections.Counter()
  for op in ops(stablehlo_text, entry):
    dot = _DOT.search(op.line)
    if not dot:
      continue
    contracting = [int(i) for i in dot.group(3).replace(" ", "").split(",") if i]
    lhs_shape, lhs_dtype = _shape_and_dtype(dot.group(4))
    _, rhs_dtype = _shape_and_dtype(dot.group(5))
    out_shape, _ = _shape_and_dtype(dot.group(6))
    if f8_dequantized:
      lhs_dtype = _f8_source(dot.group(1), op.defs) or lhs_dtype
      rhs_dtype = _f8_source(dot.group(2), op.defs) or rhs_dtype
    total[(lhs_dtype, rhs_dtype)] += 2 * math.prod(out_shape) * math.prod(lhs_shape[i] for i in contracting)
  return dict(total)


def tensor_core_share(flops_by_dtype):
  """Fraction of dot FLOPs whose operands are both tensor-core dtypes (bf16 / f16 / f8 / f4)."""
  total = sum(flops_by_dtype.values())
  fast = sum(f for (a, b), f in flops_by_dtype.items() if a in TENSOR_CORE_DTYPES and b in TENSOR_CORE_DTYPES)
  return fast / total if total else 1.0


# -- custom calls ------------------------------------------------------------------------------------------------


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


def _custom_call(op):
  head = _CUSTOM.match(op.line)
  open_paren = head.end() - 1
  operands_text = _balanced(op.line, open_paren)
  rest = op.line[open_paren + len(operands_text) :].lstrip()
  attributes = _balanced(rest, 0) if rest.startswith("{") else ""
  signature = rest[len(attributes) :].split(" loc(")[0].strip().lstrip(":").strip()
  ins, outs = signature.split(" -> ")
  operands = tuple(o.strip() for o in operands_text[1:-1].split(",") if o.strip())
  return CustomCall(
    head.group("target"), head.group("result"), operands, attributes, _types(ins), _types(outs), op.scope, op.function
  )


def custom_calls(module_text):
  """[CustomCall] in program order, a private function's calls once per call of it (a loop body's once)."""
  return [_custom_call(op) for op in ops(module_text) if _CUSTOM.match(op.line)]


def producer(calls, call, operand_index):
  """(the custom call whose result `call`'s operand is, that result's index), or (None, None) for anything else."""
  ref = call.operands[operand_index]
  result, _, index = ref.partition("#")
  for candidate in calls:
    if candidate.function == call.function and candidate.result == result:
      return candidate, int(index or 0)
  return None, None
