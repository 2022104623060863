"""What each kernel of a compiled GPU step is (a GEMM of which kind, attention, a collective, an elementwise / memory
kernel), its FLOPs and the bytes it moves, how often it runs per step, and the step's GEMMs by model site."""

import collections
import dataclasses
import math
import re
import typing

from MaxText.aot.hlo.collectives import COLLECTIVES, collective_info, collective_opcode
from MaxText.aot.hlo.text import executions
from MaxText.config.models import DENSE_SCOPES

GEMM_KINDS = ("bf16", "fp8", "fp4_block_scaled", "mxfp8_block_scaled", "te", "triton", "naive_loop", "f32")
CATEGORIES = ("gemm", "attention", "elementwise", "collective")
# Instructions that launch nothing: views, tuples, control flow (their bodies are counted), the second half of an
# asynchronous pair (the first half is the kernel).
_FREE = frozenset(
  {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "while",
    "call",
    "conditional",
    "after-all",
    "opt-barrier",
    "add-dependency",
    "partition-id",
    "replica-id",
    "domain",
    "async-done",
    "async-update",
    "copy-done",
    "send-done",
    "recv-done",
    "get-dimension-size",
    "iota",  # folded into its users by XLA:GPU when unfused
  }
  | {f"{c}-done" for c in COLLECTIVES}
)
_SLICING = ("dynamic-slice", "slice", "gather")
_VIEWS = ("bitcast", "reshape", "copy", "transpose")  # what a parameter passes through before a slice reads it


@dataclasses.dataclass
class Kernel:
  """One launched kernel (or library call) of the step and how often it runs per step."""

  name: str
  opcode: str
  target: str
  category: str  # gemm, attention, elementwise, collective
  kind: str  # gemm kind, collective kind, or the elementwise kernel's kind (fusion, pallas, te, copy, ...)
  count: float  # runs per step
  flops: float = 0.0  # per run
  bytes: float = 0.0  # HBM bytes read + written per run (estimate)
  scope: str = ""  # the jax op path (metadata op_name)
  dtypes: tuple = ()  # a GEMM's operand element types
  collective: typing.Optional[dict] = None  # data bytes, group size, domains crossed
  scores: float = 0.0  # attention: scores (Q-K pairs) per run, times passes over them (forward 1, backward 2)
  elements: float = 0.0  # an elementwise kernel: elements of its largest operand or result, or the values a
  # quantizer writes where more (quantizer_codes): what per-element figures count
  read_bytes: float = 0.0  # of `bytes`, those read
  code: typing.Any = None  # what its threads execute where the compiler's dump was read (aot.dump.Code)

  @property
  def pallas_name(self):
    """A Pallas kernel's name (pallas_call's `name`, e.g. quantize_nvfp4_rht_sr) from its op path, else ''."""
    match = re.search(r"([\w.-]+)/pallas_call", self.scope) if self.kind == "pallas" else None
    return match.group(1) if match else ""


def _dot_flops(result, lhs, lhs_contracting):
  """2 x output elements x contracted elements."""
  return 2.0 * result.elements * math.prod(lhs.dims[d] for d in lhs_contracting if d < len(lhs.dims))


def _dims(config, key):
  return [int(d) for d in config.get(key, [])]


def gemm_kind(dtypes):
  """A library GEMM's kind from its operands' element types: fp8, f32, else bf16."""
  a = dtypes[0] if dtypes else ""
  if a.startswith("f8"):
    return "fp8"
  if a == "f32":
    return "f32"
  return "bf16"


def _block_scaled_kind(dtypes):
  return "fp4_block_scaled" if dtypes and dtypes[0].startswith("f4") else "mxfp8_block_scaled"


def _first_dot(module, computation, depth=0):
  """The first dot / scaled-dot / convolution in a fused computation (nested fusions searched), or None."""
  for instr in module.computations.get(computation, []):
    if instr.opcode in ("dot", "scaled-dot", "convolution"):
      return instr
    if instr.opcode == "fusion" and depth < 4:
      found = _first_dot(module, instr.called("calls"), depth + 1)
      if found is not None:
        return found
  return None


