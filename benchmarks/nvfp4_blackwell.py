"""#44's Blackwell table: Llama 3 8B on 8 GB200s and Llama 3.1 405B layers on GB300s in bf16, FP8 current scaling
on every Dense layer, te_nvfp4 / te_nvfp4_no_rht on every Dense layer and the seeds' recipe (NVFP4 MLP GEMMs, FP8
attention projections), from train_compile's roofline (MaxText/aot/roofline.py): step time, speedup over bf16, model
TFLOP/s per GPU, the bytes quantization adds outside the GEMMs, and the kernels that dominate. Every figure is a
compiled estimate for its target (deviceless compile on this machine), never a measurement.

    scripts/te/python.sh benchmarks/nvfp4_blackwell.py [--setups 8b,405b] [--modes NAME,...] [--json out.json]
        [--versus before.json]     (a JSON of another commit: each mode's step then and now)
        [--on-mesh]                (each mode compiled on the whole mesh too, the whole model: its own table)
    python benchmarks/nvfp4_blackwell.py --from-json out.json [--versus before.json]   (the tables again)

How the multi-GPU step is estimated: each mode is compiled for ONE GPU of the target at the per-device shape (the
same sequences per device, the whole model), and its difference from bf16 compiled the same way is added to the bf16
step compiled on the full multi-GPU mesh (FSDP). Under FSDP every device runs the whole model on its own sequences,
so the GEMMs, attention and quantizers are per-device work; the collectives (weights gathered and gradients
reduce-scattered in bf16) are taken as bf16's in every mode (#46 compiles the quantized steps on the mesh with no
more collective bytes than bf16's). The one-GPU compile quantizes every weight whole, as each FSDP device does after
the all-gather. 405B: `--layers` of its 126 layers compiled (scan_layers), the per-mode difference scaled to 126.
`--on-mesh` also compiles each mode on the mesh itself, the whole model (the quantized GEMMs partitioned per shard,
quantization/partition.py: each device quantizes its own shards, the weights gathered quantized), a second table with
each mode's own collectives and peak memory; 8B's take about 2 min per mode on a 2-core box, 405B's far longer.
"""

import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import provenance  # noqa: E402

ALL_DENSE = ["quantization_scope=all_dense"]
XLA = ["quantization_backend=xla"]  # our NVFP4: Pallas quantizers (narrow operands) + cuDNN's block-scaled FP4 dot
# mode: overrides (backend auto = Transformer Engine for FP8 where it compiles)
MODES = {
  "bf16": ["quantization="],
  "te_fp8_currentscaling all-dense": ["quantization=te_fp8_currentscaling", *ALL_DENSE],
  "te_nvfp4 all-dense": ["quantization=te_nvfp4", *ALL_DENSE, *XLA],
  "te_nvfp4_no_rht all-dense": ["quantization=te_nvfp4_no_rht", *ALL_DENSE, *XLA],
  "seeds' recipe": [
    "quantization=te_nvfp4",
    *XLA,
    "attention_quantization=te_fp8_currentscaling",
    "attention_quantization_backend=auto",
  ],
  "peer: TE te_nvfp4 all-dense": ["quantization=te_nvfp4", *ALL_DENSE, "quantization_backend=te"],
  "peer: TE seeds' recipe": [
    "quantization=te_nvfp4",
    "quantization_backend=te",
    "attention_quantization=te_fp8_currentscaling",
  ],
}
# The quantized operands kept for the backward instead of quantized again in the rematerialized forward (the
# weights' 16x16 quantizers and their amax run once per step instead of twice); bf16 and FP8 are unchanged by it.
KEEP_QUANTIZED = {"minimal": "minimal_with_quantization", "full": None}
VARIANTS = ("te_nvfp4 all-dense", "seeds' recipe")
# (name, config, the one-GPU target, the mesh target for bf16, per-device overrides, model layers)
SETUPS = {
  "8b": (
    "Llama 3 8B, 8 x GB200 (fsdp 8, 2 x 8192 tokens/GPU)",
    "configs/gb200/llama3_8b_fp8.yml",
    ["compile_topology=gb200-1", "ici_fsdp_parallelism=1"],
    ["compile_topology=gb200-8", "ici_fsdp_parallelism=8"],
    ["per_device_batch_size=2", "dcn_data_parallelism=1"],
    32,
  ),
  "405b": (
    "Llama 3.1 405B, 128 x GB300 (fsdp 4 x 32, 1 x 8192 tokens/GPU)",
    "configs/gb300/llama3.1_405b_fp8.yml",
    ["compile_topology=gb300-1", "ici_fsdp_parallelism=1", "dcn_fsdp_parallelism=1"],
    ["compile_topology=gb300-64", "compile_topology_num_slices=2"],
    [],
    126,
  ),
}
GIB = 2**30


