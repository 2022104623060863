"""The Llama decoder: shapes, and a forward pass against an independent NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from MaxText import config, precision
from MaxText.model import attention
from MaxText.model.decoder import Transformer
from MaxText.quantization import stats as quant_stats
from tests.conftest import REPO

TINY = [
  "base_emb_dim=32",
  "base_num_query_heads=4",
  "base_num_kv_heads=2",
  "head_dim=8",
  "base_mlp_dim=48",
  "base_num_decoder_layers=2",
  "vocab_size=64",
  "max_target_length=12",
  "dtype=float32",
]


def _cfg(*extra):
  return config.load(REPO / "configs" / "base.yml", TINY + list(extra))


def _np_reference(params, tokens, cfg):
  """Llama 3 forward written from the paper's equations in NumPy (float64)."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), nnx.to_pure_dict(params))
  h, kv, dh = cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.head_dim
  b, t = tokens.shape
  rms = lambda x, s: x / np.sqrt((x**2).mean(-1, keepdims=True) + cfg.normalization_layer_epsilon) * s
  silu = lambda x: x / (1 + np.exp(-x))
  inv = 1.0 / cfg.rope_max_timescale ** (np.arange(0, dh, 2) / dh)
  ang = np.arange(t)[:, None] * inv[None]
  cos, sin = np.cos(ang), np.sin(ang)

  def rope(x):  # x [b, t, heads, dh]
    x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
    c, s = cos[None, :, None], sin[None, :, None]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)

  x = p["embed"]["embedding"][tokens]
  for i in range(cfg.base_num_decoder_layers):
    lp = jax.tree.map(lambda a: a[i], p["layers"])
    a = lp["attention"]
    y = rms(x, lp["pre_attention_norm"]["scale"])
    q = rope((y @ a["query"]["kernel"]).reshape(b, t, h, dh))
    k = rope((y @ a["key"]["kernel"]).reshape(b, t, kv, dh))
    v = (y @ a["value"]["kernel"]).reshape(b, t, kv, dh)
    k, v = np.repeat(k, h // kv, axis=2), np.repeat(v, h // kv, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    ctx = np.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, t, h * dh)
    x = x + ctx @ a["out"]["kernel"]
    m = lp["mlp"]
    y = rms(x, lp["pre_mlp_norm"]["scale"])
    x = x + (silu(y @ m["gate"]["kernel"]) * (y @ m["up"]["kernel"])) @ m["down"]["kernel"]
  head = p["embed"]["embedding"].T if cfg.logits_via_embedding else p["lm_head"]
  return rms(x, p["final_norm"]["scale"]) @ head


@pytest.mark.parametrize("scan, tied", [(True, False), (False, False), (True, True)])
def test_forward_matches_numpy_reference(scan, tied):
  cfg = _cfg(f"scan_layers={scan}", "remat_policy=none", f"logits_via_embedding={tied}")
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.max_target_length))
  with jax.default_matmul_precision("highest"):  # f32 means f32 (a GPU's default for f32 dots is TF32)
    logits = model(jnp.asarray(tokens))
  assert logits.shape == (2, cfg.max_target_length, cfg.vocab_size) and logits.dtype == jnp.float32
  want = _np_reference(nnx.state(model, nnx.Param), tokens, cfg)
  np.testing.assert_allclose(np.asarray(logits), want, rtol=2e-4, atol=2e-4)
  if tied:  # no lm_head; the embedding, also the head, starts at the head's scale: logits of order 1
    assert "lm_head" not in nnx.state(model, nnx.Param) and float(jnp.std(logits)) < 3.0


def test_parameter_shapes_and_dtypes():
  cfg = _cfg("dtype=bfloat16")
  params = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  d = nnx.to_pure_dict(params)
  assert d["layers"]["attention"]["query"]["kernel"].shape == (2, 32, 32)
  assert d["layers"]["attention"]["key"]["kernel"].shape == (2, 32, 16)
  assert d["layers"]["mlp"]["down"]["kernel"].shape == (2, 48, 32)
  assert d["lm_head"].shape == (32, 64) and d["embed"]["embedding"].shape == (64, 32)
  assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(d))


def test_segments_do_not_attend_across_documents():
  q = jax.random.normal(jax.random.key(0), (1, 6, 2, 8))
  k, v = q + 1.0, jax.random.normal(jax.random.key(1), (1, 6, 2, 8))
  seg = jnp.array([[1, 1, 1, 2, 2, 2]])
  out = attention.dot_product_attention(q, k, v, seg)
  alone = attention.dot_product_attention(q[:, 3:], k[:, 3:], v[:, 3:], seg[:, 3:])
  np.testing.assert_allclose(out[:, 3:], alone, rtol=1e-5, atol=1e-6)


def test_llama31_rope_scaling_keeps_high_and_scales_low_frequencies():
  base = attention.rope_frequencies(128, 500000.0)
  scaled = attention.rope_frequencies(128, 500000.0, "llama3.1")
  assert scaled[0] == base[0]  # short wavelengths untouched
  np.testing.assert_allclose(scaled[-1], base[-1] / 8.0, rtol=1e-6)  # long wavelengths / factor


def test_fused_mlp_is_the_unfused_model_with_gate_and_up_in_one_kernel():
  """fused_mlp (MaxText's [emb, 2, mlp] kernel, one GEMM): the same logits as the unfused model holding the same
  gate and up columns."""
  unfused = Transformer(_cfg("remat_policy=none"), rngs=nnx.Rngs(0))
  fused = Transformer(_cfg("remat_policy=none", "fused_mlp=true"), rngs=nnx.Rngs(1))
  params = nnx.to_pure_dict(nnx.state(unfused, nnx.Param))
  mlp = params["layers"]["mlp"]
  mlp["gate_up"] = {"kernel": jnp.stack([mlp.pop("gate")["kernel"], mlp.pop("up")["kernel"]], axis=-2)}
  state = nnx.state(fused, nnx.Param)
  assert state["layers"]["mlp"]["gate_up"]["kernel"].shape == (2, 32, 2, 48) and "gate" not in state["layers"]["mlp"]
  nnx.replace_by_pure_dict(state, params)
  nnx.update(fused, state)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)))
  logits = jax.jit(lambda graphdef, state: nnx.merge(graphdef, state)(tokens), static_argnums=0)
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(logits(*nnx.split(fused)), logits(*nnx.split(unfused)), rtol=1e-5, atol=1e-5)


def test_fused_mlp_reports_its_one_gemms_telemetry_as_gate_and_up():
  cfg = _cfg("remat_policy=none", "fused_mlp=true", "quantization=te_fp8_currentscaling", "base_num_decoder_layers=1")
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  plan = precision.plan_from_config(cfg).layer_ranges
  sinks = {g: jnp.zeros((1, len(quant_stats.ROLES), len(quant_stats.STATS))) for g in precision.GEMMS}
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)))
  graphdef, state = nnx.split(model)
  loss = lambda s: jnp.sum(nnx.merge(graphdef, state)(tokens, layer_precisions=plan, stats_sinks=s))
  stats = jax.jit(jax.grad(loss))(sinks)
  assert np.array_equal(stats["gate"], stats["up"]) and float(stats["gate"][:, 0, 0].min()) > 0  # x's rel_err
  mlp_rows = [g for g, *_ in precision.rows(precision.plan_from_config(cfg), cfg) if g.startswith(("gate", "up"))]
  assert mlp_rows == ["gate+up (fused_mlp)"]
