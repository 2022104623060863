"""GEMM FLOPs by operand dtype, read from a lowered module's StableHLO text (what XLA is handed, any backend).

Counts every `stablehlo.dot_general` as 2 x (result elements) x (contracted elements), weighted by how
many times its function is called from `main` (jitted helpers lower to private functions). Loop
bodies count once: lower with unrolled layers and one micro-batch to count a whole step. With `f8_dequantized`, an
operand that is an f8 tensor converted to a wider type, optionally times a broadcast scalar (a dequantized
per-tensor FP8 operand, which XLA:GPU's GEMM rewriter turns into an FP8 GEMM with that scalar as its scale), counts
as its f8 dtype: for a module lowered for CUDA (on a CPU the same pattern is a GEMM on the wider type).
"""

import collections
import math
import re

_FUNC = re.compile(r"func\.func (?:public |private )?@([\w.$-]+)\(")
_CALL = re.compile(r"\bcall @([\w.$-]+)\(")
_DOT = re.compile(
  r"stablehlo\.dot_general (%[\w#.]+), (%[\w#.]+), .*?contracting_dims = \[([\d, ]*)\] x \[[\d, ]*\].*?"
  r":\s*\(tensor<([^>]*)>, tensor<([^>]*)>\)\s*->\s*tensor<([^>]*)>"
)
_DEF = re.compile(r"^\s*(%[\w#.]+) = (stablehlo\.\w+) (.*)$")
_F8_CONVERT = re.compile(r"stablehlo\.convert %[\w#.]+ : \(tensor<[\dx]*x(f8\w+)>\)")
TENSOR_CORE_DTYPES = frozenset({"bf16", "f16", "f8E4M3FN", "f8E5M2", "f4E2M1FN"})


def _shape_and_dtype(tensor_type):
  *dims, dtype = tensor_type.split("x")
  return [int(d) for d in dims], dtype


def _functions(text):
  """{function name: its body lines} of an MLIR module."""
  bodies, name = collections.defaultdict(list), None
  for line in text.splitlines():
    match = _FUNC.search(line)
    if match:
      name = match.group(1)
    elif name is not None:
      bodies[name].append(line)
  return bodies


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
  """{(lhs dtype, rhs dtype): FLOPs} of every dot reachable from `entry`, with call multiplicities."""
  bodies = _functions(stablehlo_text)
  memo = {}

  def flops_of(name):
    if name not in memo:
      memo[name] = collections.Counter()  # recursion guard (MLIR functions are not recursive)
      total = collections.Counter()
      defs = {}  # each value's latest definition so far (branches of a region reuse names)
      for line in bodies.get(name, ()):
        definition = _DEF.match(line)
        if definition:
          defs[definition.group(1)] = line
        dot = _DOT.search(line)
        if dot:
          contracting = [int(i) for i in dot.group(3).replace(" ", "").split(",") if i]
          lhs_shape, lhs_dtype = _shape_and_dtype(dot.group(4))
          _, rhs_dtype = _shape_and_dtype(dot.group(5))
          out_shape, _ = _shape_and_dtype(dot.group(6))
          if f8_dequantized:
            lhs_dtype = _f8_source(dot.group(1), defs) or lhs_dtype
            rhs_dtype = _f8_source(dot.group(2), defs) or rhs_dtype
          total[(lhs_dtype, rhs_dtype)] += 2 * math.prod(out_shape) * math.prod(lhs_shape[i] for i in contracting)
        for callee in _CALL.findall(line):
          total.update(flops_of(callee))
      memo[name] = total
    return memo[name]

  return dict(flops_of(entry))


def tensor_core_share(flops_by_dtype):
  """Fraction of dot FLOPs whose operands are both tensor-core dtypes (bf16 / f16 / f8 / f4)."""
  total = sum(flops_by_dtype.values())
  fast = sum(f for (a, b), f in flops_by_dtype.items() if a in TENSOR_CORE_DTYPES and b in TENSOR_CORE_DTYPES)
  return fast / total if total else 1.0
