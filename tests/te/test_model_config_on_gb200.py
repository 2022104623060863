"""The model config alone on a GB200 node (`python train.py configs/llama3_8b.yml quantization=te_nvfp4`), compiled for
gb200-4 with its auto values: it fits, runs cuDNN's flash attention and the plan's NVFP4 GEMMs on Transformer Engine,
and is estimated within 15% of the NVFP4 preset's tokens/s per GPU on the same GPUs (an estimate from the compiled
programs, both by the same model; the preset's 3 sequences per GPU against the model config's 1 account for most of
the gap: 89.5% at commit 625c65f)."""

import pytest

from MaxText import config, train_compile
from tests.conftest import REPO

pytestmark = pytest.mark.te


@pytest.mark.heavy
def test_the_model_config_alone_fits_a_gb200_node_and_runs_near_the_presets_speed(capsys):
  card = config.load(REPO / "configs" / "llama3_8b.yml", ["quantization=te_nvfp4", "compile_topology=gb200-4"])
  preset = config.load(REPO / "configs" / "gb200" / "llama3_8b_nvfp4.yml", ["compile_topology=gb200-4"])
  (card_step, card_report), (_, preset_report) = (train_compile.compile_and_report(c) for c in (card, preset))
  assert card_step.fits
  chosen = {key: choice["value"] for key, choice in card_report["auto"].items()}
  assert chosen["attention"] == "cudnn_flash" and chosen["remat_policy"] != "full"
  assert card_report["kernels"].get("attention/cudnn", 0) > 0
  assert set(card_report["gemm_sites"]["gate"]) == {"te"}
  printed = capsys.readouterr().out
  assert "auto: attention=cudnn_flash (cuDNN's fused flash attention on gb200-4)" in printed
  ratio = card_report["estimate"]["tokens_per_s_per_device"] / preset_report["estimate"]["tokens_per_s_per_device"]
  assert ratio >= 0.85, ratio
