"""An optimized HLO module's text as data: computations, instructions (result arrays, operands, attributes, backend
config) and how many times each computation runs per execution of the entry (while loops by their known trip counts).
Pure text processing (no jax)."""

import collections
import dataclasses
import functools
import json
import math
import re
import typing

# Bits per element of each HLO element type (the packed FP4 / int4 types take half a byte).
BITS = {
  "pred": 8,
  "s2": 2,
  "u2": 2,
  "s4": 4,
  "u4": 4,
  "f4e2m1fn": 4,
  "s8": 8,
  "u8": 8,
  "f8e4m3fn": 8,
  "f8e5m2": 8,
  "f8e4m3": 8,
  "f8e3m4": 8,
  "f8e4m3b11fnuz": 8,
  "f8e4m3fnuz": 8,
  "f8e5m2fnuz": 8,
  "f8e8m0fnu": 8,
  "s16": 16,
  "u16": 16,
  "f16": 16,
  "bf16": 16,
  "s32": 32,
  "u32": 32,
  "f32": 32,
  "s64": 64,
  "u64": 64,
  "f64": 64,
  "c64": 64,
  "c128": 128,
  "token": 0,
}


@dataclasses.dataclass(frozen=True)
class Array:
  """One array type: element type and dimensions."""

  dtype: str
  dims: tuple

  @property
  def elements(self):
    return math.prod(self.dims)

  @property
  def bytes(self):
    return self.elements * BITS.get(self.dtype, 32) / 8


_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")


def arrays(type_text) -> tuple:
  """Every array type in an HLO type (a tuple's leaves in order): 'bf16[2,3]{1,0}' -> (Array('bf16', (2, 3)),)."""
  out = []
  for dtype, dims in _ARRAY.findall(type_text):
    if dtype in BITS:
      out.append(Array(dtype, tuple(int(d) for d in dims.split(",") if d)))
  return tuple(out)


@dataclasses.dataclass
class Instruction:
  """One HLO instruction: `shapes` are its result's arrays (a tuple's leaves), `operands` the names it reads."""

  name: str
  opcode: str
  shapes: tuple
  operands: tuple
  attributes: str
  computation: str
  root: bool = False
  parameter_number: typing.Optional[int] = None  # a parameter's index in its computation's signature

  @property
  def bytes(self):
    return sum(a.bytes for a in self.shapes)

  @property
  def target(self):
    """A custom call's target, a fusion's backend kind (e.g. __triton_gemm, __cudnn$fusion), else ''."""
    match = re.search(r'custom_call_target="([^"]+)"', self.attributes)
    if match:
      return match.group(1)
    match = re.search(r'"fusion_backend_config":\s*\{\s*"kind":\s*"([^"]+)"', self.attributes)
    return match.group(1) if match else ""

  def called(self, key):
    """The computation named by attribute `key` (calls, body, condition, to_apply), or None."""
    match = re.search(rf"\b{key}=%?([\w.\-$]+)", self.attributes)
    return match.group(1) if match else None

  @property
  def branches(self):
    match = re.search(r"branch_computations=\{([^}]*)\}", self.attributes)
    return [b.strip().lstrip("%") for b in match.group(1).split(",")] if match else []

  @functools.cached_property
  def backend_config(self) -> dict:
    """The JSON backend_config (a dict; {} without one or where it doesn't parse)."""
    start = self.attributes.find("backend_config=")
    if start < 0:
      return {}
    text = self.attributes[start + len("backend_config=") :]
    if not text.startswith("{"):
      return {}
    try:
      return json.JSONDecoder().raw_decode(text)[0]
    except ValueError:
      return {}

  @property
  def op_name(self):
    """The jax op path in the metadata (named scopes included), or ''."""
    match = re.search(r'op_name="([^"]*)"', self.attributes)
    return match.group(1) if match else ""


