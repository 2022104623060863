"""Values derived from a Config and the device count (batch sizes, tokens per step): computed here only."""

import dataclasses

from MaxText.config.schema import ConfigError


@dataclasses.dataclass(frozen=True)
class RunShape:
  """Values derived from a Config and the device count: the only place they are computed."""

  num_devices: int
  global_batch_size: int  # sequences per optimizer step
  micro_batch_size: int  # sequences per accumulation micro-step
  tokens_per_step: int

  @classmethod
  def of(cls, config, num_devices: int):
    global_batch = config.per_device_batch_size * num_devices
    if not float(global_batch).is_integer() or global_batch < 1:
      raise ConfigError(
        f"per_device_batch_size={config.per_device_batch_size} x {num_devices} devices "
        "must be a whole number of sequences >= 1"
      )
    global_batch = int(global_batch)
    if global_batch % config.gradient_accumulation_steps:
      raise ConfigError(
        f"global batch {global_batch} is not divisible by gradient_accumulation_steps="
        f"{config.gradient_accumulation_steps}"
      )
    return cls(
      num_devices,
      global_batch,
      global_batch // config.gradient_accumulation_steps,
      global_batch * config.max_target_length,
    )
