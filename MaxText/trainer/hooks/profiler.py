"""Profiling MaxText's way: an XProf trace (or an nsys capture range) of chosen steps, and where the time went.

`profiler=xplane` traces steps [skip_first_n_steps_for_profiler, + profiler_steps) into
run_dir/tensorboard/plugins/profile/<time>/ (TensorBoard's profile plugin and Perfetto open it; a
perfetto_trace.json.gz is written beside it), then prints device time per step by category (GEMMs
by operand dtype, attention, quantization and other elementwise fusions, collectives, copies) and the
top kernels, and writes the same to run_dir/profile_summary.json. Events are matched to the train
step's optimized HLO (each kernel carries its `hlo_op`; a kernel without one is matched by its name), so a
GEMM's category names the dtypes its operands really have after XLA's rewrites (cuBLAS calls and Triton /
cuDNN GEMM fusions alike); the summary adds the attention kernels' achieved TFLOP/s and the compiled step's
memory analysis. `profiler=nsys` brackets the same steps with cudaProfilerStart/Stop for `nsys profile
--capture-range=cudaProfilerApi`.
"""

import collections
import ctypes
import ctypes.util
import glob
import json
import os
import re

import jax

from MaxText.aot import hlo
from MaxText.model import accounting
from MaxText.config import ConfigError
from MaxText.trainer.loop import Hook

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


class ProfilerError(ConfigError):
  """profiler=nsys where the CUDA runtime can't be loaded: a user error, before training."""


