"""The one mapping between our parameter tree and Hugging Face Llama tensor names, with the layout change of each.

Our Dense kernels are flax's [in, out]; HF's Linear weights are torch's [out, in]: every projection and the lm head
is transposed. Our decoder layers are stacked (one array per kind, leading layer axis, scanned or not); HF has one
tensor per layer. HF's checkpoints of Llama hold q_proj/k_proj with the rows of each head already permuted for the
rotate-half RoPE (transformers' convert_llama_weights_to_hf permutes Meta's interleaved layout); our apply_rope is
rotate-half as well, so q and k rows map one to one: no permutation here. A fused_mlp model holds gate and up as one
kernel [emb, 2, mlp] (MaxText's layout): HF's gate_proj is its part 0 ([:, 0, :] transposed), up_proj its part 1;
export splits it, import joins the two. Import, export and the direct loader all go through `entries` and the
layout functions below.
"""

import dataclasses
import typing

LAYER = "{layer}"


@dataclasses.dataclass(frozen=True)
class Entry:
  """One HF tensor and where it lives in our parameters: our path ("layers/mlp/gate/kernel"), its HF name (with
  {layer} in per-layer ones), whether the 2-D tensor is transposed between the two, and `part`: None, or the index on
  the second-to-last axis of a fused parameter that holds this tensor (gate_up's 0 = gate_proj, 1 = up_proj)."""

  param: str
  hf: str
  transpose: bool
  part: typing.Optional[int] = None

  @property
  def per_layer(self):
    return LAYER in self.hf

  def hf_name(self, layer=None):
    return self.hf.format(layer=layer) if self.per_layer else self.hf


_ENTRIES = (
  Entry("embed/embedding", "model.embed_tokens.weight", False),
  Entry("layers/pre_attention_norm/scale", "model.layers.{layer}.input_layernorm.weight", False),
  Entry("layers/attention/query/kernel", "model.layers.{layer}.self_attn.q_proj.weight", True),
  Entry("layers/attention/key/kernel", "model.layers.{layer}.self_attn.k_proj.weight", True),
  Entry("layers/attention/value/kernel", "model.layers.{layer}.self_attn.v_proj.weight", True),
  Entry("layers/attention/out/kernel", "model.layers.{layer}.self_attn.o_proj.weight", True),
  Entry("layers/pre_mlp_norm/scale", "model.layers.{layer}.post_attention_layernorm.weight", False),
  Entry("layers/mlp/gate/kernel", "model.layers.{layer}.mlp.gate_proj.weight", True),
  Entry("layers/mlp/up/kernel", "model.layers.{layer}.mlp.up_proj.weight", True),
  Entry("layers/mlp/down/kernel", "model.layers.{layer}.mlp.down_proj.weight", True),
  Entry("final_norm/scale", "model.norm.weight", False),
  Entry("lm_head", "lm_head.weight", True),
)
_FUSED_MLP = {  # fused_mlp's kernel in place of gate and up
  "layers/mlp/gate/kernel": Entry("layers/mlp/gate_up/kernel", "model.layers.{layer}.mlp.gate_proj.weight", True, 0),
  "layers/mlp/up/kernel": Entry("layers/mlp/gate_up/kernel", "model.layers.{layer}.mlp.up_proj.weight", True, 1),
}
MLP_PROJECTIONS = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}  # our GEMM kinds -> HF module names
TIED_LM_HEAD = "lm_head.weight"  # present in some tied checkpoints as a copy of the embedding: never read


def entries(cfg):
  """The Entries of a config's model: every HF tensor (no lm_head with logits_via_embedding), in model order; a
  fused_mlp model's gate and up come from its gate_up kernel."""
  chosen = (_FUSED_MLP.get(e.param, e) if cfg.fused_mlp else e for e in _ENTRIES)
  return tuple(e for e in chosen if not (e.param == "lm_head" and cfg.logits_via_embedding))


def mlp_module(layer, gemm):
  """HF's module name of a layer's MLP GEMM kind ("gate" -> model.layers.3.mlp.gate_proj)."""
  return f"model.layers.{layer}.mlp.{MLP_PROJECTIONS[gemm]}"


def param_shape(cfg, entry):
  """Our parameter's shape (stacked per-layer ones with the leading layer axis)."""
  d, f, v = cfg.base_emb_dim, cfg.base_mlp_dim, cfg.vocab_size
  q, kv = cfg.base_num_query_heads * cfg.head_dim, cfg.base_num_kv_heads * cfg.head_dim
  shapes = {
    "embed/embedding": (v, d),
    "final_norm/scale": (d,),
    "lm_head": (d, v),
    "layers/pre_attention_norm/scale": (d,),
    "layers/pre_mlp_norm/scale": (d,),
    "layers/attention/query/kernel": (d, q),
    "layers/attention/key/kernel": (d, kv),
    "layers/attention/value/kernel": (d, kv),
    "layers/attention/out/kernel": (q, d),
    "layers/mlp/gate/kernel": (d, f),
    "layers/mlp/up/kernel": (d, f),
    "layers/mlp/down/kernel": (f, d),
    "layers/mlp/gate_up/kernel": (d, 2, f),
  }
  shape = shapes[entry.param]
  return (cfg.base_num_decoder_layers,) + shape if entry.per_layer else shape


def hf_shape(cfg, entry):
  """The HF tensor's shape (one layer's for per-layer entries)."""
  shape = param_shape(cfg, entry)[1 if entry.per_layer else 0 :]
  if entry.part is not None:
    shape = shape[:-2] + shape[-1:]
  return shape[::-1] if entry.transpose else shape


def hf_names(cfg):
  """{HF tensor name: (Entry, layer or None)} of every tensor a checkpoint of `cfg` holds, in model order."""
  out = {}
  for entry in entries(cfg):
    for layer in range(cfg.base_num_decoder_layers) if entry.per_layer else (None,):
      out[entry.hf_name(layer)] = (entry, layer)
  return out


def to_param_layout(entry, hf_array):
  """An HF tensor (or one layer's) in our layout."""
  return hf_array.T if entry.transpose else hf_array


def to_hf_layout(entry, param_array):
  """The entry's tensor from one parameter (one layer's slice of a stacked one), in HF's layout: a view, copied when
  written."""
  if entry.part is not None:
    param_array = param_array[..., entry.part, :]
  return param_array.T if entry.transpose else param_array


def rows_axis(entry, ndim):
  """The axis of our parameter (of `ndim` axes) that the HF tensor's rows lie along."""
  return ndim - 1 if entry.transpose else (1 if entry.per_layer else 0)


def param_index(entry, hf_rows, layer=None, ndim=2):
  """The index into our parameter (of `ndim` axes) of rows `hf_rows` (a slice) of the entry's HF tensor (of `layer`)."""
  index = [slice(None)] * ndim
  index[rows_axis(entry, ndim)] = hf_rows
  if entry.part is not None:
    index[-2] = entry.part
  if entry.per_layer:
    index[0] = layer
  return tuple(index)


def hf_index(entry, param_index_):
  """The slices of an HF tensor holding `param_index_` (slices of our per-layer or whole parameter, layer axis
  dropped, the part axis of a fused one too): swapped for transposed entries."""
  index = tuple(param_index_)
  if entry.part is not None:
    index = index[:-2] + index[-1:]
  return index[::-1] if entry.transpose else index
