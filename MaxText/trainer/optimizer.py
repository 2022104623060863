"""The optimizer (opt_type: AdamW, Praxis' Adam, SGD) with linear warmup and cosine decay, global-norm clipping; f32
master weights."""

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
  """The optax transformation for `cfg`: clipping first, then opt_type with the schedule (MaxText's get_optimizer).

  adam_pax is Praxis' Adam as MaxText has it: mu and nu updated with bias-corrected decay rates, then
  mu / (sqrt(nu + eps_root) + eps) plus weight_decay x param, times -lr. The bias-corrected rates make its moments
  Adam's bias-corrected ones, so the update is optax.adamw's (scale_by_adam, add_decayed_weights, the learning rate)
  up to rounding. sgd is optax.sgd: no momentum, no weight decay.
  """
  chain = []
  if cfg.gradient_clipping_threshold > 0:
    chain.append(optax.clip_by_global_norm(cfg.gradient_clipping_threshold))
  schedule = learning_rate_schedule(cfg)
  if cfg.opt_type == "sgd":
    chain.append(optax.sgd(schedule))
  else:
    chain.append(
      optax.adamw(
        schedule,
        b1=cfg.adam_b1,
        b2=cfg.adam_b2,
        eps=cfg.adam_eps,
        eps_root=cfg.adam_eps_root,
        weight_decay=cfg.adam_weight_decay,
      )
    )
  return optax.chain(*chain)
