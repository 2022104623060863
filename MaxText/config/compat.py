"""What a MaxText command line means here: its config-file paths, its renamed keys, its keys this trainer does not
have (and why), and its value spellings that set more than one key (quantization=fp8)."""

import pathlib
import sys

from MaxText.quantization.recipes import get_recipe

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
BASE_YML = CONFIGS / "base.yml"
# MaxText's base config under each of its layouts (old MaxText/, src/MaxText/, the package's src/maxtext/ and the
# pip-installed maxtext/): all mean our configs/base.yml, the defaults every key has here.
MAXTEXT_BASE_CONFIGS = (
  "MaxText/configs/base.yml",
  "src/MaxText/configs/base.yml",
  "src/maxtext/configs/base.yml",
  "maxtext/configs/base.yml",
)
# Keys MaxText has renamed since: its current name -> ours (its earlier one).
RENAMED = {"learning_rate_final_fraction": "cosine_learning_rate_final_fraction"}
# MaxText's mixture-of-experts keys: they mean nothing for a dense model, in MaxText too; accepted with a warning.
MOE_KEYS = ("megablox", "sparse_matmul", "capacity_factor", "num_experts", "num_experts_per_tok")
# MaxText's mesh axes this trainer lacks: a size of 1 (no parallelism on it) means the same here and is accepted.
OTHER_MESH_AXES = tuple(
  f"{kind}_{axis}_parallelism"
  for kind in ("ici", "dcn")
  for axis in ("expert", "pipeline", "sequence", "fsdp_transpose", "tensor_sequence", "autoregressive")
)
# MaxText's keys this trainer does not have, and why: setting one is an error saying so.
NOT_HERE = {
  **{
    k: f"MaxText's {k.split('_', 1)[1][: -len('_parallelism')]} mesh axis; the axes here are data, fsdp, context "
    "and tensor (a size of 1 is accepted)"
    for k in OTHER_MESH_AXES
  },
  "activations_in_float32": "MaxText's f32 activations around bf16 GEMMs; dtype=float32 runs everything in f32 here",
  "hf_data_files": "no key in MaxText either (its older scripts' misspelling): the key is hf_train_files",
  "eval_dataset_name": "MaxText's second TFDS dataset for eval; here eval_split names a split of dataset_name",
  "mu_dtype": "MaxText's dtype of Adam's first moment; it is float32 here",
  "lr_schedule_type": "MaxText's schedule choice; the schedule here is its default, cosine with linear warmup",
  "decoder_block": "MaxText's decoder choice; every model here is a Llama decoder (MaxText's llama2 block)",
  "dropout_rate": "MaxText's dropout; the Llama models here have none",
  "base_config": "a YAML key (the file a config inherits); give the config file as the first argument instead",
}


def config_path(arg):
  """The config file a first argument names: MaxText's base.yml paths mean our configs/base.yml."""
  text = str(arg).replace("\\", "/")
  if not pathlib.Path(arg).exists() and any(text == p or text.endswith("/" + p) for p in MAXTEXT_BASE_CONFIGS):
    return BASE_YML
  return arg


def ignored(name, value, where):
  """For a MaxText key this trainer lacks: None when `value` means here what it means in MaxText (a warning line
  printed where it matters), else the one-line reason it is refused. KeyError for a name MaxText lacks too."""
  if name in MOE_KEYS:
    print(
      f"warning: {where}: {name}={value} has no effect here: it is a mixture-of-experts key and the Llama models "
      "here are dense (MaxText ignores it for them too)",
      file=sys.stderr,
      flush=True,
    )
    return None
  if name in OTHER_MESH_AXES and str(value).strip() == "1":
    return None
  return f"{where}: '{name}' is {NOT_HERE[name]}"


def maxtext_values(values, explicit):
  """{key: value} that MaxText's spelling of a value implies for other keys the config leaves unset:
  quantization=fp8 is Flax's delayed-scaling FP8 on every Dense layer (MaxText's Fp8Quantization)."""
  implied = {}
  if values.get("quantization") == "fp8":
    implied["quantization"] = get_recipe("fp8").name
    if "quantization_scope" not in explicit:
      implied["quantization_scope"] = "all_dense"
  return implied
