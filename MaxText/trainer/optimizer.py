"""AdamW with linear warmup and cosine decay, global-norm clipping; f32 master weights."""

import optax


def learning_rate_schedule(cfg):
  """Linear warmup to learning_rate, then cosine decay to cosine_learning_rate_final_fraction of it."""
  total = cfg.learning_rate_schedule_steps if cfg.learning_rate_schedule_steps > 0 else cfg.steps
  warmup = cfg.warmup_steps if cfg.warmup_steps >= 0 else int(cfg.warmup_steps_fraction * total)
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=cfg.learning_rate,
    warmup_steps=min(warmup, total - 1),
    decay_steps=max(total, 1),
    end_value=cfg.learning_rate * cfg.cosine_learning_rate_final_fraction,
  )


def make_optimizer(cfg):
  """The optax transformation for `cfg` (clipping first, then AdamW with the schedule)."""
  chain = []
  if cfg.gradient_clipping_threshold > 0:
    chain.append(optax.clip_by_global_norm(cfg.gradient_clipping_threshold))
  chain.append(
    optax.adamw(
      learning_rate_schedule(cfg), b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps, weight_decay=cfg.adam_weight_decay
    )
  )
  return optax.chain(*chain)
