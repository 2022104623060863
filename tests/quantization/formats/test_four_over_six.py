"""Four Over Six: bit-exact with the NumPy reference (random and adversarial blocks, 1x16 / 16x16, RHT, SR, GPU-like
division), the kept candidate's error is the smaller one, and it cuts NVFP4's quantization error on Gaussian data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.quantization.formats import grids, four_over_six, nvfp4
from tests.quantization.formats import four_over_six_reference as ref
from tests.quantization.gpu_division import gpu_like_division

TILES = {"1x16": (1, 16), "16x16": (16, 16)}


def _f32(a):
  return np.asarray(jnp.asarray(a).astype(jnp.float32))


def _random(seed, shape):
  """bf16-representable lognormal magnitudes (blocks of every scale) with a few large outliers."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape) * np.exp(2 * rng.standard_normal(shape))
  x = np.where(rng.random(shape) < 0.01, x * 300, x)
  return np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))


def _tiles(blocks):
  """[16 * len(blocks), 32]: 16x16 tiles whose rows all repeat one 16-value block (next to a zero tile)."""
  return np.concatenate([np.pad(np.tile(b, (16, 1)), ((0, 0), (0, 16))) for b in blocks]).astype(np.float32)


# An amax-6 tensor (S_enc = 256, block scales exact): scaled values land where the blocks put them.
MIDPOINTS = np.float32([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, 0])
ADVERSARIAL = {
  "amax_6": _tiles(
    [
      MIDPOINTS,  # E2M1 midpoints of the map-to-6 candidate
      MIDPOINTS * np.float32(2 / 3),  # ... scaled for the map-to-4 candidate
      np.full(16, 3.0),  # all equal: both candidates exact (a tie)
      np.zeros(16),  # zeros (a tie)
      np.r_[6.0, np.full(15, 0.01)],  # one outlier
      np.linspace(-2e-4, 2e-4, 16),  # E4M3-subnormal block scale
      np.linspace(-1e-6, 1e-6, 16),  # block scale rounds to 0
    ]
  ),
  "extreme": _tiles(
    [
      np.r_[3e38, np.full(15, 1e37)],  # the error's RN(q * scale * amax) overflows
      np.r_[1.2e36, np.zeros(15)],  # ... only in TE's q * scale * amax for q = 4
      np.r_[1000.0, np.full(15, 1e-3)],
      np.full(16, -2.0),
    ]
  ),
  "inf": _tiles([np.r_[np.inf, np.full(15, 2.0)], np.full(16, 0.5)]),  # amax inf: S_enc = 1
}


def _assert_matches_reference(x, mode, tile, sr=False, rht=False, key=jax.random.key(0)):
  q = nvfp4.quantize(
    jnp.asarray(x), tile=tile, rht=rht, stochastic_rounding=sr, key=key if sr else None, four_over_six=mode
  )
  x_in = _f32(nvfp4.hadamard16(jnp.asarray(x, jnp.bfloat16))) if rht else x
  u = np.asarray(grids.uniform16(key, x.shape)) if sr else None
  values, scales, amax, use_4 = ref.quantize(x_in, mode, tile, u)
  np.testing.assert_array_equal(_f32(q.values), values)
  np.testing.assert_array_equal(_f32(q.scales), scales)
  assert float(q.global_scale) == float(amax) or (np.isnan(q.global_scale) and np.isnan(amax))
  assert float(q.e4m3_max) == 256.0
  return use_4


@pytest.mark.parametrize("mode", four_over_six.MODES)
@pytest.mark.parametrize("tile", TILES.values(), ids=TILES.keys())
def test_bit_exact_with_the_reference_on_random_operands(tile, mode):
  use_4 = _assert_matches_reference(_random(1, (40, 50)), mode, tile)  # ragged: padded rows and columns
  if tile == (1, 16):
    assert 0.1 < use_4.mean() < 0.6  # both candidates are really chosen
  _assert_matches_reference(_random(2, (48, 64)), mode, tile, sr=True)


@pytest.mark.parametrize("sr", [False, True])
def test_bit_exact_with_the_rht_against_the_transformed_input(sr):
  _assert_matches_reference(_random(3, (32, 64)), "mse", (1, 16), sr=sr, rht=True)


@pytest.mark.parametrize("mode", four_over_six.MODES)
@pytest.mark.parametrize("tile", TILES.values(), ids=TILES.keys())
def test_bit_exact_on_adversarial_blocks(tile, mode):
  for name, x in ADVERSARIAL.items():
    use_4 = _assert_matches_reference(x, mode, tile)
    if name == "amax_6":
      assert not use_4[32:64, 0].any()  # all equal and zeros: ties keep 6
      assert use_4[:, 0].any() and not use_4[:, 0].all()