def _hlo_dot(module, dot):
  """(flops, operand dtypes) of a `dot` / `scaled-dot` instruction from its dimension numbers."""
  operands = module.operand_arrays(dot)
  lhs = operands[0][0] if operands and operands[0] else None
  contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", dot.attributes)
  dims = [int(d) for d in contracting.group(1).split(",") if d] if contracting else []
  dtypes = tuple(o[0].dtype for o in operands[:2] if o)
  if lhs is None or not dot.shapes:
    return 0.0, dtypes
  return _dot_flops(dot.shapes[0], lhs, dims), dtypes


def _library_gemm(module, instr):
  """(kind, flops, operand dtypes) of a cuBLAS / cuDNN GEMM custom call."""
  operands = module.operand_arrays(instr)
  dtypes = tuple(o[0].dtype for o in operands[:2] if o)
  target = instr.target
  config = instr.backend_config.get("gemm_backend_config") or {}
  numbers = config.get("dot_dimension_numbers") or {}
  contracting = _dims(numbers, "lhs_contracting_dimensions")
  if target == "__cudnn$blockScaledDot":
    contracting = contracting or [len(operands[0][0].dims) - 1]  # [batch, M, K] x [batch, N, K]
    kind = _block_scaled_kind(dtypes)
  else:
    kind = "fp8" if target.endswith("$f8") else gemm_kind(dtypes)
  flops = _dot_flops(instr.shapes[0], operands[0][0], contracting) if operands and operands[0] else 0.0
  return kind, flops, dtypes


def _te_gemm(module, instr):
  """(flops, operand dtypes) of a Transformer Engine GEMM call (lhs, lhs scale, rhs, rhs scale, ...): K from the
  element counts, lhs x rhs = out x K^2 for [M, K] x [N, K] -> [M, N] whichever operand is transposed."""
  operands = module.operand_arrays(instr)
  if len(operands) < 3 or not operands[0] or not operands[2] or not instr.shapes:
    return 0.0, ()
  lhs, rhs, out = operands[0][0], operands[2][0], instr.shapes[0]
  k = math.sqrt(lhs.elements * rhs.elements / out.elements) if out.elements else 0.0
  return 2.0 * out.elements * k, (lhs.dtype, rhs.dtype)


def attention_work(module, instr):
  """(FLOPs, scores) of a cuDNN fused attention call. FLOPs: the forward's two GEMMs, 4 B H Lq Lk D, halved where
  causal; the backward's five, 2.5 x that (S recomputed, dP, dS Q, dS K, P dO). Scores: B H Lq Lk (halved where
  causal), once in the forward, twice in the backward (recomputed, then their gradient)."""
  config = instr.backend_config.get("cudnn_fmha_backend_config") or {}
  dims = [int(d) for d in (config.get("intermediate_tensor_shape") or {}).get("dimensions", [])]
  operands = module.operand_arrays(instr)
  if len(dims) != 4 or not operands or not operands[0]:
    return 0.0, 0.0
  scores = float(math.prod(dims))
  if config.get("mask_type", "") in ("CAUSAL", "PADDING_CAUSAL"):
    scores /= 2
  forward = 4.0 * scores * operands[0][0].dims[-1]
  backward = "Backward" in instr.target
  return forward * (2.5 if backward else 1.0), scores * (2.0 if backward else 1.0)


def _is_te(target):
  return target.startswith("te_") or target.startswith("transformer_engine")


def _integer(dtypes):
  """Whether a dot's operands are integers or booleans (no library GEMM takes them: XLA's loop is the only way)."""
  return bool(dtypes) and all(d == "pred" or d[0] in "su" for d in dtypes)


def _library_kind(target):
  """'gemm', 'attention', 'block_scaled', 'host_gemm' or '' for a custom call target."""
  t = target.lower()
  if target == "__cudnn$blockScaledDot":
    return "block_scaled"
  if t.startswith("__cudnn$fmha") or "flash" in t or "attention" in t:
    return "attention"
  if target.startswith("__cublas") or (_is_te(target) and "gemm" in t):
    return "gemm"
  if t.startswith("__onednn$") and "matmul" in t:
    return "host_gemm"
  return ""


