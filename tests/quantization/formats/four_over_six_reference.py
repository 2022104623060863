"""A NumPy reference of NVFP4 with Four Over Six (Cook et al., arXiv 2512.02010), written from the paper's algorithm
with Transformer Engine 2.20's definitions of the global scale and the error (test helper).

Plain float32 NumPy, one IEEE operation at a time (no library quantizer): per block, the scale that maps the
block's max to 6 and the one that maps it to 4 (1.5x larger), each rounded to E4M3; both quantizations; the
dequantized candidates RN(RN(RN(q * scale) * amax) / (6 * 256)) compared with x, element by element in order;
the candidate with the strictly smaller error kept. E2M1 rounding is the paper's: half-steps below 2, whole
steps below 4, steps of 2 up to 6, nearest-even; stochastic rounding goes up where u < the fraction of the step.
"""

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
E2M1_MAX, E4M3_MAX, GLOBAL_E4M3_MAX = F32(6), F32(448), F32(256)


def _e4m3(v):
  """Clamp to [-448, 448], then round to nearest-even on E4M3 (ml_dtypes' cast: correctly rounded)."""
  return np.clip(v, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).astype(F32)


def _step(a):
  """E2M1's spacing at |scaled| = a in [0, 6]: 0.5 below 2, 1 below 4, 2 above."""
  return np.where(a < 2, F32(0.5), np.where(a < 4, F32(1), F32(2)))


def _round_e2m1(scaled, u=None):
  a, sign = np.abs(scaled), np.sign(scaled)
  step = _step(a)
  if u is None:
    q = np.round(a / step) * step  # exact: the step is a power of two; np.round is half-to-even
  else:
    lower = np.floor(a / step) * step
    q = lower + np.where(u < (a - lower) / step, step, F32(0))
  return (sign * np.minimum(q, E2M1_MAX)).astype(F32)


def _candidate(x, block_scale, s_dec, u):
  encode = np.minimum(F32(1) / (block_scale * s_dec), FLT_MAX)
  return _round_e2m1(np.clip(x * encode[..., None], -E2M1_MAX, E2M1_MAX), u)


def _errors(q, block_scale, x, amax, mode):
  total = np.zeros(q.shape[:-1], F32)
  for i in range(q.shape[-1]):
    value = ((q[..., i] * block_scale) * amax) / (E2M1_MAX * GLOBAL_E4M3_MAX)
    diff = value - x[..., i]
    total = total + (diff * diff if mode == "mse" else np.abs(diff))
  return total


def _tile_sums(errors):
  rows = errors.reshape(-1, 16, errors.shape[1])
  for half in (8, 4, 2, 1):
    rows = rows[:, :half] + rows[:, half : 2 * half]
  return np.repeat(rows[:, 0], 16, axis=0)


def quantize(x, mode, tile=(1, 16), u=None):
  """(E2M1 values [M, N], E4M3 block scales [M, ceil(N/16)], amax, which blocks kept map-to-4) of f32 x."""
  x = np.asarray(x, F32)
  m, n = x.shape
  pad = ((0, (-m) % tile[0]), (0, (-n) % 16))
  xp = np.pad(x, pad)
  up = None if u is None else np.pad(np.asarray(u, F32), pad).reshape(xp.shape[0], -1, 16)
  blocks = xp.reshape(xp.shape[0], -1, 16)
  with np.errstate(all="ignore"):
    amax = F32(np.max(np.abs(x))) if x.size else F32(0)
    s_enc = np.minimum(E2M1_MAX * GLOBAL_E4M3_MAX / amax, FLT_MAX)
    s_enc = F32(1) if s_enc == 0 else s_enc
    s_dec = F32(1) / s_enc
    block_amax = np.max(np.abs(blocks), axis=-1)
    if tile == (16, 16):
      tiles = np.max(block_amax.reshape(-1, 16, block_amax.shape[1]), axis=1)
      block_amax = np.repeat(tiles, 16, axis=0)
    base = (block_amax / E2M1_MAX) * s_enc
    scale_6, scale_4 = _e4m3(base), _e4m3(base * F32(1.5))
    q6, q4 = _candidate(blocks, scale_6, s_dec, up), _candidate(blocks, scale_4, s_dec, up)
    err6, err4 = _errors(q6, scale_6, blocks, amax, mode), _errors(q4, scale_4, blocks, amax, mode)
  if tile == (16, 16):
    err6, err4 = _tile_sums(err6), _tile_sums(err4)
  use_4 = err4 < err6
  values = np.where(use_4[..., None], q4, q6).reshape(xp.shape)[:m, :n]
  return values, np.where(use_4, scale_4, scale_6)[:m], amax, use_4[:m]
