"""config.hardware: what attention=auto and num_vocab_tiling=-1 become on each kind of hardware."""

import pytest

from MaxText import config
from MaxText.config import hardware

GB200 = hardware.Hardware("gpu", 10.0, 197_897_748_480 * 0.75, "gb200-4")  # 138.2 GiB: jax's 75% of its HBM


def _cfg(*overrides):
  return config.load(None, ["model_name=llama3-8b", "max_target_length=8192", *overrides])


def test_attention_auto_is_cudnn_flash_on_nvidia_gpus_that_run_it_and_xla_elsewhere():
  assert hardware.attention_kernel(GB200)[0] == "cudnn_flash"
  assert hardware.attention_kernel(hardware.Hardware("gpu", 9.0))[0] == "cudnn_flash"
  assert hardware.attention_kernel(hardware.Hardware("gpu", 7.5, what="a T4"))[0] == "dot_product"
  assert hardware.attention_kernel(hardware.Hardware("cpu"))[0] == "dot_product"


def test_the_lm_head_tiles_itself_only_when_its_logits_would_take_over_a_sixteenth_of_the_device():
  vocab = 128256
  # Llama 3 8B on a GB200: 4 x 8192 tokens per GPU -> 31.3 GiB of f32 logits and gradient: 4 tiles (7.3 GiB each,
  # under 8.6 GiB); 1 x 8192 -> 7.8 GiB: untiled.
  tiles, why = hardware.vocab_tiles(4 * 8192, vocab, 8192, GB200.memory_bytes)
  assert tiles == 4 and "31.3 GiB" in why and "138.2 GiB" in why
  tiles, why = hardware.vocab_tiles(8192, vocab, 8192, GB200.memory_bytes)
  assert tiles == 1 and "7.8 GiB per device, under 1/16 of its 138.2 GiB" in why
  assert hardware.vocab_tiles(4 * 8192, vocab, 8192, 0)[0] == 1  # memory unknown: untiled
  # On an 80 GiB-class device (60 GiB for jax) 8192 tokens already need 2 tiles.
  assert hardware.vocab_tiles(8192, vocab, 8192, 60 * 2**30)[0] == 2
  # Tiles divide the sequence; where no divisor is enough, the most tiles there are.
  assert hardware.vocab_tiles(3 * 1000, vocab, 3, 2**30)[0] == 3


def test_resolve_makes_auto_values_concrete_and_keeps_explicit_ones():
  cfg, chosen = hardware.resolve(_cfg("per_device_batch_size=4"), GB200, 4)
  assert (cfg.attention, cfg.num_vocab_tiling) == ("cudnn_flash", 4)
  assert set(chosen) == {"attention", "num_vocab_tiling", "remat_policy"}
  assert chosen["remat_policy"][0] == "full"  # no memory estimate given: MaxText's default
  line = hardware.describe(chosen)
  assert line.startswith("auto: attention=cudnn_flash (cuDNN's fused flash attention on gb200-4); num_vocab_tiling=4")
  cfg, chosen = hardware.resolve(_cfg("attention=dot_product", "num_vocab_tiling=2", "remat_policy=minimal"), GB200, 4)
  assert (cfg.attention, cfg.num_vocab_tiling, chosen) == ("dot_product", 2, {})
  for memory in (0, 2**30):  # a CPU: the same program whatever the host's memory
    cfg, chosen = hardware.resolve(_cfg("per_device_batch_size=4"), hardware.Hardware("cpu", None, memory), 1)
    assert (cfg.attention, cfg.num_vocab_tiling, cfg.remat_policy) == ("dot_product", 1, "full")
  # Gradient accumulation: the logits are those of one micro-batch.
  cfg, _ = hardware.resolve(_cfg("per_device_batch_size=4", "gradient_accumulation_steps=4"), GB200, 4)
  assert cfg.num_vocab_tiling == 1


@pytest.mark.parametrize("value,expected", [("autoselected", "auto"), ("cudnn_flash_te", "cudnn_flash")])
def test_maxtexts_attention_names_are_read(value, expected):
  assert _cfg(f"attention={value}").attention == expected


@pytest.mark.parametrize("tiles", ["0", "-2", "3"])
def test_num_vocab_tiling_is_auto_or_a_divisor_of_the_sequence(tiles):
  with pytest.raises(config.ConfigError, match="num_vocab_tiling"):
    _cfg(f"num_vocab_tiling={tiles}")


def test_remat_auto_keeps_the_most_the_gpu_holds_and_is_full_on_a_cpu():
  need = {"minimal_with_context": 150e9, "minimal": 120e9, "full": 60e9}
  policy, why = hardware.remat_policy(GB200, need.get)  # 90% of 148.4 GB = 133.6 GB
  assert policy == "minimal" and "minimal_with_context would not fit" in why
  assert hardware.remat_policy(GB200, lambda p: 10e9)[0] == "minimal_with_context"
  assert hardware.remat_policy(GB200, lambda p: 1e12)[0] == "full"  # nothing fits: full, and the memory check says so
  assert hardware.remat_policy(hardware.Hardware("cpu", None, 2**40), need.get) == ("full", "")
  assert hardware.remat_policy(hardware.Hardware("gpu"), need.get) == ("full", "")  # memory unknown


def test_resolve_estimates_each_remat_policy_on_the_concrete_config():
  seen = []

  def memory_of(cfg):
    seen.append((cfg.remat_policy, cfg.attention, cfg.num_vocab_tiling))
    return {"minimal_with_context": 200e9, "minimal": 100e9}.get(cfg.remat_policy, 50e9)

  cfg, chosen = hardware.resolve(_cfg(), GB200, 4, memory_of)
  assert cfg.remat_policy == "minimal" and chosen["remat_policy"][0] == "minimal"
  assert seen == [("minimal_with_context", "cudnn_flash", 1), ("minimal", "cudnn_flash", 1)]
  assert hardware.resolve(_cfg("remat_policy=full"), GB200, 4, memory_of)[0].remat_policy == "full"
  assert hardware.unresolved_remat("auto") == "full" and hardware.unresolved_remat("minimal") == "minimal"
