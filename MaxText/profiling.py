"""Profiling MaxText's way: an XProf trace (or an nsys capture range) of chosen steps, and where the time went.

`profiler=xplane` traces steps [skip_first_n_steps_for_profiler, + profiler_steps) into
run_dir/tensorboard/plugins/profile/<time>/ (TensorBoard's profile plugin and Perfetto open it; a
perfetto_trace.json.gz is written beside it), then prints device time per step by category (GEMMs
by operand dtype, attention, quantization and other elementwise fusions, collectives, copies) and the
top kernels, and writes the same to run_dir/profile_summary.json. Events are matched to the train
step's optimized HLO (each kernel carries its `hlo_op`), so a GEMM's category names the dtypes its
operands really have after XLA's rewrites. `profiler=nsys` brackets the same steps with
cudaProfilerStart/Stop for `nsys profile --capture-range=cudaProfilerApi`.
"""

import collections
import ctypes
import ctypes.util
import glob
import json
import os
import re

import jax

CATEGORIES = ("gemm", "attention", "quantization/elementwise", "collective", "copy/transpose", "other")
TOP_KERNELS, PRINTED_KERNELS = 40, 10  # kept in profile_summary.json / printed
_CONTAINERS = ("while", "conditional", "call")  # their time is their body's ops' (CPU traces both): not counted
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "send", "recv")
_KERNEL_PATTERNS = (  # fallback when a kernel carries no hlo_op we know
    ("attention", re.compile(r"fmha|flash|cudnn|attention", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|nvjet|matmul|\bdot\b", re.I)),
    ("collective", re.compile(r"nccl|all_reduce|allreduce|all_gather|reduce_scatter", re.I)),
    ("copy/transpose", re.compile(r"memcpy|memset|copy|transpose", re.I)),
)


class Profiler:
  """Starts and stops the configured profiler around the chosen steps of the train loop."""

  def __init__(self, cfg, run_dir, enabled=True):
    self.mode = cfg.profiler if enabled else ""
    self.first = cfg.skip_first_n_steps_for_profiler
    self.last = self.first + cfg.profiler_steps - 1
    self.trace_dir = os.path.join(run_dir, "tensorboard")
    self.summary_path = os.path.join(run_dir, "profile_summary.json")
    self.hlo_path = os.path.join(run_dir, "profile_step.hlo.txt")
    self.active = False

  def before_step(self, step):
    if self.mode and step == self.first and not self.active:
      if self.mode == "xplane":
        jax.profiler.start_trace(self.trace_dir, create_perfetto_trace=True)
      else:
        _cuda_profiler("cudaProfilerStart")
      self.active = True

  def after_step(self, step, outputs, hlo_text_fn):
    """Stops after the last profiled step (once its outputs are ready); prints and returns the summary."""
    if not (self.active and step >= self.last):
      return None
    jax.block_until_ready(outputs)
    self.active = False
    if self.mode == "nsys":
      _cuda_profiler("cudaProfilerStop")
      return None
    jax.profiler.stop_trace()
    hlo_text = hlo_text_fn()
    with open(self.hlo_path, "w", encoding="utf-8") as f:
      f.write(hlo_text or "")  # the ops each kernel's hlo_op names, for reading a fusion's body
    summary = summarize(newest_xplane(self.trace_dir), hlo_text, steps=self.last - self.first + 1)
    summary["steps"] = [self.first, self.last]
    print(format_summary(summary), flush=True)
    with open(self.summary_path, "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)
    return summary

  def close(self):
    if self.active:
      if self.mode == "xplane":
        jax.profiler.stop_trace()
      else:
        _cuda_profiler("cudaProfilerStop")
      self.active = False


def _cuda_profiler(function):
  """cudaProfilerStart / cudaProfilerStop from the CUDA runtime (nsys's capture range)."""
  path = ctypes.util.find_library("cudart") or "libcudart.so"
  try:
    getattr(ctypes.CDLL(path), function)()
  except (OSError, AttributeError) as e:
    raise RuntimeError(f"profiler=nsys needs the CUDA runtime (libcudart): {e}") from e


def newest_xplane(trace_dir):
  files = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.xplane.pb")), key=os.path.getmtime)
  if not files:
    raise RuntimeError(f"no .xplane.pb under {trace_dir}/plugins/profile")
  return files[-1]


# -- the optimized HLO: what each op is ------------------------------------------------------------

def _split_type(rhs):
  """('(f32[2], s8[4])' or 'bf16[8,4]{1,0}', rest) from the right-hand side of an HLO instruction."""
  if rhs.startswith("("):
    depth = 0
    for i, ch in enumerate(rhs):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        return rhs[:i + 1], rhs[i + 1:].strip()
  head, _, rest = rhs.partition(" ")
  return head, rest.strip()


def _parenthesized(text):
  """The text inside the first balanced (...) of `text`, and what follows it."""
  start = text.find("(")
  if start < 0:  # e.g. a line of a computation's attributes, not an instruction
    return "", text
  depth = 0
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return text[start + 1:i], text[i + 1:]
  return text[start + 1:], ""


_DTYPE = re.compile(r"\b(pred|[subf]\d+|bf16|f8e\w+|f4e\w+|c\d+)\[")


def parse_hlo(hlo_text):
  """{instruction name: (opcode, result type, operand dtypes, custom-call target, called computation)} and
  {computation name: [instruction names]} of an optimized HLO module's text."""
  instructions, computations, current = {}, collections.defaultdict(list), None
  for line in hlo_text.splitlines():
    stripped = line.strip()
    if " = " not in stripped:
      if stripped.endswith("{"):
        current = stripped.split()[1 if stripped.startswith("ENTRY") else 0].lstrip("%")
      continue
    name, rhs = stripped.split(" = ", 1)
    name = name.replace("ROOT", "").strip().lstrip("%")
    result_type, rest = _split_type(rhs)
    opcode = rest.split("(", 1)[0].strip()
    operands, attributes = _parenthesized(rest)
    target = re.search(r'custom_call_target="([^"]+)"', attributes)
    calls = re.search(r"calls=%?([\w.\-]+)", attributes)
    instructions[name] = (opcode, result_type, _DTYPE.findall(operands) or _operand_dtypes(operands, instructions),
                          target.group(1) if target else "", calls.group(1) if calls else "")
    if current:
      computations[current].append(name)
  return instructions, computations


def _operand_dtypes(operands, instructions):
  """Operand dtypes when the operands are printed as bare names."""
  out = []
  for name in re.findall(r"%([\w.\-]+)", operands):
    if name in instructions:
      out += _DTYPE.findall(instructions[name][1])[:1]
  return out


def _gemm_label(dtypes):
  a, b = (dtypes + dtypes)[:2] if dtypes else ("?", "?")
  short = lambda d: "f8" if d.startswith("f8") else ("f4" if d.startswith("f4") else d)
  return f"gemm {short(a)}" if short(a) == short(b) else f"gemm {short(a)}x{short(b)}"


def classify(op_name, instructions, computations):
  """The category (GEMMs as 'gemm <dtype>'; 'container' for loops and calls) of one optimized-HLO op, or None."""
  if op_name not in instructions:
    return None
  opcode, _, dtypes, target, calls = instructions[op_name]
  if opcode in _CONTAINERS:
    return "container"
  if opcode in ("dot", "convolution"):
    return _gemm_label(dtypes)
  if opcode == "custom-call":
    lowered = target.lower()
    if "fmha" in lowered or "flash" in lowered or "attention" in lowered:
      return "attention"
    if any(k in lowered for k in ("gemm", "matmul", "cublas", "dot")):
      return _gemm_label(dtypes)
    return "other"
  if any(opcode.startswith(c) for c in _COLLECTIVES):
    return "collective"
  if opcode in ("copy", "copy-start", "copy-done", "transpose"):
    return "copy/transpose"
  if calls:
    body = [instructions[n] for n in computations.get(calls, ()) if n in instructions]
    for sub_opcode, _, sub_dtypes, sub_target, _ in body:
      if sub_opcode in ("dot", "convolution"):
        return _gemm_label(sub_dtypes)
      if sub_opcode == "custom-call" and ("fmha" in sub_target.lower() or "flash" in sub_target.lower()):
        return "attention"
      if any(sub_opcode.startswith(c) for c in _COLLECTIVES):
        return "collective"
    if body and all(o in ("parameter", "copy", "transpose", "bitcast", "reshape") for o, *_ in body):
      return "copy/transpose"
    return "quantization/elementwise"
  if opcode in ("fusion", "reduce", "convert", "multiply", "add", "select", "broadcast"):
    return "quantization/elementwise"
  return None


# -- the trace ---------------------------------------------------------------------------------------

def _device_events(xplane_path):
  """[(kernel name, hlo_op, duration ns)] of the device's work: GPU streams, or the XLA CPU ops."""
  from jax.profiler import ProfileData  # pylint: disable=import-outside-toplevel
  data = ProfileData.from_file(xplane_path)
  planes = list(data.planes)
  gpu = [p for p in planes if p.name.startswith("/device:GPU")]
  events = []
  for plane in gpu[:1] or [p for p in planes if p.name == "/host:CPU"]:
    for line in plane.lines:
      if gpu and not line.name.startswith("Stream"):
        continue
      for event in line.events:
        stats = dict(event.stats)
        if not gpu and "hlo_op" not in stats:
          continue  # host work that is not an XLA op
        events.append((event.name, str(stats.get("hlo_op", "")), float(event.duration_ns)))
  return events, (gpu[0].name if gpu else "/host:CPU")


def summarize(xplane_path, hlo_text, steps):
  """Device time per step by category and the top kernels, from a trace and the step's optimized HLO."""
  instructions, computations = parse_hlo(hlo_text or "")
  events, device = _device_events(xplane_path)
  by_category, by_kernel = collections.Counter(), {}
  for name, hlo_op, ns in events:
    category = classify(hlo_op.split(",")[0], instructions, computations)
    if category == "container":
      continue
    if category is None:
      category = next((c for c, pattern in _KERNEL_PATTERNS if pattern.search(name)), "quantization/elementwise"
                      if hlo_op else "other")
    by_category[category] += ns
    kernel = by_kernel.setdefault(name, {"name": name, "hlo_op": hlo_op, "category": category, "ns": 0.0, "count": 0})
    kernel["ns"] += ns
    kernel["count"] += 1
  total = sum(by_category.values())
  per_step = lambda ns: ns / steps / 1e6
  categories = [{"category": c, "ms_per_step": per_step(ns), "share": ns / total if total else 0.0}
                for c, ns in by_category.most_common()]
  top = sorted(by_kernel.values(), key=lambda k: -k["ns"])[:TOP_KERNELS]
  kernels = [{"name": k["name"], "hlo_op": k["hlo_op"], "category": k["category"], "ms_per_step": per_step(k["ns"]),
              "calls_per_step": k["count"] / steps} for k in top]
  return {"device": device, "device_ms_per_step": per_step(total), "categories": categories, "top_kernels": kernels,
          "trace": xplane_path}


def format_summary(summary):
  lines = [f"profile: device time per step {summary['device_ms_per_step']:.2f} ms on {summary['device']} "
           f"(trace {summary['trace']})",
           f"  {'category':<26} {'ms/step':>9} {'share':>7}"]
  lines += [f"  {c['category']:<26} {c['ms_per_step']:>9.2f} {c['share']:>7.1%}" for c in summary["categories"]]
  lines.append(f"  top kernels: {'ms/step':>9} {'calls':>6}  category                   name")
  lines += [f"  {'':<13}{k['ms_per_step']:>9.2f} {k['calls_per_step']:>6.1f}  {k['category']:<26} {k['name'][:90]}"
            for k in summary["top_kernels"][:PRINTED_KERNELS]]
  return "\n".join(lines)
