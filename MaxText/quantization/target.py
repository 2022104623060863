"""Which device the quantized GEMMs are being built for: this machine's (the default), or a GPU that is not here, named
while compiling ahead of time (`compiling_for`). The backend and kernel choices (`auto`) read it, so a step compiled
for a B200 on a CPU machine takes the B200's paths: the Pallas kernels on one NVIDIA GPU, the xla backend's native
block-scaled dot on SM100+, Transformer Engine where it supports the target."""

import contextlib
import dataclasses
import typing

import jax


@dataclasses.dataclass(frozen=True)
class Target:
  """A device to build for: jax's platform name ('gpu' for an NVIDIA GPU here, 'cuda' for one compiled for), its
  compute capability (major*10+minor; None off NVIDIA GPUs) and how many devices the program spans."""

  platform: str
  sm: typing.Optional[int]
  device_count: int


_named: list = []  # the innermost compiling_for target last


def named():
  """The Target named by the innermost `compiling_for`, or None (building for this machine)."""
  return _named[-1] if _named else None


@contextlib.contextmanager
def compiling_for(sm, device_count, platform="cuda"):
  """Inside: backend and kernel choices are made for an NVIDIA GPU of compute capability `sm` in a program over
  `device_count` devices, whatever this machine has."""
  _named.append(Target(platform, sm, device_count))
  try:
    yield _named[-1]
  finally:
    _named.pop()


def platform():
  """'cuda' (a named target), else jax's default backend ('gpu', 'cpu', ...)."""
  target = named()
  return target.platform if target else jax.default_backend()


def device_count():
  target = named()
  return target.device_count if target else jax.device_count()


def local_gpu_sm():
  """Major*10+minor of this machine's first GPU, or None without one."""
  try:
    gpus = jax.devices("gpu")
  except RuntimeError:
    return None
  cap = getattr(gpus[0], "compute_capability", None) if gpus else None
  if not cap:
    return None
  major, minor = str(cap).split(".")
  return int(major) * 10 + int(minor)


def nvidia_gpu():
  """Whether the devices built for are NVIDIA GPUs (a named target always is)."""
  if named() is not None:
    return True
  try:
    device = jax.devices("gpu")[0]
  except RuntimeError:
    return False
  version = getattr(device.client, "platform_version", "") or ""
  return "cuda" in version.lower() or device.device_kind.upper().startswith("NVIDIA")