def test_same_bits_with_gpu_like_division():
  x = jnp.asarray(_random(4, (32, 64)), jnp.bfloat16)
  run = jax.jit(
    lambda x, key: [
      nvfp4.quantize(x, tile=t, rht=r, stochastic_rounding=s, key=key, four_over_six=m)
      for t, r, s, m in (((1, 16), True, True, "mse"), ((16, 16), False, False, "mae"))
    ]
  )
  ieee = run(x, jax.random.key(5))
  with gpu_like_division():
    gpu = run(x, jax.random.key(5))
  for a, b in zip(jax.tree.leaves(ieee), jax.tree.leaves(gpu)):
    np.testing.assert_array_equal(_f32(a), _f32(b))


def _block_errors(values, scales, x, amax, mode, tile):
  """The selection's error per block (or tile), in the reference's f32 arithmetic."""
  m, n = x.shape
  q = values.reshape(m, -1, 16)
  errors = ref._errors(q, scales, x.reshape(m, -1, 16), np.float32(amax), mode)  # pylint: disable=protected-access
  return ref._tile_sums(errors) if tile == (16, 16) else errors  # pylint: disable=protected-access


@pytest.mark.parametrize("mode", four_over_six.MODES)
@pytest.mark.parametrize("tile", TILES.values(), ids=TILES.keys())
def test_the_kept_candidate_has_the_smaller_error(tile, mode):
  x = _random(6, (64, 128))
  q = nvfp4.quantize(jnp.asarray(x), tile=tile, four_over_six=mode)
  kept = _block_errors(_f32(q.values), _f32(q.scales), x, q.global_scale, mode, tile)
  with np.errstate(all="ignore"):  # each candidate alone: the reference with that candidate forced
    s_enc = np.minimum(np.float32(1536) / np.float32(q.global_scale), ref.FLT_MAX)
    block_amax = np.max(np.abs(x.reshape(64, -1, 16)), axis=-1)
    if tile == (16, 16):
      block_amax = np.repeat(np.max(block_amax.reshape(4, 16, -1), axis=1), 16, axis=0)
    base = (block_amax / np.float32(6)) * s_enc
    for scale in (ref._e4m3(base), ref._e4m3(base * np.float32(1.5))):  # pylint: disable=protected-access
      # pylint: disable-next=protected-access
      values = ref._candidate(x.reshape(64, -1, 16), scale, np.float32(1) / s_enc, None)
      other = _block_errors(values.reshape(64, -1), scale, x, q.global_scale, mode, tile)
      assert np.all(kept <= other)


@pytest.mark.parametrize("mode", four_over_six.MODES)
def test_cuts_the_quantization_mse_of_gaussian_data_by_at_least_ten_percent(mode):
  x = jax.random.normal(jax.random.key(0), (512, 512)).astype(jnp.bfloat16).astype(jnp.float32)
  mse = lambda q: float(jnp.mean((nvfp4.dequantize(q) - x) ** 2))
  plain, fos = mse(nvfp4.quantize(x)), mse(nvfp4.quantize(x, four_over_six=mode))
  assert fos <= 0.9 * plain, (plain, fos)  # measured: -16.6% (mse), -14.0% (mae) on [1024, 1024]


def test_global_scale_dequantize_and_gemm_use_the_256_bound():
  x = jnp.asarray(_random(7, (32, 64)))
  q = nvfp4.quantize(x, four_over_six="mse")
  assert float(nvfp4.decode_scale(q)) == float(grids.div_rn(1.0, grids.div_rn(1536.0, q.global_scale)))
  assert 0 < float(jnp.linalg.norm(nvfp4.dequantize(q) - x) / jnp.linalg.norm(x)) < 0.15
  w = jnp.asarray(_random(8, (48, 64)))
  for a, b in ((q, nvfp4.quantize(w)), (nvfp4.quantize(x), nvfp4.quantize(w, four_over_six="mae"))):
    y, want = nvfp4.gemm(a, b), nvfp4.dequantize(a) @ nvfp4.dequantize(b).T  # one operand on 448, one on 256
    assert float(jnp.linalg.norm(y - want) / jnp.linalg.norm(want)) < 1e-5


def test_bad_mode_is_a_clear_error():
  with pytest.raises(ValueError, match="four_over_six must be None or one of"):
    nvfp4.quantize(jnp.ones((2, 16)), four_over_six="l1")
