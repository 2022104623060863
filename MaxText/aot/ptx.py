"""The PTX XLA emits for a GPU target (XLA_FLAGS=--xla_dump_to=DIR writes one .ptx per kernel module, Pallas' Triton
kernels included) read as what each thread executes: per kernel entry, the instructions of its straight-line code
and of each loop, sorted into the SM's execution pipes, and the global-memory bytes each thread loads.

Pipes (what aot.instructions prices per target): `issue` (every instruction takes an issue slot), `fp` (FP32 add /
multiply / FMA, the 16-bit ones, integer multiply-add, which Volta and later issue to the FMA pipe), `alu` (integer
add, logic, shifts, funnel shifts, compares, selects, min / max, bit-field ops), `xu` (conversions between types and
roundings, transcendentals: ex2, lg2, rcp, rsqrt, sqrt, sin, cos), `shfl` (warp shuffles and reductions) and
`smem_bytes` (shared-memory bytes moved, ldmatrix / stmatrix included). Register moves, parameter loads and address
conversions take none (ptxas allocates them away). A PTX instruction that ptxas expands (IEEE division, integer
division, 64-bit integer arithmetic) takes the slots of its expansion. Pure text processing (no jax).
"""

import collections
import dataclasses
import re

PIPES = ("issue", "fp", "alu", "xu", "shfl", "smem_bytes")
_FREE = ("mov", "ld.param", "cvta", "griddepcontrol", "prefetch", "createpolicy", "discard", "pmevent")
_FP_OPS = ("add", "sub", "mul", "fma", "mad", "neg", "abs", "testp", "copysign")
_INT_ALU = (
  "add", "addc", "sub", "subc", "and", "or", "xor", "not", "cnot", "shl", "shr", "shf", "bfe", "bfi", "prmt", "selp",
  "slct", "setp", "set", "min", "max", "lop3", "neg", "abs", "vote", "activemask", "fns", "sad", "szext", "bmsk",
)  # fmt: skip
_XU = ("ex2", "lg2", "rcp", "rsqrt", "sqrt", "sin", "cos", "tanh", "popc", "clz", "brev", "bfind")
_FLOAT = re.compile(r"^(f16|bf16|f32|f64|e\dm\d|tf32)")
_BITS = re.compile(r"^[bsuf](\d+)$")
_VECTOR = re.compile(r"^v(\d+)$")
# Instructions ptxas expands: {prefix: {pipe: slots}} (IEEE division: a reciprocal and Newton steps; integer
# division: conversions, a reciprocal and about ten integer multiply-adds).
_EXPANDED = {
  "div.rn.f32": {"xu": 1, "fp": 8},
  "div.full.f32": {"xu": 1, "fp": 2},
  "div.approx": {"xu": 1, "fp": 1},
  "sqrt.rn": {"xu": 1, "fp": 4},
  "rcp.rn": {"xu": 1, "fp": 4},
  "div.": {"xu": 3, "alu": 4, "fp": 6},
  "rem.": {"xu": 3, "alu": 5, "fp": 7},
}


def _types(parts):
  """The type suffixes of an opcode's parts ('f32', 'bf16x2', 'u64', ...)."""
  return [p for p in parts if _BITS.match(p) or _FLOAT.match(p) or p in ("pred",) or p.endswith("x2")]


def _width(parts):
  """Bytes one thread moves in a load or store: vector count x element bits / 8."""
  vector = next((int(m.group(1)) for p in parts if (m := _VECTOR.match(p))), 1)
  bits = next((int(m.group(1)) for p in reversed(parts) if (m := _BITS.match(p))), 32)
  return vector * bits / 8


def _matrix_bytes(parts):
  """Bytes one thread moves in an ldmatrix / stmatrix (m8n8 tiles of b16: 4 bytes per thread each, .x1/.x2/.x4)."""
  count = next((int(p[1:]) for p in parts if re.fullmatch(r"x\d", p)), 1)
  return 4.0 * count


def _memory(parts):
  """{pipe: slots} of a load / store / atomic: an issue slot, and shared-memory bytes where it goes there."""
  if parts[0] in ("ldmatrix", "stmatrix"):
    return {"issue": 1, "smem_bytes": _matrix_bytes(parts)}
  if "shared" in parts and parts[0] in ("ld", "st", "atom", "red"):
    return {"issue": 1, "smem_bytes": _width(parts)}
  return {"issue": 1}


def _convert(parts):
  """{pipe: slots} of a cvt: integer width changes and bf16 -> f32 (a shift) on the ALU, saturation on the FMA
  pipe, every other conversion or rounding (float <-> int, f32 -> bf16 / f16 / FP8 / FP4, rounding within f32) on
  the conversion unit."""
  types = _types(parts)
  floats = [t for t in types if _FLOAT.match(t)]
  if not floats:
    return {"issue": 1, "alu": 1}
  if types[-2:] == ["f32", "bf16"] or (parts[1:3] == ["sat", "f32"] and types == ["f32", "f32"]):
    return {"issue": 1, "alu" if types[-1] == "bf16" else "fp": 1}
  return {"issue": 1, "xu": 1}