class Profiler:
  """Starts and stops the configured profiler around the chosen steps of the train loop.

  The window is [skip_first_n_steps_for_profiler, + profiler_steps), cut at the last step: a window
  that runs past `steps` ends (and is summarised) at the last step; one that starts after it is said
  up front. A run stopped inside the window summarises the steps it profiled.
  """

  def __init__(self, cfg, run_dir, enabled=True):
    self.mode = cfg.profiler if enabled else ""
    self.first = cfg.skip_first_n_steps_for_profiler
    self.last = min(self.first + cfg.profiler_steps, cfg.steps) - 1
    self.trace_dir = os.path.join(run_dir, "tensorboard")
    self.summary_path = os.path.join(run_dir, "profile_summary.json")
    self.hlo_path = os.path.join(run_dir, "profile_step.hlo.txt")
    self.attention_flops = accounting.training_flops_per_device(cfg).attention_core
    self.active = False
    self._profiled = None  # (last step profiled, its compiled_step_fn) while the window is open
    if self.mode and self.first >= cfg.steps:
      print(
        f"warning: profiler={self.mode}: skip_first_n_steps_for_profiler={self.first} is not before steps="
        f"{cfg.steps}, so no step will be profiled; lower it",
        flush=True,
      )
      self.mode = ""
    if self.mode == "nsys":
      self._cudart = _load_cudart()

  def starts_at(self, step):
    """Whether the profile window begins with `step` (the loop lets earlier steps finish first)."""
    return bool(self.mode) and step == self.first and not self.active

  def ends_at(self, step):
    """Whether `step` is the profile window's last (the loop waits for it before dispatching more)."""
    return bool(self.mode) and step == self.last

  def before_step(self, step):
    if self.mode and step == self.first and not self.active:
      if self.mode == "xplane":
        jax.profiler.start_trace(self.trace_dir, create_perfetto_trace=True)
      elif not self._cuda("cudaProfilerStart"):
        self.mode = ""  # reported; the run goes on unprofiled
        return
      self.active = True

  def after_step(self, step, outputs, compiled_step_fn):
    """Stops after the last profiled step (once its outputs are ready); prints and returns the summary.
    `compiled_step_fn()`: the compiled step (its HLO text and memory analysis go in the summary) or its HLO text."""
    if not self.active:
      return None
    self._profiled = (step, compiled_step_fn)
    if step < self.last:
      return None
    jax.block_until_ready(outputs)
    return self._stop()

  def _stop(self):
    """Ends the window after the steps in `_profiled`: nsys's capture range, or the trace and its summary."""
    last, compiled_step_fn = self._profiled
    self.active, self._profiled = False, None
    if self.mode == "nsys":
      self._cuda("cudaProfilerStop")
      return None
    jax.profiler.stop_trace()
    return self._summarize(last, compiled_step_fn)

  def _summarize(self, last, compiled_step_fn):
    compiled = compiled_step_fn()
    hlo_text = compiled if compiled is None or isinstance(compiled, str) else compiled.as_text()
    with open(self.hlo_path, "w", encoding="utf-8") as f:
      f.write(hlo_text or "")  # the ops each kernel's hlo_op names, for reading a fusion's body
    summary = summarize(newest_xplane(self.trace_dir), hlo_text, steps=last - self.first + 1)
    summary["steps"] = [self.first, last]
    summary["attention_tflops"] = attention_tflops(summary, self.attention_flops)
    summary["memory"] = None if compiled is None or isinstance(compiled, str) else compiled_memory(compiled)
    print(format_summary(summary), flush=True)
    with open(self.summary_path, "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)
    return summary

  def close(self):
    """A run that stops inside the window (preemption, an error) still ends it and summarises what it got."""
    if not self.active:
      return
    if self._profiled is None:
      self.active = False
      if self.mode == "xplane":
        jax.profiler.stop_trace()
      else:
        self._cuda("cudaProfilerStop")
      return
    try:
      self._stop()
    except Exception as e:  # pylint: disable=broad-except  # never hides why the run stopped
      print(
        f"warning: the profile of steps {self.first}.. could not be summarised ({type(e).__name__}: {e})", flush=True
      )

  def _cuda(self, function):
    """cudaProfilerStart/Stop; a CUDA error is one warning line (the run goes on) and False."""
    code = getattr(self._cudart, function)()
    if code:
      print(
        f"warning: profiler=nsys: {function} failed (cudaError {code}); no nsys capture of steps "
        f"{self.first}-{self.last} (is a GPU visible to this process?)",
        flush=True,
      )
    return not code


def _load_cudart():
  """The CUDA runtime library (nsys's capture range): the system's, or the one jax's CUDA wheels install."""
  candidates = [ctypes.util.find_library("cudart")] + sorted(
    glob.glob(
      os.path.join(os.path.dirname(os.path.dirname(jax.__file__)), "nvidia", "cuda_runtime", "lib", "libcudart.so*")
    )
  )
  for path in [c for c in candidates if c] + ["libcudart.so.12", "libcudart.so"]:
    try:
      library = ctypes.CDLL(path)
      if hasattr(library, "cudaProfilerStart") and hasattr(library, "cudaProfilerStop"):
        return library
    except OSError:
      continue
  raise ProfilerError(
    "profiler=nsys needs the CUDA runtime (libcudart.so), which is not on this machine; run it "
    "on an NVIDIA GPU under nsys profile --capture-range=cudaProfilerApi, or use profiler=xplane"
  )


def newest_xplane(trace_dir):
  files = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.xplane.pb")), key=os.path.getmtime)
  if not files:
    raise RuntimeError(f"no .xplane.pb under {trace_dir}/plugins/profile")
  return files[-1]


# -- the optimized HLO: what each op is ------------------------------------------------------------


def _parenthesized(text):
  """The text inside the first balanced (...) of `text`, and what follows it."""
  start = text.find("(")
  if start < 0:  # e.g. a line of a computation's attributes, not an instruction
    return "", text
  depth = 0
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return text[start + 1 : i], text[i + 1 :]
  return text[start + 1 :], ""


_DTYPE = re.compile(r"\b(pred|[subf]\d+|bf16|f8e\w+|f4e\w+|c\d+)\[")
_FUSION_KIND = re.compile(r'"fusion_backend_config":\s*\{\s*"kind":\s*"([^"]+)"')
# Fusions XLA:GPU emits as one GEMM kernel: Triton GEMMs (at small shapes or with xla_gpu_enable_triton_gemm),
# their nested form, cuBLAS / cuDNN GEMM fusions.
_GEMM_FUSION_KINDS = (
  "__triton_gemm",
  "__triton_nested_gemm_fusion",
  "__triton_scaled_dot_fusion",
  "__cublas",
  "__cudnn$fusion",
)


def parse_hlo(hlo_text):
  """{instruction name: (opcode, result type, operand dtypes, target, called computation)} and {computation
  name: [instruction names]} of an optimized HLO module's text; target: a custom call's target, or a fusion's
  backend kind (e.g. __triton_gemm)."""
  instructions, computations, current = {}, collections.defaultdict(list), None
  for line in hlo_text.splitlines():
    stripped = line.strip()
    if " = " not in stripped:
      if stripped.endswith("{"):
        current = stripped.split()[1 if stripped.startswith("ENTRY") else 0].lstrip("%")
      continue
    name, rhs = stripped.split(" = ", 1)
    name = name.replace("ROOT", "").strip().lstrip("%")
    result_type, rest = hlo.split_type(rhs)
    opcode = rest.split("(", 1)[0].strip()
    operands, attributes = _parenthesized(rest)
    target = re.search(r'custom_call_target="([^"]+)"', attributes) or _FUSION_KIND.search(attributes)
    calls = re.search(r"calls=%?([\w.\-]+)", attributes)
    instructions[name] = (
      opcode,
      result_type,
      _DTYPE.findall(operands) or _operand_dtypes(operands, instructions),
      target.group(1) if target else "",
      calls.group(1) if calls else "",
    )
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


def _body_dot(calls, instructions, computations, depth=0):
  """The operand dtypes of the first dot in a called computation (nested fusions searched too), or None."""
  for name in computations.get(calls, ()):
    sub_opcode, _, sub_dtypes, _, sub_calls = instructions.get(name, ("",) * 5)
    if sub_opcode in ("dot", "convolution", "scaled-dot"):
      return sub_dtypes
    if sub_opcode == "fusion" and sub_calls and depth < 4:
      found = _body_dot(sub_calls, instructions, computations, depth + 1)
      if found is not None:
        return found
  return None


def classify(op_name, instructions, computations):
  """The category (GEMMs as 'gemm <dtype>'; 'container' for loops and calls) of one optimized-HLO op, or None."""
  if op_name not in instructions:
    return None
  opcode, _, dtypes, target, calls = instructions[op_name]
  if opcode in _CONTAINERS:
    return "container"
  if opcode in ("dot", "convolution", "scaled-dot"):
    return _gemm_label(dtypes)
  if opcode == "custom-call":
    lowered = target.lower()
    if "fmha" in lowered or "flash" in lowered or "attention" in lowered:
      return "attention"
    if any(k in lowered for k in ("gemm", "matmul", "cublas", "dot")):
      return _gemm_label(dtypes)
    return "other"
  if opcode == "fusion" and target in _GEMM_FUSION_KINDS:
    return _gemm_label(_body_dot(calls, instructions, computations) or dtypes)
  if any(opcode.startswith(c) for c in _COLLECTIVES):
    return "collective"
  if opcode in ("copy", "copy-start", "copy-done", "transpose"):
    return "copy/transpose"
  if calls:
    return _classify_fusion_body(calls, instructions, computations)
  if opcode in ("fusion", "reduce", "convert", "multiply", "add", "select", "broadcast"):
    return "quantization/elementwise"
  return None


def _classify_fusion_body(calls, instructions, computations):
  body = [instructions[n] for n in computations.get(calls, ()) if n in instructions]
  for sub_opcode, _, sub_dtypes, sub_target, _ in body:
    if sub_opcode in ("dot", "convolution", "scaled-dot"):
      return _gemm_label(sub_dtypes)
    if sub_opcode == "custom-call" and ("fmha" in sub_target.lower() or "flash" in sub_target.lower()):
      return "attention"
    if any(sub_opcode.startswith(c) for c in _COLLECTIVES):
      return "collective"
  if body and all(o in ("parameter", "copy", "transpose", "bitcast", "reshape") for o, *_ in body):
    return "copy/transpose"
  return "quantization/elementwise"


def kernel_names(instructions):
  """{kernel-style name: HLO op}: XLA names a fusion's GPU kernel after the op with '.' and '-' as '_'
  (gemm_fusion_dot.7 -> gemm_fusion_dot_7), sometimes with a '_<n>' suffix."""
  return {re.sub(r"[.\-]", "_", n): n for n in instructions}


def kernel_op(kernel_name, names):
  """The HLO op a kernel was emitted for, by its name (for kernels the trace gives no known hlo_op), or None."""
  name = re.sub(r"[.\-]", "_", kernel_name)
  while name and name not in names:
    stripped = re.sub(r"_\d+$", "", name)
    name = "" if stripped == name else stripped
  return names.get(name)


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
  names = kernel_names(instructions)
  events, device = _device_events(xplane_path)
  by_category, by_kernel = collections.Counter(), {}
  for name, hlo_op, ns in events:
    category = classify(hlo_op.split(",")[0], instructions, computations)
    if category is None:
      category = classify(kernel_op(name, names), instructions, computations)
    if category == "container":
      continue
    if category is None:
      category = next(
        (c for c, pattern in _KERNEL_PATTERNS if pattern.search(name)),
        "quantization/elementwise" if hlo_op else "other",
      )
    by_category[category] += ns
    kernel = by_kernel.setdefault(name, {"name": name, "hlo_op": hlo_op, "category": category, "ns": 0.0, "count": 0})
    kernel["ns"] += ns
    kernel["count"] += 1
  total = sum(by_category.values())
  per_step = lambda ns: ns / steps / 1e6
  categories = [
    {"category": c, "ms_per_step": per_step(ns), "share": ns / total if total else 0.0}
    for c, ns in by_category.most_common()
  ]
  top = sorted(by_kernel.values(), key=lambda k: -k["ns"])[:TOP_KERNELS]
  kernels = [
    {
      "name": k["name"],
      "hlo_op": k["hlo_op"],
      "category": k["category"],
      "ms_per_step": per_step(k["ns"]),
      "calls_per_step": k["count"] / steps,
    }
    for k in top
  ]
  return {
    "device": device,
    "device_ms_per_step": per_step(total),
    "categories": categories,
    "top_kernels": kernels,
    "trace": xplane_path,
  }


def compiled_memory(compiled):
  """A compiled step's device memory per device from XLA's memory analysis: {peak_bytes (arguments + outputs -
  donated/aliased + temporaries), argument_bytes, output_bytes, alias_bytes, temp_bytes}, or None."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  out = {f"{k}_bytes": int(getattr(analysis, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp")}
  out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
  return out


def attention_tflops(summary, attention_flops):
  """Achieved TFLOP/s of the attention kernels (cuDNN's; XLA's dot_product attention counts as GEMMs): the
  causal attention FLOPs of a step per device (MaxText's count, forward + backward = 3 x forward; FA2-style
  counts add the backward's recomputed QK^T, 3.5 x) over their device time. None without attention kernels."""
  ms = sum(c["ms_per_step"] for c in summary["categories"] if c["category"] == "attention")
  return attention_flops / (ms / 1e3) / 1e12 if ms > 0 else None


def format_summary(summary):
  lines = [
    f"profile: device time per step {summary['device_ms_per_step']:.2f} ms on {summary['device']} "
    f"(trace {summary['trace']})",
    f"  {'category':<26} {'ms/step':>9} {'share':>7}",
  ]
  lines += [f"  {c['category']:<26} {c['ms_per_step']:>9.2f} {c['share']:>7.1%}" for c in summary["categories"]]
  if summary.get("attention_tflops"):
    lines.append(
      f"  attention kernels: {summary['attention_tflops']:.0f} TFLOP/s (causal, forward + backward = 3 x forward)"
    )
  lines.append(f"  top kernels: {'ms/step':>9} {'calls':>6}  category                   name")
  lines += [
    f"  {'':<13}{k['ms_per_step']:>9.2f} {k['calls_per_step']:>6.1f}  {k['category']:<26} {k['name'][:90]}"
    for k in summary["top_kernels"][:PRINTED_KERNELS]
  ]
  return "\n".join(lines)


class ProfilerHook(Hook):
  """The profile window as the loop's events: the loop drains before its first step and after its last, so the
  trace holds the profiled steps only and the summary reads them finished."""

  def __init__(self, profiler: Profiler):
    self.profiler = profiler

  def needs_sync(self, step):
    return self.profiler.starts_at(step) or self.profiler.ends_at(step - 1)

  def before_step(self, step):
    self.profiler.before_step(step)

  def on_step(self, result, progress):
    outputs = (progress.state.params, progress.state.opt_state)
    return self.profiler.after_step(result.step, outputs, result.compiled) is not None

  def close(self):
    self.profiler.close()