@dataclasses.dataclass
class Module:
  """A parsed HLO module: {computation: [its instructions in order]} and the entry computation's name."""

  computations: dict
  entry: str

  @functools.cached_property
  def by_name(self):
    """{(computation, instruction name): Instruction}."""
    return {(c, i.name): i for c, instrs in self.computations.items() for i in instrs}

  def operand(self, instruction, index):
    """The instruction that defines `instruction`'s operand `index`."""
    return self.by_name.get((instruction.computation, instruction.operands[index]))

  def operand_arrays(self, instruction):
    """Each operand's arrays (a tuple operand's leaves), in order."""
    out = []
    for name in instruction.operands:
      defining = self.by_name.get((instruction.computation, name))
      out.append(defining.shapes if defining is not None else ())
    return out

  def root(self, computation):
    instrs = self.computations.get(computation, [])
    return next((i for i in instrs if i.root), instrs[-1] if instrs else None)


def split_type(rhs):
  """(type text, rest) of an instruction's right side: 'bf16[8]{0} add(...)', '(f32[2], s8[4]) custom-call(...)'."""
  if rhs.startswith("("):
    depth = 0
    for i, ch in enumerate(rhs):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        return rhs[: i + 1], rhs[i + 1 :].strip()
  head, _, rest = rhs.partition(" ")
  return head, rest.strip()


def _call_parts(rest):
  """(opcode, operand names, the text between the parentheses, attributes) of 'opcode(%a, %b), attr=...'."""
  opcode, _, after = rest.partition("(")
  depth, end = 1, len(after)
  for i, ch in enumerate(after):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth == 0:
      end = i
      break
  operands = tuple(re.findall(r"%([\w.\-]+)", after[:end]))
  return opcode.strip(), operands, after[:end], after[end + 1 :].lstrip(", ")


_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-$]+)\s*\(.*\)\s*->\s*.*\{\s*$")


def parse(text) -> Module:
  """The Module of an optimized HLO module's text (`compiled.as_text()`)."""
  computations, entry, current = collections.OrderedDict(), None, None
  for line in text.splitlines():
    stripped = line.strip()
    if not stripped or stripped.startswith(("HloModule", "//", "#")):
      continue
    if stripped == "}":
      current = None
      continue
    header = _HEADER.match(stripped) if current is None else None
    if header:
      current = header.group(2)
      computations[current] = []
      if header.group(1):
        entry = current
      continue
    if current is None or " = " not in stripped:
      continue
    lhs, rhs = stripped.split(" = ", 1)
    root = lhs.startswith("ROOT ")
    name = lhs.replace("ROOT ", "").strip().lstrip("%")
    type_text, rest = split_type(rhs)
    opcode, operands, inside, attributes = _call_parts(rest)
    number = int(inside) if opcode == "parameter" and inside.strip().isdigit() else None
    computations[current].append(
      Instruction(name, opcode, arrays(type_text), operands, attributes, current, root, number)
    )
  if entry is None and computations:
    entry = next(reversed(computations))
  return Module(dict(computations), entry)


def trip_count(instruction):
  """A while loop's known trip count (XLA records it in the backend_config), else None."""
  known = instruction.backend_config.get("known_trip_count", {})
  return int(known["n"]) if "n" in known else None


def executions(module) -> dict:
  """{computation: times it runs per execution of the entry} for the computations that launch kernels (the entry,
  while bodies and conditions, called computations, conditional branches, asynchronous ops' wrapped computations);
  fused computations and reducers are not among them (they are parts of a kernel). A loop without a known trip
  count counts once (unknown_loops lists them)."""
  counts = collections.Counter()

  def visit(computation, times):
    counts[computation] += times
    for instr in module.computations.get(computation, []):
      if instr.opcode == "while":
        n = trip_count(instr) or 1
        visit(instr.called("body"), times * n)
        visit(instr.called("condition"), times * (n + 1))
      elif instr.opcode in ("call", "async-start"):
        callee = instr.called("to_apply") or instr.called("calls")
        if callee:
          visit(callee, times)
      elif instr.opcode == "conditional":
        branches = instr.branches or [b for b in (instr.called("true_computation"), instr.called("false_computation"))]
        for branch in branches:
          if branch:
            visit(branch, times / len(branches))  # one branch runs: the mean over them

  visit(module.entry, 1)
  return dict(counts)


def unknown_loops(module):
  """The while loops whose trip count XLA doesn't know (each counted as one trip)."""
  return [
    i.name for instrs in module.computations.values() for i in instrs if i.opcode == "while" and trip_count(i) is None
  ]