def _through_views(module, computation, name, depth=0):
  """The instructions of a computation that read `name`, looking through single-operand views (bitcast, ...)."""
  users = []
  for instr in module.computations.get(computation, []):
    if name not in instr.operands:
      continue
    if instr.opcode in _VIEWS and len(instr.operands) == 1 and depth < 4:
      users += _through_views(module, computation, instr.name, depth + 1) or [instr]
    else:
      users.append(instr)
  return users


def _source(module, computation, name, depth=0):
  """The instruction `name` is a view of (bitcasts, reshapes, copies looked through)."""
  instr = module.by_name.get((computation, name))
  while instr is not None and instr.opcode in _VIEWS and instr.operands and depth < 4:
    instr, depth = module.by_name.get((computation, instr.operands[0])), depth + 1
  return instr


def _outputs(module, computation):
  """The arrays a computation's root writes: a tuple's elements, else the root itself."""
  root = module.root(computation)
  if root is None:
    return []
  if root.opcode == "tuple":
    return [module.by_name[(computation, n)] for n in root.operands if (computation, n) in module.by_name]
  return [root]


def kernel_bytes(module, instr):
  """HBM bytes a kernel reads and writes (kernel_traffic's sum)."""
  return sum(kernel_traffic(module, instr))


def kernel_traffic(module, instr):
  """(bytes read, bytes written) of a kernel in HBM, as XLA's cost model counts a fusion's: an operand the kernel
  only slices (dynamic-slice, slice, gather) counts the slices read; a buffer updated in place (the operand of a
  root dynamic-update-slice or scatter) is not read, and only the update is written; every other operand and output
  whole."""
  body = instr.called("calls") if instr.opcode == "fusion" else None
  operands = module.operand_arrays(instr)
  if body is None:
    return sum(a.bytes for arrays_ in operands for a in arrays_), instr.bytes
  params = {i.parameter_number: i for i in module.computations.get(body, []) if i.opcode == "parameter"}
  in_place, written = set(), 0.0
  for out in _outputs(module, body):
    update_index = _IN_PLACE.get(out.opcode)
    buffer = _source(module, body, out.operands[0]) if update_index is not None else None
    if buffer is not None and buffer.opcode == "parameter" and len(out.operands) > update_index:
      in_place.add(buffer.parameter_number)
      update = module.by_name.get((body, out.operands[update_index]))
      written += update.bytes if update is not None else 0.0
    else:
      written += out.bytes
  read = 0.0
  for index, arrays_ in enumerate(operands):
    if index in in_place:
      continue
    whole = sum(a.bytes for a in arrays_)
    param = params.get(index)
    users = _through_views(module, body, param.name) if param is not None else []
    if users and all(
      u.opcode in _SLICING and u.operands and u.operands[0] in _viewed_names(module, body, param) for u in users
    ):
      read += min(whole, sum(u.bytes for u in users))
    else:
      read += whole
  return read, written


# Root ops that update their first operand in place (XLA aliases the buffer): the operand index of the update.
_IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}


def _viewed_names(module, computation, param):
  """`param`'s name and the names of the views of it (what a slice of the parameter reads as its operand 0)."""
  names, frontier = {param.name}, [param.name]
  while frontier:
    name = frontier.pop()
    for instr in module.computations.get(computation, []):
      if name in instr.operands and instr.opcode in _VIEWS and len(instr.operands) == 1 and instr.name not in names:
        names.add(instr.name)
        frontier.append(instr.name)
  return names


def classify(module, instr):
  """(category, kind, flops per run, operand dtypes) of one launched instruction, or None for one that launches
  nothing (views, tuples, control flow)."""
  opcode = instr.opcode
  if opcode in _FREE:
    return None
  if collective_opcode(instr):
    return "collective", collective_opcode(instr), 0.0, ()
  if opcode == "async-start":
    return None  # its wrapped computation runs the work: visited as an executed computation
  if opcode == "custom-call":
    return _custom_call(module, instr)
  if opcode in ("dot", "scaled-dot", "convolution"):
    flops, dtypes = _hlo_dot(module, instr)
    return ("elementwise", "integer_dot", flops, dtypes) if _integer(dtypes) else ("gemm", "naive_loop", flops, dtypes)
  if opcode == "fusion":
    return _fusion(module, instr)
  if opcode in ("copy", "copy-start", "transpose"):
    return "elementwise", "copy", 0.0, ()
  return "elementwise", opcode, 0.0, ()


