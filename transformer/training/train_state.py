"""Training state, the optimiser, the loss, and the pure step functions.

`train_step(state, batch, rng) -> (state, metrics)` is pure: the step's dropout RNG is
`fold_in(rng, state.step)`, so a resumed run draws exactly the masks an uninterrupted run
would. With gradient accumulation (`config.grad_accum_steps`) the step runs its batch as
micro-batches and still makes one update with the whole batch's mean gradient. Non-finite
losses or gradients are caught inside the step: the update is skipped and counted, so no NaN
ever reaches the parameters (and thus a checkpoint). With `optimizer.ema_decay` > 0 the state
also carries an exponential moving average of the parameters, which evaluation and inference
use. The learning-rate schedules are in `transformer/schedules.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from transformer.data.packing import packing_kwargs

if TYPE_CHECKING:
  import optax

# optax is imported by the functions that build or apply the optimiser: inference imports this
# module (the loss, `optimizer_value`) and never pays for optax's import (benchmarks/startup.py).

Array = jax.Array


@struct.dataclass
class TrainState:
  step: Array  # int32 scalar: number of updates applied (or skipped) so far
  params: Any
  opt_state: Any
  nonfinite_in_a_row: Array  # int32 scalar: consecutive steps skipped for NaN/Inf
  nonfinite_total: Array  # int32 scalar

  @property
  def eval_params(self) -> Any:
    """The parameters evaluation and inference use."""
    return self.params


@struct.dataclass
class EmaTrainState(TrainState):
  """A TrainState that also carries an exponential moving average of the parameters
  (`optimizer.ema_decay` > 0), which evaluation and inference use instead of the parameters.

  A subclass rather than an optional field, so that a run without the average keeps the state
  (and the checkpoint layout) it had before the average existed.
  """

  ema_params: Any  # float32, the structure and shardings of `params`

  @property
  def eval_params(self) -> Any:
    return self.ema_params


def create_train_state(params: Any, tx: optax.GradientTransformation,
                       ema: bool = False) -> TrainState:
  """The state before the first update; with `ema`, its average starts at `params`."""
  zero = jnp.zeros((), jnp.int32)
  fields = dict(step=zero, params=params, opt_state=tx.init(params), nonfinite_in_a_row=zero,
                nonfinite_total=zero)
  if not ema:
    return TrainState(**fields)
  return EmaTrainState(**fields, ema_params=jax.tree.map(lambda p: p.astype(jnp.float32),
                                                          params))


# The optimizer fields that add a part to the train state when > 0: a clipping stage and a
# weight-decay stage of the optimiser's state, and the parameters' average. A checkpoint
# restores only into a state with the same parts (`run_meta.check_meta`); the values may
# change (a new decay only weights the updates to come).
STATE_PARTS = ("grad_clip_norm", "weight_decay", "ema_decay")


def optimizer_value(config: Mapping[str, Any], name: str) -> float:
  """`config.optimizer.<name>` of a config or of its JSON dict (a checkpoint's metadata); 0.0
  (off) for the fields a config written before them lacks."""
  return float(config["optimizer"].get(name, 0.0))


# Decoupled weight decay skips the parameters of these names: biases and LayerNorm's scales and
# biases (flax names them 'bias' and 'scale').
NO_DECAY = ("bias", "scale")


def decay_mask(params: Any) -> Any:
  """True for each parameter that weight decay shrinks: the weight matrices and embeddings.

  Biases and LayerNorm gains only shift and scale activations, and pulling a gain towards 0
  fights the normalisation instead of limiting the model, so they are left out, as is usual
  (BERT's AdamW, nanoGPT). By name rather than by the common test `ndim == 1`: under
  `model.scan_layers` a LayerNorm scale is [layers, d_model], 2-D like a matrix.
  """

  def decayed(path, _) -> bool:
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    return not names or names[-1] not in NO_DECAY

  return jax.tree_util.tree_map_with_path(decayed, params)


def make_optimizer(config: Any, learning_rate_fn: optax.Schedule) -> optax.GradientTransformation:
  """Adam(b1, b2, eps) (section 5.3) on `learning_rate_fn` (`schedules.learning_rate_schedule`,
  built once by the caller, which also logs it), with optional global-norm clipping.

  `optimizer.weight_decay` > 0 makes it AdamW (Loshchilov & Hutter 2019, `optax.adamw`): the
  update is -lr * (Adam's step + weight_decay * param) on the parameters of `decay_mask`, the
  decay scaled by the scheduled rate as optax (and PyTorch) do. 0 is plain Adam, as before.
  """
  import optax

  opt = config.optimizer
  weight_decay = optimizer_value(config, "weight_decay")
  if weight_decay > 0:
    adam = optax.adamw(learning_rate_fn, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                       weight_decay=weight_decay, mask=decay_mask)
  else:
    adam = optax.adam(learning_rate_fn, b1=opt.b1, b2=opt.b2, eps=opt.eps)
  if opt.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(opt.grad_clip_norm), adam)
  return adam


def cross_entropy(logits: Array, targets: Array, label_smoothing: float) -> tuple[Array, Array]:
  """Per-token label-smoothed cross-entropy and plain negative log-likelihood.

  logits float32 [b, t, V], targets int [b, t]. The smoothed target puts 1 - eps on the
  reference and eps / (V - 1) on every other token (section 5.4); its own entropy is
  subtracted so that a perfect prediction scores 0. Returns (smoothed [b, t], nll [b, t]).

  The gradient with respect to the logits is written out (p - q for the smoothed loss, p minus
  the one-hot target for nll, p = softmax(logits)): one elementwise pass over [b, t, V]. The
  derived one keeps log p and scatters the target's entry into a zeroed [b, t, V] array: more
  passes over the largest arrays of the step.
  """
  vocab = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab - 1)
  normalizer = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low + 1e-20))

  def forward(logits, targets):
    z = logits.astype(jnp.float32)
    shift = z.max(-1)
    log_z = shift + jnp.log(jnp.exp(z - shift[..., None]).sum(-1))  # log sum_v exp z_v
    nll = log_z - jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
    # sum_v q_v * -log p_v with q = low everywhere except `confidence` at the target, and
    # sum_v log p_v = sum_v z_v - V log_z.
    smoothed = confidence * nll - low * (z.sum(-1) - vocab * log_z + nll) - normalizer
    return (smoothed, nll), log_z

  @jax.custom_vjp
  def smoothed_and_nll(logits, targets):
    return forward(logits, targets)[0]

  def forward_with_residuals(logits, targets):
    out, log_z = forward(logits, targets)
    return out, (logits, targets, log_z)

  def backward(residuals, cotangents):
    logits, targets, log_z = residuals
    d_smoothed, d_nll = cotangents
    p = jnp.exp(logits.astype(jnp.float32) - log_z[..., None])
    at_target = jnp.arange(vocab) == targets[..., None]
    # d_smoothed (p - low - (confidence - low) [v = target]) + d_nll (p - [v = target])
    d_logits = ((d_smoothed + d_nll)[..., None] * p - (low * d_smoothed)[..., None]
                - jnp.where(at_target, ((confidence - low) * d_smoothed + d_nll)[..., None], 0.0))
    return d_logits.astype(logits.dtype), None

  smoothed_and_nll.defvjp(forward_with_residuals, backward)
  smoothed, nll = smoothed_and_nll(logits, targets)
  return (nll, nll) if label_smoothing == 0.0 else (smoothed, nll)


def loss_sums(logits: Array, targets: Array, label_smoothing: float) -> dict[str, Array]:
  """Sums over non-padding tokens (targets > 0): loss, nll, correct, tokens."""
  weights = (targets > 0).astype(jnp.float32)
  smoothed, nll = cross_entropy(logits, targets, label_smoothing)
  predicted = jnp.argmax(logits, axis=-1)
  correct = (predicted == targets).astype(jnp.float32)
  return {
    "loss": (smoothed * weights).sum(),
    "nll": (nll * weights).sum(),
    "correct": (correct * weights).sum(),
    "tokens": weights.sum(),
  }


def _tree_norm(tree) -> Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def split_micro_batches(batch: dict[str, Array], k: int) -> dict[str, Array]:
  """The rows of `batch` dealt into k micro-batches: every [R, ...] -> [k, ceil(R / k), ...].

  Micro-batch i holds rows i, i + k, i + 2k, ... Rows are split over the devices in contiguous
  blocks, so dealing them (rather than cutting k blocks) gives every micro-batch rows on every
  device that holds at least k rows, evenly when each holds a multiple of k. R not divisible by
  k is padded with all-zero rows at the end first: they add nothing to any sum of the step, as
  token 0 is padding (loss weight 0) and segment 0 is packing's padding (`data.packing`).
  """
  rows = batch["inputs"].shape[0]
  padded = -(-rows // k) * k
  out = {}
  for name, x in batch.items():
    x = jnp.pad(x, [(0, padded - rows)] + [(0, 0)] * (x.ndim - 1))
    # [R', ...] -> [R'/k, k, ...] keeps each device's block of rows in place; then k first.
    x = jnp.moveaxis(x.reshape(padded // k, k, *x.shape[1:]), 1, 0)
    out[name] = nn.with_logical_constraint(x, (None, "batch", "length"))
  return out


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    label_smoothing: float, grad_accum_steps: int = 1,
                    ema_decay: float = 0.0) -> Callable:
  """Returns the pure `train_step(state, batch, rng) -> (state, metrics)`.

  batch: {'inputs': int32 [b, s], 'targets': int32 [b, t]}, and for packed rows also the
  segment and position keys of `data.packing.PACKING_KEYS`; rng: the run's seed key.

  `grad_accum_steps` = k > 1 runs the forward and backward passes over k micro-batches of about
  b / k rows (`split_micro_batches`: rows i, i + k, ...; all-zero rows pad b to a multiple of
  k) one after the other in a `lax.scan`, so activations are held for one micro-batch at a
  time, then makes ONE optimizer update. The gradients of the micro-batches' loss SUMS, their
  loss sums and their token counts are summed (float32, like the parameters), and the sums are
  divided once by the token count of the whole batch: the loss is the mean over all its tokens
  as with k = 1, not a mean of micro-batch means. Micro-batch i draws its dropout masks from
  `fold_in(fold_in(rng, step), i)`. Metrics are the whole batch's, as with k = 1; k = 1 is
  the single pass, unchanged.

  `ema_decay` > 0 (the state an `EmaTrainState`) updates the parameters' average after each
  finite update: ema = ema_decay * ema + (1 - ema_decay) * params, in float32; a skipped step
  leaves it as it was.
  """
  if isinstance(grad_accum_steps, bool) or not isinstance(grad_accum_steps, int) or (
      grad_accum_steps < 1):
    raise ValueError(f"grad_accum_steps must be an integer >= 1, got {grad_accum_steps!r}")

  def apply_and_sum(params, batch, dropout_rng):
    logits = model.apply({"params": params}, batch["inputs"], batch["targets"], train=True,
                         rngs={"dropout": dropout_rng}, **packing_kwargs(batch))
    return loss_sums(logits, batch["targets"], label_smoothing)

  def loss_fn(params, batch, dropout_rng):
    sums = apply_and_sum(params, batch, dropout_rng)
    # Mean over the tokens of the whole global batch, so the number of devices never
    # changes the math.
    return sums["loss"] / jnp.maximum(sums["tokens"], 1.0), sums

  def sum_fn(params, batch, dropout_rng):
    sums = apply_and_sum(params, batch, dropout_rng)
    return sums["loss"], sums

  def accumulate(params, batch, dropout_rng):
    """(mean loss, sums, mean-loss gradients) of the whole batch, over k micro-batches."""
    micro = split_micro_batches(batch, grad_accum_steps)
    grad_of_sum = jax.grad(sum_fn, has_aux=True)

    def body(carry, xs):
      i, mb = xs
      mb = {name: nn.with_logical_constraint(x, ("batch", "length")) for name, x in mb.items()}
      grads, sums = grad_of_sum(params, mb, jax.random.fold_in(dropout_rng, i))
      add = lambda acc, x: acc + x.astype(jnp.float32)
      return jax.tree.map(add, carry, (grads, sums)), None

    first = jax.tree.map(lambda x: x[0], micro)
    shapes = jax.eval_shape(grad_of_sum, params, first, dropout_rng)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)
    (grad_sums, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(grad_accum_steps), micro))
    tokens = jnp.maximum(sums["tokens"], 1.0)
    return sums["loss"] / tokens, sums, jax.tree.map(lambda g: g / tokens, grad_sums)

  def train_step(state: TrainState, batch: dict[str, Array], rng: Array):
    dropout_rng = jax.random.fold_in(rng, state.step)
    if grad_accum_steps == 1:
      (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch,
                                                                      dropout_rng)
    else:
      loss, sums, grads = accumulate(state.params, batch, dropout_rng)
    grad_norm = _tree_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def update(params, opt_state, grads):
      import optax

      updates, new_opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), new_opt_state

    # Skip a non-finite update entirely: parameters and Adam moments keep their old values.
    # A select rather than a conditional, so that no device waits on the predicate.
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_params, new_opt_state = keep(update(state.params, state.opt_state, grads),
                                     (state.params, state.opt_state))
    in_a_row = jnp.where(finite, 0, state.nonfinite_in_a_row + 1)
    new_state = state.replace(
      step=state.step + 1,
      params=new_params,
      opt_state=new_opt_state,
      nonfinite_in_a_row=in_a_row.astype(jnp.int32),
      nonfinite_total=(state.nonfinite_total + (~finite)).astype(jnp.int32),
    )
    if ema_decay > 0:
      ema = jax.tree.map(lambda e, p: ema_decay * e + (1 - ema_decay) * p.astype(jnp.float32),
                         state.ema_params, new_params)
      new_state = new_state.replace(ema_params=keep(ema, state.ema_params))
    metrics = {
      **sums,
      "grad_norm": grad_norm,
      "param_norm": _tree_norm(new_params),
      "nonfinite": (~finite).astype(jnp.float32),
      "source_tokens": (batch["inputs"] > 0).sum().astype(jnp.float32),
    }
    return new_state, metrics

  return train_step


def make_eval_step(model: nn.Module, label_smoothing: float) -> Callable:
  """Returns `eval_step(params, batch) -> sums` (loss, nll, correct, tokens); the batch may be
  packed as for `make_train_step`."""

  def eval_step(params, batch):
    logits = model.apply({"params": params}, batch["inputs"], batch["targets"], train=False,
                         **packing_kwargs(batch))
    return loss_sums(logits, batch["targets"], label_smoothing)

  return eval_step