# -- the child: one compile, its kernels grouped -------------------------------------------------------------------


def _label(k):
  """A kernel's group: the Pallas kernel's name, a GEMM's kind and operand types, else its kind and op path's tail."""
  if k.kind == "pallas":
    return k.pallas_name or "pallas"
  if k.category == "gemm":
    return f"gemm {k.kind} {'x'.join(k.dtypes[:2])}"
  if k.category in ("attention", "collective"):
    return f"{k.category} {k.kind}"
  scope = [p for p in k.scope.split("/") if p and not p.startswith(("jit(", "while", "body", "cond", "checkpoint"))]
  return f"{k.kind} {'/'.join(scope[-2:])}"


def quantizing(k):
  """Whether a non-GEMM kernel is quantization's work (a quantizer, an amax, a dequantize, a scale)."""
  text = f"{k.scope} {k.target} {k.name}".lower()
  return k.kind == "pallas" or any(w in text for w in ("quantiz", "amax", "_scale", "nvfp4", "fp8", "e2m1", "e4m3"))


def child(config, overrides, out):
  if "JAX_PLATFORMS" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["JAX_PLATFORMS"] = "cpu"  # as train_compile: the target's devices are compile-only
  from MaxText import config as config_lib, train_compile  # pylint: disable=import-outside-toplevel
  from MaxText.aot import roofline  # pylint: disable=import-outside-toplevel

  cfg = config_lib.load(str(REPO / config), overrides)
  step, rep = train_compile.compile_and_report(cfg)
  groups = collections.defaultdict(
    lambda: {"ms": 0.0, "memory_ms": 0.0, "bytes": 0.0, "category": "", "quantization": False, "pallas": False}
  )
  bandwidth = step.gpu.memory_bandwidth * roofline.DEFAULT.memory
  for k in step.kernels:
    g = groups[_label(k)]
    g["ms"] += roofline.kernel_seconds(k, step.gpu) * k.count * 1e3
    g["memory_ms"] += k.bytes / bandwidth * k.count * 1e3  # the kernel's time were it memory-bound
    g["pallas"] = k.kind == "pallas"
    g["bytes"] += k.bytes * k.count
    g["category"] = k.category
    g["quantization"] = g["quantization"] or (k.category == "elementwise" and quantizing(k))
  rep["kernel_groups"] = dict(groups)
  pathlib.Path(out).write_text(json.dumps(rep) + "\n", encoding="utf-8")


# -- the parent: one process per compile, the table ----------------------------------------------------------------


def compile_row(config, target, overrides):
  """The child's report (dict), or the error line."""
  with tempfile.TemporaryDirectory() as tmp:
    out = pathlib.Path(tmp) / "r.json"
    argv = [sys.executable, __file__, "--child", config, str(out), *target, *overrides]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False, env=dict(os.environ))
    if not out.exists():
      lines = [line for line in done.stderr.splitlines() if line.strip()]
      return next((line for line in lines if line.startswith("error:")), lines[-1][:300] if lines else "failed")
    return json.loads(out.read_text(encoding="utf-8"))


def _non_gemm_bytes(rep):
  return sum(g["bytes"] for g in rep["kernel_groups"].values() if g["category"] == "elementwise")


def _hbm_bytes(rep):
  return sum(g["bytes"] for g in rep["kernel_groups"].values() if g["category"] != "collective")


def _top(rep, scale, n=4):
  """The quantization kernels that take the most time, 'name ms' each (scaled to the model's layers)."""
  groups = [(g["ms"] * scale, name) for name, g in rep["kernel_groups"].items() if g["quantization"]]
  return "; ".join(f"{name} {ms:.1f}" for ms, name in sorted(groups, reverse=True)[:n] if ms >= 0.5)


def _compute_bound_ms(rep):
  """What the Pallas quantizers take beyond their bytes' time (their calibrated compute, roofline.py)."""
  return sum(g["ms"] - g["memory_ms"] for g in rep["kernel_groups"].values() if g.get("pallas"))