def _custom_call(module, instr):
  """classify's answer for a custom call: a library GEMM or attention, a Pallas or Transformer Engine kernel."""
  target = instr.target
  library = _library_kind(target)
  if library == "attention":
    return "attention", "cudnn" if target.startswith("__cudnn") else "other", attention_work(module, instr)[0], ()
  if library in ("gemm", "block_scaled"):
    if _is_te(target):
      return ("gemm", "te", *_te_gemm(module, instr))
    kind, flops, dtypes = _library_gemm(module, instr)
    return "gemm", kind, flops, dtypes
  if library == "host_gemm":  # a CPU library's matmul (oneDNN): a GEMM on its operands' type
    dtypes = tuple(o[0].dtype for o in module.operand_arrays(instr)[:2] if o)
    return "gemm", gemm_kind(dtypes), 0.0, dtypes
  if target == "__gpu$xla.gpu.triton":
    return "elementwise", "pallas", 0.0, ()
  if _is_te(target):
    return "elementwise", "te_kernel", 0.0, ()
  return "elementwise", "custom-call", 0.0, ()


def _fusion(module, instr):
  """classify's answer for a fusion: a library or Triton GEMM around a dot, XLA's loop for a dot left in an
  ordinary fusion, a copy (only views, copies and transposes), else an elementwise kernel."""
  target, body = instr.target, instr.called("calls")
  dot = _first_dot(module, body)
  if target.startswith("__cudnn$fusion") and dot is not None:
    flops, dtypes = _hlo_dot(module, dot)
    kind = _block_scaled_kind(dtypes) if dot.opcode == "scaled-dot" else gemm_kind(dtypes)
    return "gemm", kind, flops, dtypes
  if "gemm" in target or target == "__triton_scaled_dot_fusion":
    flops, dtypes = _hlo_dot(module, dot) if dot is not None else (0.0, ())
    return "gemm", "triton", flops, dtypes
  if dot is not None:
    flops, dtypes = _hlo_dot(module, dot)
    if _integer(dtypes):  # index arithmetic (TE's, e.g.), not a GEMM of the model
      return "elementwise", "integer_dot", flops, dtypes
    return "gemm", "naive_loop", flops, dtypes
  ops = {i.opcode for i in module.computations.get(body, [])}
  if ops and ops <= {"parameter", "copy", "transpose", "bitcast", "reshape", "tuple"}:
    return "elementwise", "copy", 0.0, ()
  return "elementwise", "fusion", 0.0, ()


def quantizer_codes(kernel, instr):
  """The values a Pallas quantizer writes, counted from its largest result's bytes (two E2M1 codes a byte for the FP4
  formats, one FP8 code a byte otherwise); 0 for other kernels. Its operand can't say: a kernel may read bf16 pairs
  as u32 words, half as many elements as values."""
  name = kernel.pallas_name
  if not name.startswith("quantize_") or "amax" in name:
    return 0
  return max(a.bytes for a in instr.shapes) * (2 if "fp4" in name else 1)


def kernels(module, num_devices=1, devices_per_domain=None) -> list:
  """Every kernel of the step: one Kernel per launching instruction of each executed computation, with its runs per
  step. `devices_per_domain`: GPUs per NVLink domain (a collective whose groups span several crosses the network)."""
  devices_per_domain = devices_per_domain or num_devices
  out = []
  for computation, times in executions(module).items():
    for instr in module.computations.get(computation, []):
      found = classify(module, instr)
      if found is None:
        continue
      category, kind, flops, dtypes = found
      kernel = Kernel(instr.name, instr.opcode, instr.target, category, kind, times, flops, 0.0, instr.op_name, dtypes)
      if category == "attention":
        kernel.scores = attention_work(module, instr)[1]
      if category == "elementwise":  # the largest array it reads or writes: what a quantizer's cost is counted per
        operands = [a.elements for arrays in module.operand_arrays(instr) for a in arrays]
        kernel.elements = max([*operands, *(a.elements for a in instr.shapes), quantizer_codes(kernel, instr)])
      if category == "collective":
        kernel.collective = collective_info(module, instr, num_devices, devices_per_domain)
        kernel.bytes = kernel.collective["wire_bytes"]
      else:
        kernel.read_bytes, written = kernel_traffic(module, instr)
        kernel.bytes = kernel.read_bytes + written
      out.append(kernel)
  return out


