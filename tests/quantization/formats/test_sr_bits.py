"""sr_bits: the stochastic-rounding draws are uniform, laid out as cvt.rs.satfinite.e2m1x4.f32 reads its word, a
function of (key, row, column) only, and unrelated across keys (tensors, steps), rows and groups; rounding with them
is unbiased."""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization.formats import grids, sr_bits


def test_draws_are_the_words_bytes_in_the_rbits_layout():
  key = jax.random.key(4)
  rows, cols = jnp.arange(3, dtype=jnp.uint32), jnp.arange(8, dtype=jnp.uint32)
  d = np.asarray(sr_bits.draws(key, rows, cols)).astype(np.uint32)
  k0, k1 = sr_bits.key_words(key)
  w = np.asarray(sr_bits.word(k0, k1, rows[:, None], (cols[None, ::4] >> 2))).astype(np.uint32)
  b = [(w >> s) & 0xFF for s in (0, 8, 16, 24)]
  rev = lambda v: int("{:016b}".format(int(v))[::-1], 2)
  np.testing.assert_array_equal(d[:, ::4], (b[2] << 8) | b[0])  # lane 0 (f): low bytes of the halves
  np.testing.assert_array_equal(d[:, 2::4], (b[3] << 8) | b[1])  # lane 2 (b): high bytes
  np.testing.assert_array_equal(d[:, 1::4], np.vectorize(rev)(d[:, ::4]))  # lane 1 (e): lane 0's bit-reversed
  np.testing.assert_array_equal(d[:, 3::4], np.vectorize(rev)(d[:, 2::4]))


def test_draws_are_uniform_bits():
  d = np.asarray(grids.draws16(jax.random.key(0), (512, 1024))).astype(np.uint32)
  bits = (d[..., None] >> np.arange(16)) & 1
  assert np.all(np.abs(bits.mean(axis=(0, 1)) - 0.5) < 0.005)  # 524288 draws: 0.005 is ~7 sigma
  counts = np.bincount(d.ravel() >> 8, minlength=256)  # top byte: chi-square with 255 dof
  chi2 = ((counts - d.size / 256) ** 2 / (d.size / 256)).sum()
  assert chi2 < 400


def test_streams_of_keys_rows_and_steps_are_unrelated():
  base = jax.random.key(7)
  # steps (fold_in of the step) and tensors (split); jax's split(k)[i] is fold_in(k, i), so split another key
  keys = [jax.random.fold_in(base, step) for step in range(3)] + list(jax.random.split(jax.random.key(8), 2))
  streams = [np.asarray(grids.draws16(k, (32, 4096))).astype(np.float64) for k in keys]
  for i in range(len(streams)):
    for j in range(i + 1, len(streams)):
      a, b = streams[i].ravel(), streams[j].ravel()
      assert abs(np.corrcoef(a, b)[0, 1]) < 0.01
      assert np.mean(a == b) < 6 * 2**-16  # no shared stream (chance: 2**-16; a shared stream: 1)
      for shift in (1, 4, 4096):  # nor one key's stream a shifted copy of another's
        assert np.mean(a[shift:] == b[:-shift]) < 6 * 2**-16
  one = streams[0]
  assert abs(np.corrcoef(one[:-1].ravel(), one[1:].ravel())[0, 1]) < 0.01  # neighbouring rows
  assert abs(np.corrcoef(one[:, :-4].ravel(), one[:, 4:].ravel())[0, 1]) < 0.01  # neighbouring groups


def test_stochastic_rounding_with_them_is_unbiased():
  x = np.float32([0.1, 0.3, 0.7, 1.1, 1.3, 2.2, 2.6, 3.9, 4.5, 5.7])
  xs = jnp.asarray(np.broadcast_to(x[:, None], (x.size, 40_000)))
  q = grids.stochastic_round_to_grid(xs, grids.E2M1, jax.random.key(11))
  spacing = np.where(x < 2, 0.5, np.where(x < 4, 1.0, 2.0))
  bias = np.asarray(q.mean(axis=1)) - x
  assert np.all(np.abs(bias) < 4 * spacing / np.sqrt(4 * 40_000))  # within 4 sigma of the mean's spread


def test_words_from_a_rows_mix_are_the_words():
  k0, k1 = np.uint32(0x12345678), np.uint32(0x9ABCDEF0)
  rows = jnp.asarray([0, 1, 7, 4095, 2**31 + 5, 2**32 - 1], jnp.uint32)[:, None]
  groups = jnp.asarray([0, 1, 2, 3, 1000, 2**30 + 3, 2**32 - 1], jnp.uint32)[None, :]
  mixes = sr_bits.row_mix(sr_bits.row_key(k0, k1, rows))
  np.testing.assert_array_equal(sr_bits.word_of_row_mix(mixes, groups), sr_bits.word(k0, k1, rows, groups))