def table(setup_key, name, reports, mesh_bf16, layers_compiled, layers):
  scale = layers / layers_compiled
  base = reports["bf16"]
  base_ms = base["estimate"]["ms_per_step"]["total"]
  mesh_ms = mesh_bf16["estimate"]["ms_per_step"]
  flops = mesh_bf16["flops_per_device"]
  base_bytes = _hbm_bytes(base) * scale
  print(f"\n### {name}: compiled estimates (gb200/gb300 targets), not measurements")
  print(
    f"bf16 on the mesh ({mesh_bf16['target']}, {mesh_bf16['num_devices']} GPUs): {mesh_ms['total']:.1f} ms = gemm "
    f"{mesh_ms['gemm']:.1f} + elementwise {mesh_ms['elementwise']:.1f} + attention {mesh_ms['attention']:.1f} + "
    f"collectives {mesh_ms['collectives']:.1f}; per-device compiles on {base['target']}"
    + (f" with {layers_compiled} of {layers} layers, differences x {scale:g}" if scale != 1 else "")
  )
  print(
    "| mode (backend) | step ms | vs bf16 | model TFLOP/s/GPU | GEMM ms | non-GEMM ms (over bf16's) | "
    "quantization's extra non-GEMM GB (% of bf16 step's bytes) | what-if: quantizers at their bytes' time: "
    "step ms, vs bf16 | what-if: weights quantized per FSDP shard (#46): step ms, vs bf16 | "
    "dominant quantization kernels (ms) |"
  )
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
  for mode, rep in reports.items():
    if isinstance(rep, str):
      print(f"| {mode} | failed: {rep} | | | | | | | | |")
      continue
    ms = rep["estimate"]["ms_per_step"]
    step_ms = mesh_ms["total"] + (ms["total"] - base_ms) * scale
    extra = (_non_gemm_bytes(rep) - _non_gemm_bytes(base)) * scale
    gemm_ms = mesh_ms["gemm"] + (ms["gemm"] - base_ms_part(base, "gemm")) * scale
    non_gemm = step_ms - gemm_ms
    base_non_gemm = mesh_ms["total"] - mesh_ms["gemm"]
    backend = ", ".join(f"{r}: {b}" for r, b in rep["backends"].items()) or "bf16"
    at_bytes = step_ms - _compute_bound_ms(rep) * scale
    what_if = (
      f"{at_bytes:.1f}, {mesh_ms['total'] / at_bytes:.3f}x" if rep["kernel_groups"] and at_bytes < step_ms else "-"
    )
    # The one-GPU compile quantizes each weight whole; quantized per FSDP shard and gathered narrow (#46), a device
    # runs 1/num_devices of the 16x16 weight quantizers (their amax and the collectives left as they are).
    weights_ms = sum(g["ms"] for name, g in rep["kernel_groups"].items() if "16x16" in name) * scale
    per_shard = step_ms - weights_ms * (1 - 1 / mesh_bf16["num_devices"])
    sharded = f"{per_shard:.1f}, {mesh_ms['total'] / per_shard:.3f}x" if weights_ms else "-"
    print(
      f"| {mode} ({backend}) | {step_ms:.1f} | {mesh_ms['total'] / step_ms:.3f}x | {flops / step_ms / 1e9:,.0f} | "
      f"{gemm_ms:.1f} | {non_gemm:.1f} ({non_gemm - base_non_gemm:+.1f}) | "
      f"{extra / 1e9:.1f} ({extra / base_bytes:.1%}) | {what_if} | {sharded} | {_top(rep, scale) or '-'} |",
      flush=True,
    )
  return {"setup": setup_key, "mesh_bf16": mesh_bf16, "per_device": reports, "scale": scale}


def mesh_table(name, on_mesh):
  """The modes compiled on the mesh itself (`--on-mesh`): each step's own estimate, collectives and peak memory."""
  base = on_mesh["bf16"]
  base_ms = base["estimate"]["ms_per_step"]
  flops = base["flops_per_device"]
  print(f"\n### {name}, every mode compiled on the mesh ({base['target']}, {base['num_devices']} GPUs): estimates")
  print(
    "| mode (backend) | step ms | vs bf16 | model TFLOP/s/GPU | GEMM ms | non-GEMM ms (over bf16's) | collectives ms | "
    "collective GiB/GPU | peak GiB/GPU | dominant quantization kernels (ms) |"
  )
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
  for mode, rep in on_mesh.items():
    if isinstance(rep, str):
      print(f"| {mode} | failed: {rep} | | | | | | | | |")
      continue
    ms = rep["estimate"]["ms_per_step"]
    non_gemm, base_non_gemm = ms["total"] - ms["gemm"], base_ms["total"] - base_ms["gemm"]
    backend = ", ".join(f"{r}: {b}" for r, b in rep["backends"].items()) or "bf16"
    print(
      f"| {mode} ({backend}) | {ms['total']:.1f} | {base_ms['total'] / ms['total']:.3f}x | "
      f"{flops / ms['total'] / 1e9:,.0f} | {ms['gemm']:.1f} | {non_gemm:.1f} ({non_gemm - base_non_gemm:+.1f}) | "
      f"{ms['collectives']:.1f} | {sum(rep['collectives'].values()) / GIB:.1f} | "
      f"{rep['memory']['peak_bytes'] / GIB:.1f} | {_top(rep, 1) or '-'} |",
      flush=True,
    )


