"""Learning-rate schedules, chosen by `config.optimizer.schedule`.

Every schedule here is a function of `count`, the number of updates done so far (optax's
convention: the optimiser calls it with its update count), and gives the rate of the next
update. The formulas are written in the paper's step numbers, which start at 1: the update
after `count` updates is step s = count + 1. So the first update never has a rate of 0, and
'inverse_sqrt' with `warmup_init_lr` 0 and peak d_model^-0.5 * warmup^-0.5 is equation 3.

- 'paper': equation 3, lr = scale * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5).
- 'inverse_sqrt' (fairseq's): from `warmup_init_lr` linearly to `learning_rate` at s = warmup,
  then learning_rate * sqrt(warmup / s).
- 'cosine' (SGDR without restarts, Loshchilov & Hutter 2017): the same warm-up, then
  end + (peak - end) * (1 + cos(pi * (s - warmup) / (num_train_steps - warmup))) / 2, reaching
  `end_learning_rate` at the last step.
- 'constant': the same warm-up (none if warmup_steps is 0), then `learning_rate`.

The warm-up and the cosine are optax's schedules (`linear_schedule`, `join_schedules`,
`warmup_cosine_decay_schedule`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax.numpy as jnp

if TYPE_CHECKING:
  import optax

SCHEDULES = ("paper", "inverse_sqrt", "cosine", "constant")
# The schedules whose warm-up must have at least one step: 'paper' divides by warmup_steps and
# 'inverse_sqrt' decays from warmup_steps (0 would make every rate 0).
NEED_WARMUP = ("paper", "inverse_sqrt")


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """Equation 3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

  `count` is the number of updates done so far; the paper's step numbers start at 1.
  """

  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

  return schedule


def _warmup_then(init: float, peak: float, warmup_steps: int,
                 after: optax.Schedule) -> optax.Schedule:
  """Of the step number s: linear from `init` (s = 0) to `peak` (s = warmup_steps), then
  `after(s - warmup_steps)`; `after` alone without a warm-up."""
  import optax  # here: a translation, which needs only the names above, never imports it

  if warmup_steps == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(init, peak, warmup_steps), after],
                              [warmup_steps])


def _by_count(of_step: optax.Schedule) -> optax.Schedule:
  """A schedule of the step number s as one of the update count (s = count + 1)."""
  return lambda count: of_step(count + 1)


def inverse_sqrt_schedule(peak: float, warmup_steps: int, init: float = 0.0) -> optax.Schedule:
  """fairseq's inverse_sqrt: linear warm-up from `init` to `peak` over `warmup_steps` steps,
  then peak * sqrt(warmup_steps / s)."""
  decay = lambda since: peak * jnp.sqrt(warmup_steps / (warmup_steps + since))  # noqa: E731
  return _by_count(_warmup_then(init, peak, warmup_steps, decay))


def cosine_schedule(peak: float, warmup_steps: int, total_steps: int, init: float = 0.0,
                    end: float = 0.0) -> optax.Schedule:
  """Linear warm-up from `init` to `peak` over `warmup_steps` steps, then a half cosine from
  `peak` down to `end` at step `total_steps` (> warmup_steps), and `end` after it."""
  import optax

  return _by_count(optax.warmup_cosine_decay_schedule(init, peak, warmup_steps, total_steps,
                                                      end_value=end))


def constant_schedule(value: float, warmup_steps: int = 0, init: float = 0.0) -> optax.Schedule:
  """`value`, after a linear warm-up from `init` over `warmup_steps` steps (0: none)."""
  import optax

  return _by_count(_warmup_then(init, value, warmup_steps, optax.constant_schedule(value)))


def learning_rate_schedule(config: Any) -> optax.Schedule:
  """The run's schedule, `config.optimizer.schedule` ('paper' for a config without the field),
  as a function of the update count. Built once by the Trainer: the optimiser follows it and
  the training metrics log it."""
  opt = config.optimizer
  name = opt.get("schedule", "paper")
  if name == "paper":
    return paper_schedule(config.model.d_model, opt.warmup_steps, opt.learning_rate_scale)
  peak, warmup = opt.learning_rate, opt.warmup_steps
  init = opt.get("warmup_init_lr", 0.0)
  if name == "inverse_sqrt":
    return inverse_sqrt_schedule(peak, warmup, init)
  if name == "cosine":
    return cosine_schedule(peak, warmup, config.num_train_steps, init,
                           opt.get("end_learning_rate", 0.0))
  if name == "constant":
    return constant_schedule(peak, warmup, init)
  raise ValueError(f"optimizer.schedule={name!r}: must be one of {', '.join(SCHEDULES)}")

