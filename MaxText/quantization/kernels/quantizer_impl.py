"""Which implementation runs the operand quantizers: Pallas Triton kernels on NVIDIA GPUs, or the portable XLA path.

Both give the same bits (pallas_quantize.py); the kernels exist for speed, since XLA splits a
quantizer into several fusions that each read the operand again. A `Kernels` member says which:
  auto       the kernels on a single NVIDIA GPU, the XLA path elsewhere: the kernels are not partitioned yet,
             so under a multi-device mesh XLA would gather each sharded operand to run them whole
  pallas     the kernels (an error where they can't run; lowering for CUDA with jax.export works anywhere
             once this resolves, which tests arrange by patching `unavailable_reason`)
  xla        the XLA path everywhere: the fallback a user can force
  interpret  the kernels in Pallas interpret mode on any backend (slow: for testing the kernels on CPU)
"""

import enum

from MaxText.quantization import target
from MaxText.quantization.errors import BackendError


class Kernels(enum.Enum):
  """Who quantizes the emulated backend's operands (the values are quantization_kernels' spellings)."""

  AUTO = "auto"
  PALLAS = "pallas"
  XLA = "xla"
  INTERPRET = "interpret"


CHOICES = ("auto", "pallas", "xla")  # what a user configures (quantization_kernels); INTERPRET is for tests


def unavailable_reason(platform=None):
  """None where the Triton kernels can run, else why not (one line)."""
  platform = platform or target.platform()
  if platform not in ("gpu", "cuda"):
    return f"the Pallas Triton quantization kernels run on NVIDIA GPUs only, not on {platform}"
  if platform == "gpu" and not target.nvidia_gpu():
    return "the Pallas Triton quantization kernels run on NVIDIA GPUs only, not on this GPU"
  return None


def resolve(requested: Kernels = Kernels.AUTO) -> Kernels:
  """PALLAS, INTERPRET or XLA for a request; BackendError where the Pallas kernels can't run."""
  if not isinstance(requested, Kernels):
    raise BackendError(f"quantization_kernels must be one of {CHOICES}, got {requested!r}")
  if requested in (Kernels.XLA, Kernels.INTERPRET):
    return requested
  reason = unavailable_reason()
  if requested is Kernels.PALLAS and reason is not None:
    raise BackendError(f"quantization_kernels=pallas: {reason}; use quantization_kernels=auto or xla")
  if requested is Kernels.PALLAS or (reason is None and target.device_count() == 1):
    return Kernels.PALLAS
  return Kernels.XLA