def mesh_step_ms(record, mode):
  """A mode's estimated step on the mesh (ms) from a record of the JSON: bf16 on the mesh plus its difference."""
  per_device = record["per_device"]
  total = lambda rep: rep["estimate"]["ms_per_step"]["total"]
  return total(record["mesh_bf16"]) + (total(per_device[mode]) - total(per_device["bf16"])) * record["scale"]


def versus(records, before_records):
  """Each mode's step before (another commit's JSON) and now, and the ratio: one line per mode in both."""
  before = {r["setup"]: r for r in before_records}
  for record in records:
    old = before.get(record["setup"])
    for mode, rep in record["per_device"].items():
      if old is None or mode == "bf16" or isinstance(rep, str) or isinstance(old["per_device"].get(mode, ""), str):
        continue
      a, b = mesh_step_ms(old, mode), mesh_step_ms(record, mode)
      print(f"{record['setup']} {mode}: {a:.1f} ms before, {b:.1f} ms now ({b / a:.3f}x the step time)")


def _remat_policy(config):
  """The preset's remat_policy (its own line or its base config's)."""
  path = REPO / config
  while True:
    text = path.read_text(encoding="utf-8")
    found = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("remat_policy:")]
    if found:
      return found[0]
    base = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("base_config:")]
    path = path.parent / base[0]


def base_ms_part(rep, part):
  return rep["estimate"]["ms_per_step"][part]


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if argv and argv[0] == "--child":
    return child(argv[1], argv[3:], argv[2])
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--setups", default="8b,405b", help="comma-separated: 8b, 405b")
  parser.add_argument("--modes", help="comma-separated mode names of the table to compile (bf16 always)")
  parser.add_argument("--layers", type=int, default=2, help="405B: layers compiled (the difference scaled to 126)")
  parser.add_argument("--json", help="write every report here")
  parser.add_argument("--from-json", help="print the tables of a JSON this wrote, compiling nothing")
  parser.add_argument("--versus", help="a JSON this wrote at another commit: each mode's step then and now")
  parser.add_argument("--on-mesh", action="store_true", help="each mode compiled on the mesh too, the whole model")
  args = parser.parse_args(argv)
  if args.from_json:
    records = json.loads(pathlib.Path(args.from_json).read_text(encoding="utf-8"))
    for r in records:
      name, layers = SETUPS[r["setup"]][0], SETUPS[r["setup"]][5]
      table(r["setup"], name, r["per_device"], r["mesh_bf16"], round(layers / r["scale"]), layers)
      if r.get("on_mesh"):
        mesh_table(name, r["on_mesh"])
    if args.versus:
      versus(records, json.loads(pathlib.Path(args.versus).read_text(encoding="utf-8")))
    return 0
  print(f"benchmarks/nvfp4_blackwell.py at commit {provenance.commit(mark_dirty=True)}: train_compile's roofline")
  records = []
  for key in args.setups.split(","):
    name, config, one_gpu, mesh, per_device, layers = SETUPS[key]
    compiled_layers = layers if key == "8b" else args.layers
    depth = ["override_model_config=true", f"base_num_decoder_layers={compiled_layers}"]
    depth = depth if compiled_layers != layers else []
    mesh_bf16 = compile_row(config, mesh, [*per_device, *MODES["bf16"]])
    if isinstance(mesh_bf16, str):
      print(f"{name}: bf16 on the mesh failed: {mesh_bf16}")
      continue
    reports, compiled = {}, {}
    keep = KEEP_QUANTIZED[_remat_policy(config)]
    modes = dict(MODES)
    for mode in VARIANTS if keep else ():
      modes[f"{mode}, remat {keep}"] = [*MODES[mode], f"remat_policy={keep}"]
    for mode, overrides in modes.items():
      if mode == "bf16" or args.modes is None or mode in args.modes.split(","):
        reports[mode] = compile_row(config, one_gpu, [*per_device, *depth, *overrides])
        compiled[mode] = overrides
        print(f"  compiled {mode}", file=sys.stderr, flush=True)
    if isinstance(reports["bf16"], str):
      print(f"{name}: bf16 on one GPU failed: {reports['bf16']}")
      continue
    records.append(table(key, name, reports, mesh_bf16, compiled_layers, layers))
    if args.on_mesh:  # the whole model on the whole mesh: bf16's is the table's own
      on_mesh = {"bf16": mesh_bf16}
      for mode, overrides in compiled.items():
        if mode != "bf16":
          on_mesh[mode] = compile_row(config, mesh, [*per_device, *overrides])
          print(f"  compiled {mode} on the mesh", file=sys.stderr, flush=True)
      records[-1]["on_mesh"] = on_mesh
      mesh_table(name, on_mesh)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(records) + "\n", encoding="utf-8")
  if args.versus:
    versus(records, json.loads(pathlib.Path(args.versus).read_text(encoding="utf-8")))
  return 0


if __name__ == "__main__":
  sys.exit(main())