# Named scopes of the model's GEMMs (their remat names) -> the GEMM, for counting a program's GEMMs per site.
GEMM_SCOPES = {**DENSE_SCOPES, "logits": "lm_head"}


_EINSUM = re.compile(r"\b[a-z]*,[a-z]*->[a-z]*\b")


def gemm_site(scope):
  """The model GEMM a kernel's op path names (gate, up, down, q, ..., by the Dense layers' named scopes), or by the
  model's einsum letters: lm_head (over the vocabulary, v: 'bld,dv->blv'), attention (XLA's attention: query and key
  lengths, l and s: 'blkgd,bskd->bkgls'); else 'other'."""
  found = [GEMM_SCOPES[p] for p in re.split(r"[/()]", scope) if p in GEMM_SCOPES]
  if found:
    return found[-1]
  einsums = _EINSUM.findall(scope)
  if any("v" in e for e in einsums):
    return "lm_head"
  return "attention" if any("l" in e and "s" in e for e in einsums) else "other"


def summary(kernel_list) -> dict:
  """{gemms: {kind: runs per step}, gemm_flops: {kind: FLOPs per step}, gemm_sites: {site: {kind: runs}},
  collectives: {kind: data bytes per step}, kernels: {category/kind: runs per step}} of a kernel list."""
  gemms, flops, sites = collections.Counter(), collections.Counter(), collections.defaultdict(collections.Counter)
  collectives, launches = collections.Counter(), collections.Counter()
  for k in kernel_list:
    launches[f"{k.category}/{k.kind}"] += k.count
    if k.category == "gemm":
      gemms[k.kind] += k.count
      flops[k.kind] += k.flops * k.count
      sites[gemm_site(k.scope)][k.kind] += k.count
    elif k.category == "collective":
      collectives[k.kind] += k.collective["data_bytes"] * k.count
  return {
    "gemms": dict(gemms),
    "gemm_flops": dict(flops),
    "gemm_sites": {s: dict(c) for s, c in sorted(sites.items())},
    "collectives": dict(collectives),
    "kernels": dict(launches),
  }


def _through_views_up(module, instr, depth=0):
  """The instruction that computes `instr`'s value: itself, or what a bitcast / get-tuple-element / copy of it reads."""
  if instr is not None and depth < 8 and instr.opcode in ("bitcast", "get-tuple-element", "copy"):
    return _through_views_up(module, module.operand(instr, 0), depth + 1)
  return instr


def fp8_gemm_scales(module) -> collections.Counter:
  """How each cuBLAS FP8 GEMM (`__cublas$lt$matmul$f8`) of a module gets its two scale operands (the last two; an
  epilogue's C matrix comes before them): {'constant' | 'f32' | 'bf16': count}. 'bf16': the scale is computed
  through a bf16 value (a rounded scale: XLA's GEMM rewriter read a scale multiply in the compute dtype without the
  f32 scalar under it); 'f32': computed in f32 only, so the epilogue applies the scale as the f32 sum is scaled."""
  out = collections.Counter()
  for instrs in module.computations.values():
    for instr in instrs:
      if instr.target != "__cublas$lt$matmul$f8":
        continue
      for index in (len(instr.operands) - 2, len(instr.operands) - 1):
        source = _through_views_up(module, module.operand(instr, index))
        if source is None or source.opcode == "constant":
          out["constant"] += 1
          continue
        body = module.computations.get(source.called("calls"), []) if source.opcode == "fusion" else [source]
        out["bf16" if any(a.dtype == "bf16" for i in body for a in i.shapes) else "f32"] += 1
  return out
