"""The quantizers' conversions as inline PTX inside the Triton kernels, each with its pure-JAX twin (ptx_convert.py).

`Isa` says what the kernel's target has: the FP4 conversions need sm_100a / sm_103a (`fp4`; Blackwell's stochastic
rounding form too), the E4M3 and bf16 conversions and rcp.rn every NVIDIA GPU the kernels run on (`asm`). Where a
feature is off (Hopper; CPU and Pallas' interpret mode, which cannot run inline PTX) each function computes its
twin, the instruction's definition in jnp, which Triton lowers to integer and f32 arithmetic. The inline PTX is
`elementwise_inline_asm` over tensors of one shape: one asm instance per element (pack=1), so Triton's register
layout never changes what an instance sees; the paired FP32 operations take two elements per instance (pack=2),
which is the same for any two: each lane is its own element's operation.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import triton as pl_triton

from MaxText.quantization import target
from MaxText.quantization.formats import grids
from MaxText.quantization.formats import ptx_convert as cvt
from MaxText.quantization.formats import sr_bits

_HIGH_HALF = np.uint32(0xFFFF0000)
_LOW_MAGNITUDE = np.uint32(0x7FFF)
FP4_SM = (100, 103)  # cvt.rn.satfinite.e2m1x2 (sm_100a+) and cvt.rs...e2m1x4 (sm_100a, sm_103a only)


@dataclasses.dataclass(frozen=True)
class Isa:
  """Which instructions the kernel may use: `asm` (inline PTX at all: an NVIDIA GPU, not interpret mode), `fp4`
  (Blackwell's FP4 conversions) and `f32x2`."""

  asm: bool
  fp4: bool
  f32x2: bool = False  # Blackwell's paired FP32 arithmetic (.f32x2: two lanes per instruction), mixed-precision adds


def isa_for(interpret):
  """The Isa of the GPU being built for (target.py: a named target's, else this machine's), none when interpreting."""
  if interpret:
    return Isa(False, False)
  named = target.named()
  sm = named.sm if named is not None else target.local_gpu_sm()
  return Isa(True, sm in FP4_SM, sm in FP4_SM)


def _asm(text, args, constraints, dtypes):
  shape = args[0].shape
  return pl_triton.elementwise_inline_asm(
    text,
    args=args,
    constraints=constraints,
    pack=1,
    result_shape_dtypes=[jax.ShapeDtypeStruct(shape, d) for d in dtypes],
  )


def _u32(x):
  return jax.lax.bitcast_convert_type(x, jnp.uint32)


_CVT_RN_8 = """{
.reg .b8 t<4>;
cvt.rn.satfinite.e2m1x2.f32 t0, $2, $1;
cvt.rn.satfinite.e2m1x2.f32 t1, $4, $3;
cvt.rn.satfinite.e2m1x2.f32 t2, $6, $5;
cvt.rn.satfinite.e2m1x2.f32 t3, $8, $7;
mov.b32 $0, {t0, t1, t2, t3};
}"""

_CVT_RS_8 = """{
.reg .b16 h<2>;
cvt.rs.satfinite.e2m1x4.f32 h0, {$4, $3, $2, $1}, $9;
cvt.rs.satfinite.e2m1x4.f32 h1, {$8, $7, $6, $5}, $10;
mov.b32 $0, {h0, h1};
}"""


def e2m1_word_rn(isa: Isa, values8):
  """Eight f32 tensors (positions 0..7) -> the uint32 word of their E2M1 codes, position i in bits 4i..4i+3."""
  if isa.fp4:
    (word,) = _asm(_CVT_RN_8, list(values8), "=r" + ",f" * 8, [jnp.int32])
    return _u32(word)
  return _pack([cvt.e2m1_rn(v) for v in values8])


def e2m1_word_rs(isa: Isa, values8, words2):
  """e2m1_word_rn with stochastic rounding: positions 0..3 take their draws from words2[0], 4..7 from words2[1]
  (sr_bits.draws_of_word's lanes 0..3)."""
  if isa.fp4:
    args = list(values8) + [jax.lax.bitcast_convert_type(w, jnp.int32) for w in words2]
    (word,) = _asm(_CVT_RS_8, args, "=r" + ",f" * 8 + ",r,r", [jnp.int32])
    return _u32(word)
  codes = [cvt.e2m1_rs(v, sr_bits.draws_of_word(words2[i // 4], np.uint32(i % 4))) for i, v in enumerate(values8)]
  return _pack(codes)


def _pack(codes):
  word = codes[0]
  for i, code in enumerate(codes[1:], 1):
    word = word | (code << np.uint32(4 * i))
  return word


_E4M3_CODE = """{
.reg .b16 c;
cvt.rn.satfinite.e4m3x2.f32 c, $1, $1;
cvt.u32.u16 $0, c;
and.b32 $0, $0, 255;
}"""

_E4M3_VALUE = """{
.reg .b16 c, lo, hi;
.reg .b32 h;
cvt.u16.u32 c, $1;
cvt.rn.f16x2.e4m3x2 h, c;
mov.b32 {lo, hi}, h;
cvt.f32.f16 $0, lo;
}"""


def e4m3_rn(isa: Isa, x):
  """(E4M3 code uint32, its f32 value) of f32 x >= 0 or NaN, rounded to nearest even and saturating at 448."""
  if isa.asm:
    (code,) = _asm(_E4M3_CODE, [x], "=r,f", [jnp.int32])
    (value,) = _asm(_E4M3_VALUE, [code], "=f,r", [jnp.float32])
    return _u32(code), value
  return cvt.e4m3_rn(x)


def rcp_rn(isa: Isa, x):
  """1 / x correctly rounded (rcp.rn.f32)."""
  if isa.asm:
    (r,) = _asm("rcp.rn.f32 $0, $1;", [x], "=f,f", [jnp.float32])
    return r
  return cvt.rcp_rn(x)


def bf16x2_rn(isa: Isa, a, b):
  """(a, b) rounded to bfloat16 (to nearest even) and packed, a in the low half: one cvt.rn.bf16x2.f32, uint32."""
  if not isa.asm:
    return (grids.f32_bits(cvt.bf16_rn(a)) >> np.uint32(16)) | (grids.f32_bits(cvt.bf16_rn(b)) & _HIGH_HALF)
  (pair,) = _asm("cvt.rn.bf16x2.f32 $0, $2, $1;", [a, b], "=r,f,f", [jnp.int32])
  return _u32(pair)


# bf16 -> f32 as Blackwell's mixed-precision add of -0 (exact; a floating-point instruction, where the shift or mask
# of the bits is an integer one): the low or high half of a packed pair.
_BF16_TO_F32 = """{{
.reg .b16 lo, hi;
mov.b32 {{lo, hi}}, $1;
add.rn.f32.bf16 $0, {half}, 0f80000000;
}}"""


def bf16x2_unpack(isa: Isa, pair):
  """The two bfloat16 of a packed pair (uint32, the low half first) as f32."""
  if not isa.f32x2:
    return grids.f32_from_bits(pair << np.uint32(16)), grids.f32_from_bits(pair & _HIGH_HALF)
  pair = jax.lax.bitcast_convert_type(pair, jnp.int32)
  return tuple(_asm(_BF16_TO_F32.format(half=half), [pair], "=f,r", [jnp.float32])[0] for half in ("lo", "hi"))


def bf16_rn_pair(isa: Isa, a, b):
  """(a, b) rounded to bfloat16 (to nearest even), as f32: one cvt.rn.bf16x2.f32 for the two."""
  return bf16x2_unpack(isa, bf16x2_rn(isa, a, b))


_ABS_MAX_BF16X2 = "max.NaN.xorsign.abs.bf16x2 $0, $1, $2;"
# The larger half of a packed magnitude maximum, as f32 bits: swap the halves, one more maximum, the high half's
# magnitude kept.
_HALVES_MAX_BF16X2 = """{
.reg .b32 t;
prmt.b32 t, $1, 0, 0x1032;
max.NaN.xorsign.abs.bf16x2 t, $1, t;
and.b32 $0, t, 0x7FFF0000;
}"""


def bf16x2_magnitude_max_bits(isa: Isa, pairs):
  """max |v| over every bfloat16 of the packed pairs (uint32 tensors) as f32 magnitude bits (uint32), NaN (some NaN)
  if any is NaN: a packed maximum of magnitudes per two pairs (max.NaN.xorsign.abs.bf16x2, whose result's sign bits
  are discarded), then one for the two halves."""
  if not isa.asm:
    halves = [jnp.maximum(p & _LOW_MAGNITUDE, (p >> np.uint32(16)) & _LOW_MAGNITUDE) for p in pairs]
    return functools.reduce(jnp.maximum, halves) << np.uint32(16)
  m = [jax.lax.bitcast_convert_type(p, jnp.int32) for p in pairs]
  while len(m) > 1:
    m = [_asm(_ABS_MAX_BF16X2, m[i : i + 2], "=r,r,r", [jnp.int32])[0] for i in range(0, len(m), 2)] + (
      m[-1:] if len(m) % 2 else []
    )
  (bits,) = _asm(_HALVES_MAX_BF16X2, m, "=r,r", [jnp.int32])
  return _u32(bits)


def xor3(isa: Isa, a, b, c):
  """a ^ b ^ c of uint32 tensors: one lop3.b32 (the three-input logic instruction) where inline PTX is available."""
  if not isa.asm:
    return a ^ b ^ c
  shape = jnp.broadcast_shapes(a.shape, b.shape, c.shape)
  args = [jnp.broadcast_to(jax.lax.bitcast_convert_type(v, jnp.int32), shape) for v in (a, b, c)]
  (out,) = _asm("lop3.b32 $0, $1, $2, $3, 0x96;", args, "=r,r,r,r", [jnp.int32])
  return _u32(out)


_PAIRED = """{{
.reg .b64 a, b, d;
mov.b64 a, {{$2, $3}};
mov.b64 b, {{$4, $5}};
{op}.rn.f32x2 d, a, b;
mov.b64 {{$0, $1}}, d;
}}"""


def paired(isa: Isa, op, a, b):
  """a + b, a - b or a * b (op "add", "sub", "mul") of f32 tensors of one shape, rounded to nearest (subnormals
  kept): two elements per .f32x2 instruction where the target has them (pack=2: an instance takes the same two
  elements of a and b, whichever they are: each lane is its own element's operation)."""
  if not isa.f32x2:
    return {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply}[op](a, b)
  (out,) = pl_triton.elementwise_inline_asm(
    _PAIRED.format(op=op),
    args=[a, b],
    constraints="=f,=f,f,f,f,f",
    pack=2,
    result_shape_dtypes=[jax.ShapeDtypeStruct(a.shape, jnp.float32)],
  )
  return out


def butterfly_x2(isa: Isa, a, b):
  """(a + b, a - b) of f32 tensors, `paired` where the target has it."""
  return paired(isa, "add", a, b), paired(isa, "sub", a, b)
