"""Which implementation runs the operand quantizers: Pallas Triton kernels on NVIDIA GPUs, or the portable XLA path.

Both give the same bits (pallas_quantize.py); the kernels exist for speed, since XLA splits a
quantizer into several fusions that each read the operand again.
  auto       the kernels on a single NVIDIA GPU, the XLA path elsewhere: the kernels are not partitioned yet,
             so under a multi-device mesh XLA would gather each sharded operand to run them whole
  pallas     the kernels (an error where they can't run; lowering for CUDA with jax.export works anywhere
             once this resolves, which tests arrange by patching `unavailable_reason`)
  xla        the XLA path everywhere: the fallback a user can force
  interpret  the kernels in Pallas interpret mode on any backend (slow: for testing the kernels on CPU)
"""

import jax

from MaxText.quantization.errors import BackendError

CHOICES = ("auto", "pallas", "xla")  # what a user configures
LIBRARY_CHOICES = CHOICES + ("interpret",)


def _nvidia_gpu():
  try:
    device = jax.devices("gpu")[0]
  except RuntimeError:
    return False
  version = getattr(device.client, "platform_version", "") or ""
  return "cuda" in version.lower() or device.device_kind.upper().startswith("NVIDIA")


def unavailable_reason(platform=None):
  """None where the Triton kernels can run, else why not (one line)."""
  platform = platform or jax.default_backend()
  if platform not in ("gpu", "cuda"):
    return f"the Pallas Triton quantization kernels run on NVIDIA GPUs only, not on {platform}"
  if platform == "gpu" and not _nvidia_gpu():
    return "the Pallas Triton quantization kernels run on NVIDIA GPUs only, not on this GPU"
  return None


def resolve(requested: str = "auto") -> str:
  """'pallas', 'interpret' or 'xla' for a request from LIBRARY_CHOICES; BackendError where pallas can't run."""
  if requested not in LIBRARY_CHOICES:
    raise BackendError(f"quantization_kernels must be one of {CHOICES}, got {requested!r}")
  if requested in ("xla", "interpret"):
    return requested
  reason = unavailable_reason()
  if requested == "pallas" and reason is not None:
    raise BackendError(f"quantization_kernels=pallas: {reason}; use quantization_kernels=auto or xla")
  if requested == "pallas" or (reason is None and jax.device_count() == 1):
    return "pallas"
  return "xla"
