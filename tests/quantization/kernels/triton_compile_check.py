"""Compile every quantization kernel's Triton IR to a GPU binary without a GPU (a check beyond jax.export's lowering).

    python -m tests.quantization.kernels.triton_compile_check --triton-python /path/to/venv-with-triton/bin/python \
        [--arch 90,100] [--out DIR]

Lowering (what the export tests check) builds the Triton IR; Triton's own pipeline can still reject it
later (a `math.ctlz` from lax.clz did, before grids._leading_zeros). This dumps each kernel's TTIR as
the Dense fwd+bwd of every recipe lowers it for CUDA, then compiles it to PTX and a cubin with the
`triton` package (pip install triton; a separate interpreter, so its MLIR never meets jaxlib's) for
the given compute capabilities, and reports ptxas' register and spill counts where it can. That
package's Triton is not XLA's build of it, so this is strong evidence, not proof.
"""

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile

_COMPILE = r"""
import glob, json, os, sys
import triton
from triton.backends.compiler import GPUTarget
out = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.ttir"))):
  name = os.path.basename(path)[:-5]
  for arch in map(int, sys.argv[2].split(",")):
    try:
      kernel = triton.compile(path, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4, "num_stages": 1})
      ptx_path = os.path.join(sys.argv[1], f"{name}.sm{arch}.ptx")
      open(ptx_path, "w").write(kernel.asm["ptx"])
      out[f"{name} sm{arch}"] = {"ok": True, "cubin_bytes": len(kernel.asm["cubin"]), "ptx": ptx_path}
    except Exception as e:  # report every kernel, not the first failure
      out[f"{name} sm{arch}"] = {"ok": False, "error": str(e).splitlines()[-1][:300]}
print(json.dumps(out))
"""


def dump_ttir(out_dir, shapes=(256, 512, 384)):
  """Write <kernel name>.ttir for every kernel the Dense fwd+bwd of every quantized recipe runs; returns names."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax._src.pallas.triton import pallas_call_registration as registration  # pylint: disable=import-outside-toplevel
  from MaxText.quantization import backends, get_recipe, qmatmul  # pylint: disable=import-outside-toplevel
  from MaxText.quantization.kernels import quantizer_impl  # pylint: disable=import-outside-toplevel
  from MaxText.quantization.kernels.quantizer_impl import Kernels  # pylint: disable=import-outside-toplevel

  lower = registration.lowering.lower_jaxpr_to_triton_module
  seen = {}

  def capture(*args, **kwargs):
    result = lower(*args, **kwargs)
    text = result.module.operation.get_asm(enable_debug_info=False)
    seen.setdefault(re.search(r"tt\.func (?:public )?@(\w+)", text).group(1), text)
    return result

  m, k, n = shapes
  real_reason = quantizer_impl.unavailable_reason
  registration.lowering.lower_jaxpr_to_triton_module = capture
  quantizer_impl.unavailable_reason = lambda platform=None: None
  try:
    for name in ("te_nvfp4", "te_nvfp4_no_rht", "te_fp8_currentscaling", "te_mxfp8", "mxfp4"):
      recipe = get_recipe(name)

      def fwd_bwd(x, w, dy, key, recipe=recipe):
        matmul = lambda x, w: qmatmul(x, w, recipe, key=key, kernels=Kernels.PALLAS, backend=backends.Choice.EMULATE)
        y, vjp = jax.vjp(matmul, x, w)
        return (y, *vjp(dy))

      jax.export.export(
        jax.jit(fwd_bwd),
        platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
      )(
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
        jax.ShapeDtypeStruct((k, n), jnp.float32),
        jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
        jax.random.key(0),
      )
  finally:
    registration.lowering.lower_jaxpr_to_triton_module = lower
    quantizer_impl.unavailable_reason = real_reason
  for name, text in seen.items():
    (pathlib.Path(out_dir) / f"{name}.ttir").write_text(text)
  return sorted(seen)


def _ptxas_usage(triton_python, ptx_path, arch):
  """'N registers, M bytes spilled' from the ptxas that ships with triton, or '' if it can't say."""
  find = subprocess.run(
    [triton_python, "-c", "import triton, os; print(os.path.dirname(triton.__file__))"],
    capture_output=True,
    text=True,
    check=False,
  )
  bin_dir = pathlib.Path(find.stdout.strip()) / "backends" / "nvidia" / "bin"
  for ptxas in (bin_dir / "ptxas-blackwell", bin_dir / "ptxas"):
    if not ptxas.exists():
      continue
    run = subprocess.run(
      [str(ptxas), f"-arch=sm_{arch}a", "-v", ptx_path, "-o", "/dev/null"], capture_output=True, text=True, check=False
    )
    regs = re.search(r"Used (\d+) registers", run.stderr)
    spills = re.search(r"(\d+) bytes spill stores", run.stderr)
    if regs:
      return f"{regs.group(1)} registers, {spills.group(1) if spills else '?'} bytes spilled"
  return ""


def compile_all(triton_python, out_dir, archs):
  """{'<kernel> sm<arch>': {ok, cubin_bytes | error, usage}} for every dumped kernel."""
  run = subprocess.run(
    [triton_python, "-c", _COMPILE, str(out_dir), ",".join(map(str, archs))],
    capture_output=True,
    text=True,
    check=False,
  )
  if run.returncode:
    raise RuntimeError(f"{triton_python} could not run triton: {run.stderr.strip().splitlines()[-1:]}")
  results = json.loads(run.stdout.strip().splitlines()[-1])
  for key, result in results.items():
    if result["ok"]:
      result["usage"] = _ptxas_usage(triton_python, result.pop("ptx"), int(key.rsplit("sm", 1)[1]))
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--triton-python", required=True, help="a Python interpreter that can `import triton`")
  parser.add_argument("--arch", default="90,100", help="compute capabilities, e.g. 90 (H100), 100 (B200)")
  parser.add_argument("--out", help="keep the TTIR and PTX here (default: a temporary directory)")
  args = parser.parse_args()
  out_dir = pathlib.Path(args.out or tempfile.mkdtemp(prefix="quantize_ttir_"))
  out_dir.mkdir(parents=True, exist_ok=True)
  dump_ttir(out_dir)
  results = compile_all(args.triton_python, out_dir, [int(a) for a in args.arch.split(",")])
  for key, result in sorted(results.items()):
    detail = f"{result['cubin_bytes']} byte cubin, {result['usage']}" if result["ok"] else result["error"]
    print(f"{key:<32} {'ok' if result['ok'] else 'FAILED'}  {detail}")
  sys.exit(0 if all(r["ok"] for r in results.values()) else 1)


if __name__ == "__main__":
  main()
