"""Evaluation every `every` steps and at the last: the mean loss over up to eval_steps batches of a fresh pass over
the eval split, printed and added to that step's metrics record (eval_loss, eval_weights)."""

import numpy as np

from MaxText.trainer.loop import Hook


def evaluate(eval_step, params, rest, batches, count, place, last_step_done):
  """(mean eval loss, eval tokens) over the first `count` of `batches` (an eval iterator, closed here); None when
  they yield no tokens (never a loss of 0 from nothing). `place`: a host batch -> the global arrays eval_step reads."""
  try:
    sums = [eval_step(params, rest, place(batch)) for _, batch in zip(range(count), batches)]
  finally:
    batches.close()
  xent, weights = (float(sum(s[i] for s in sums)) if sums else 0.0 for i in (0, 1))
  if weights <= 0:
    print(
      f"warning: eval after step {last_step_done}: the eval split yielded no tokens; no eval loss logged", flush=True
    )
    return None
  print(
    f"eval after step {last_step_done}: loss: {xent / weights:.3f}, perplexity: {np.exp(xent / weights):.2f}, "
    f"tokens: {int(weights)}",
    flush=True,
  )
  return xent / weights, weights


class EvalHook(Hook):
  """Evaluates every `every` steps and after the last step (`last_step`), on `eval_steps` batches from
  `make_iterator()` (None when there is no eval split)."""

  def __init__(self, eval_step, make_iterator, place, *, every, eval_steps, last_step):
    self.eval_step, self.make_iterator, self.place = eval_step, make_iterator, place
    self.every, self.eval_steps, self.last_step = every, eval_steps, last_step

  def needs_sync(self, step):
    return step % self.every == 0

  def after_steps(self, results, progress, sync):
    step = progress.state.step
    if not sync or not (step % self.every == 0 or step == self.last_step):
      return
    iterator = self.make_iterator()
    if iterator is None:
      return False
    result = evaluate(
      self.eval_step, progress.state.params, progress.state.rest, iterator, self.eval_steps, self.place, step - 1
    )
    if result is not None and results:
      results[-1].record["eval_loss"], results[-1].record["eval_weights"] = result
    return True