def slots(opcode):
  """{pipe: slots} one thread's execution of a PTX instruction takes (its SASS expansion); {} for one that compiles
  to nothing."""
  if opcode.startswith(_FREE):
    return {}
  for prefix, cost in _EXPANDED.items():
    if opcode.startswith(prefix):
      return {"issue": sum(cost.values()), **cost}
  parts = opcode.split(".")
  root, types = parts[0], _types(parts)
  wide = any(t.endswith("64") for t in types) and not any(_FLOAT.match(t) for t in types)
  if root in ("ld", "st", "atom", "red", "ldmatrix", "stmatrix", "cp", "ldu"):
    return _memory(parts)
  if root == "cvt":
    return _convert(parts)
  if root in _XU:
    return {"issue": 1, "xu": 1}
  if root in ("shfl", "redux"):
    return {"issue": 1, "shfl": 1 if root == "shfl" else 2}
  if root in _FP_OPS and any(_FLOAT.match(t) for t in types):
    return {"issue": 1, "fp": 1}
  if root in ("mul", "mad", "madc", "mul24", "mad24", "dp4a", "dp2a"):
    return {"issue": 2 if wide else 1, "fp": 2 if wide else 1}
  if root in _INT_ALU:
    return {"issue": 2 if wide else 1, "alu": 2 if wide else 1}
  return {"issue": 1}  # branches, barriers, fences, exits: an issue slot each


@dataclasses.dataclass
class Block:
  """Straight-line code or one loop body: per thread, instructions, pipe slots and global bytes loaded per pass."""

  instructions: int = 0
  slots: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  load_bytes: float = 0.0

  def add(self, opcode):
    cost = slots(opcode)
    if not cost:
      return
    self.instructions += 1
    self.slots.update(cost)
    if opcode.startswith(("ld.global", "ldu.global")):
      self.load_bytes += _width(opcode.split("."))


@dataclasses.dataclass
class Entry:
  """One kernel entry: its code outside loops, its loops' bodies, the target it was compiled for and the threads per
  block it requires (.reqntid / .maxntid; None where the PTX doesn't say)."""

  name: str
  target: str
  straight: Block
  loops: list
  threads_per_block: int = None


_STATEMENT = re.compile(r"^(?:@!?%\w+\s+)?([a-z][\w.:]*)")
_LABEL = re.compile(r"^(\$?[\w.]+):")
_BRANCH_TARGET = re.compile(r"\bbra(?:\.uni)?\s+(\$?[\w.]+)")


def _statements(body):
  """(kind, text) of each statement of an entry's body: ('label', name) or ('op', text), comments dropped and the
  several instructions of an inline-asm line split."""
  for line in body.splitlines():
    line = line.split("//")[0].strip()
    label = _LABEL.match(line)
    if label:
      yield "label", label.group(1)
      line = line[label.end() :].strip()
    for statement in line.split(";"):
      statement = statement.strip()
      if statement and not statement.startswith((".", "{", "}", ")")):
        yield "op", statement


def _entry(name, target, header, body):
  """The Entry of one `.entry NAME(...) {body}`: a backward branch closes a loop from its label to itself."""
  ops, labels = [], {}
  for kind, text in _statements(body):
    if kind == "label":
      labels[text] = len(ops)
    else:
      ops.append(text)
  in_loop = [None] * len(ops)
  loop_spans = []
  for index, text in enumerate(ops):
    branch = _BRANCH_TARGET.search(text)
    start = labels.get(branch.group(1)) if branch else None
    if start is not None and start <= index:
      loop_spans.append((start, index))
  loop_spans.sort(key=lambda span: span[0] - span[1])  # outermost first: a nested loop's code is the innermost's
  loops = [Block() for _ in loop_spans]
  for number, (start, end) in enumerate(loop_spans):
    for index in range(start, end + 1):
      in_loop[index] = number
  straight = Block()
  for index, text in enumerate(ops):
    opcode = _STATEMENT.match(text).group(1) if _STATEMENT.match(text) else ""
    (straight if in_loop[index] is None else loops[in_loop[index]]).add(opcode)
  threads = re.search(r"\.(?:reqntid|maxntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", header)
  count = None
  if threads:
    count = 1
    for d in threads.groups():
      count *= int(d) if d else 1
  return Entry(name, target, straight, loops, count)


_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(")


def entries(text) -> dict:
  """{entry name: Entry} of one PTX module's text."""
  target = re.search(r"^\s*\.target\s+(\w+)", text, re.M)
  target = target.group(1) if target else ""
  out = {}
  for match in _ENTRY.finditer(text):
    open_brace = text.index("{", match.end())
    depth, end = 0, open_brace
    for end in range(open_brace, len(text)):
      depth += {"{": 1, "}": -1}.get(text[end], 0)
      if depth == 0:
        break
    out[match.group(1)] = _entry(match.group(1), target, text[match.end() : open_brace], text[open_brace + 1 : end])
  return out
