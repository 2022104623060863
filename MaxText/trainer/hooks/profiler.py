"""Profiling MaxText's way: an XProf trace (or an nsys capture range) of chosen steps, and where the time went.

`profiler=xplane` traces steps [skip_first_n_steps_for_profiler, + profiler_steps) into
run_dir/tensorboard/plugins/profile/<time>/ (TensorBoard's profile plugin and Perfetto open it; a
perfetto_trace.json.gz is written beside it), then prints device time per step by category and by kind in
aot.hlo's names (the ones train_compile's estimate uses: gemm by its kind -- bf16, fp8, fp4_block_scaled, te, ...;
attention; elementwise -- XLA's fusions, copies, the Pallas and Transformer Engine quantizers; collective) and the
top kernels, and writes the same to run_dir/profile_summary.json. Events are matched to the train
step's optimized HLO (each kernel carries its `hlo_op`; a kernel without one is matched by its name), so a
GEMM's kind names the types its operands really have after XLA's rewrites (cuBLAS calls and Triton /
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

TOP_KERNELS, PRINTED_KERNELS = 40, 10  # kept in profile_summary.json / printed
_CONTAINERS = ("while", "conditional", "call")  # their time is their body's ops' (CPU traces both): not counted
_KERNEL_PATTERNS = (  # fallback when a kernel carries no hlo_op we know: (category, kind, its name's pattern)
  ("attention", "other", re.compile(r"fmha|flash|cudnn|attention", re.I)),
  ("gemm", "other", re.compile(r"gemm|xmma|cutlass|nvjet|matmul|\bdot\b", re.I)),
  ("collective", "nccl", re.compile(r"nccl|all_reduce|allreduce|all_gather|reduce_scatter", re.I)),
  ("elementwise", "copy", re.compile(r"memcpy|memset|copy|transpose", re.I)),
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


def op_categories(hlo_text, on_gpu=True):
  """{HLO instruction name: (category, kind)} of a step's optimized HLO, in aot.hlo's categories (gemm, attention,
  elementwise, collective) and kinds; ("container", opcode) for a loop, call or conditional (its time is its body's
  ops'). `on_gpu=False`: a dot is the host library's GEMM (kind by its operands' type), not XLA:GPU's loop."""
  module = hlo.parse(hlo_text or "")
  out = {}
  for instrs in module.computations.values():
    for instr in instrs:
      if instr.opcode in _CONTAINERS:
        out[instr.name] = ("container", instr.opcode)
        continue
      found = hlo.classify(module, instr)
      if found is None and instr.opcode.endswith("-done") and hlo.collective_opcode(module.operand(instr, 0) or instr):
        found = ("collective", hlo.collective_opcode(module.operand(instr, 0)), 0.0, ())
      if found is None:
        continue
      category, kind, _, dtypes = found
      if kind == "naive_loop" and not on_gpu:
        kind = hlo.gemm_kind(dtypes)
      out[instr.name] = (category, kind)
  return out


def kernel_names(op_names):
  """{kernel-style name: HLO op}: XLA names a fusion's GPU kernel after the op with '.' and '-' as '_'
  (gemm_fusion_dot.7 -> gemm_fusion_dot_7), sometimes with a '_<n>' suffix."""
  return {re.sub(r"[.\-]", "_", n): n for n in op_names}


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


def _event_category(name, hlo_op, ops, names):
  """(category, kind) of one trace event: its hlo_op's, else the op its kernel name leads to, else its name's
  pattern; ("container", ...) for a loop's own event."""
  found = ops.get(hlo_op.split(",")[0]) or ops.get(kernel_op(name, names))
  if found is not None:
    return found
  return next(((c, k) for c, k, pattern in _KERNEL_PATTERNS if pattern.search(name)), ("elementwise", "other"))


def summarize(xplane_path, hlo_text, steps):
  """Device time per step by category (aot.hlo's) and by category/kind, and the top kernels, from a trace and the
  step's optimized HLO."""
  events, device = _device_events(xplane_path)
  ops = op_categories(hlo_text, on_gpu=device.startswith("/device:GPU"))
  names = kernel_names(ops)
  by_category, by_kind, by_kernel = collections.Counter(), collections.Counter(), {}
  for name, hlo_op, ns in events:
    category, kind = _event_category(name, hlo_op, ops, names)
    if category == "container":
      continue
    by_category[category] += ns
    by_kind[f"{category}/{kind}"] += ns
    kernel = by_kernel.setdefault(
      name, {"name": name, "hlo_op": hlo_op, "category": category, "kind": kind, "ns": 0.0, "count": 0}
    )
    kernel["ns"] += ns
    kernel["count"] += 1
  total = sum(by_category.values())
  per_step = lambda ns: ns / steps / 1e6
  share = lambda ns: ns / total if total else 0.0
  top = sorted(by_kernel.values(), key=lambda k: -k["ns"])[:TOP_KERNELS]
  return {
    "device": device,
    "device_ms_per_step": per_step(total),
    "categories": [
      {"category": c, "ms_per_step": per_step(ns), "share": share(ns)} for c, ns in by_category.most_common()
    ],
    "kinds": [{"kind": k, "ms_per_step": per_step(ns), "share": share(ns)} for k, ns in by_kind.most_common()],
    "top_kernels": [
      {
        "name": k["name"],
        "hlo_op": k["hlo_op"],
        "category": k["category"],
        "kind": k["kind"],
        "ms_per_step": per_step(k["ns"]),
        "calls_per_step": k["count"] / steps,
      }
      for k in top
    ],
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
    f"  {'category / kind':<26} {'ms/step':>9} {'share':>7}",
  ]
  for c in summary["categories"]:
    lines.append(f"  {c['category']:<26} {c['ms_per_step']:>9.2f} {c['share']:>7.1%}")
    kinds = [k for k in summary.get("kinds", []) if k["kind"].startswith(c["category"] + "/")]
    lines += [f"    {k['kind']:<24} {k['ms_per_step']:>9.2f} {k['share']:>7.1%}" for k in kinds if len(kinds) > 1]
  if summary.get("attention_tflops"):
    lines.append(
      f"  attention kernels: {summary['attention_tflops']:.0f} TFLOP/s (causal, forward + backward = 3 x forward)"
    )
  lines.append(f"  top kernels: {'ms/step':>9} {'calls':>6}  category/kind              name")
  lines += [
    f"  {'':<13}{k['ms_per_step']:>9.2f} {k['calls_per_step']:>6.1f}  {k['category'] + '/' + k['kind']:<26} "
    f"{k['name'][:90]}"
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
