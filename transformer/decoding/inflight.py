"""In-flight batching: beam search over a pool of sentences through a fixed number of slots, each
slot taking the pool's next sentence once its own has stopped.

A batch searched in lockstep (`search.beam_search`) runs until its last sentence stops, so its
rows keep stepping for sentences that have stopped (sorted by source length, a batch's outputs
still differ in length), and the larger the batch, the more it wastes: that kept batches small.
Here every slot (a sentence's K rows) is at its own step. Whenever `refill` slots are free, the
stopped sentences' hypotheses are written to the pool's outputs and their slots take the pool's
next `refill` sentences. Those come from a queue of `queue` sentences, made at once by `fresh`
(the encoder and the encoder-side keys and values, over a batch of `queue` sentences rather than
`refill`) and stepped once there: a sentence's first step has one live beam, so it takes one
row of the queue's batch instead of K identical rows of the slots' (greedy search, K = 1,
takes its first step in the slots: one row either way). The loop ends when the pool is empty
and every slot has stopped, so a batch may be many sentences without waiting for its longest.

Each sentence's outputs are those of `search.beam_search` on it: a slot's step depends on its
own rows only (the Transformer's cache keeps a position per row, `model.CACHE_INDEX` and
`POSITION`, and `KV_OWNER` masks what a row attends to), and a stopped sentence's results are
frozen. K = 1 is greedy search (`search.beam_search`'s docstring).

The model is the search's `tokens_to_logits` (search.py's module docstring); every cache leaf
has the batch leading (slots, or slots * K rows): a refilled slot starts its cache afresh while
the others go on, so no leaf may be shared by all rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from transformer.decoding import search as search_lib
from transformer.decoding.search import NEG_INF

PyTree = Any
# fresh(start) -> (cache, max_lengths): the untiled cache of the pool's sentences start ..
# start + Q - 1 (Q = queue; rows past the sentences searched are ignored) and their longest
# outputs int32 [Q].
Fresh = Callable[[jax.Array], tuple[PyTree, jax.Array]]


def put_slots(tree: PyTree, new: PyTree, slots: jax.Array, num_slots: int) -> PyTree:
  """`tree` (leaves [num_slots * g, ...]: g rows per slot) with the slots `slots` int32 [R]
  replaced by `new`'s rows (leaves [R * g, ...]); a slot index of `num_slots` drops its row."""

  def put(x, y):
    group = x.shape[0] // num_slots
    rows = (slots[:, None] * group + jnp.arange(group)[None, :]).reshape(-1)
    return x.at[rows].set(y, mode="drop")

  return jax.tree.map(put, tree, new)


def beam_search_refilled(
  tokens_to_logits: search_lib.TokensToLogits,
  cache: PyTree,
  fresh: Fresh,
  *,
  num_sentences: jax.Array,
  pool_size: int,
  refill: int,
  queue: int | None = None,
  beam_size: int = 4,
  alpha: float = 0.6,
  max_len: int,
  eos_id: int = 1,
  reorder: PyTree | None = None,
  per_sentence: PyTree | None = None,
  num_hypotheses: int | None = None,
  banned_id: int | None = None,
  normalize: bool = True,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`search.beam_search` of the first `num_sentences` of a pool of `pool_size` sentences,
  through the B slots of `cache` (in-flight batching: module docstring).

  Args:
    tokens_to_logits: ids int32[B * K, 1], cache -> (logits float32[B * K, V], new cache).
    cache: a cache of B sentences (untiled, as `beam_search` takes it); what its rows hold does
      not matter, every slot being filled from the queue before it steps.
    fresh: the cache and longest outputs of `queue` consecutive pool sentences (`Fresh`).
    num_sentences: int32 scalar, how many of the pool's sentences to search (the first ones).
    pool_size: P, static: the outputs' leading size, a multiple of Q.
    refill: R, static, 1 <= R <= B: the slots refilled at once.
    queue: Q, static, a multiple of R (default R): the sentences `fresh` makes at once and
      steps once (K > 1). `tokens_to_logits` takes their untiled cache, one row per sentence
      (every row at its first step, attending over its own position alone).
    beam_size, alpha, max_len, eos_id, reorder, per_sentence, num_hypotheses, banned_id,
      normalize: as for `search.beam_search`.

  Returns:
    `beam_search`'s sequences int32 [P, K, max_len], scores and log_probs float32 [P, K] of
    every pool sentence (those past `num_sentences`: empty, scores -inf).
  """
  k = beam_size
  n = search_lib.kept_hypotheses(beam_size, num_hypotheses, alpha)
  slots = jax.tree.leaves(cache)[0].shape[0]
  if not 1 <= refill <= slots:
    raise ValueError(f"refill must be in [1, {slots}] (the slots), got {refill}")
  q = refill if queue is None else queue
  if q % refill or pool_size % q:
    raise ValueError(f"queue={q} must be a multiple of refill={refill} and divide the pool's "
                     f"{pool_size} sentences")
  if any(jnp.ndim(x) == 0 for x in jax.tree.leaves(cache)):
    raise ValueError("in-flight batching needs every cache leaf with the batch leading")
  num_sentences = jnp.minimum(jnp.asarray(num_sentences, jnp.int32), pool_size)
  reorder = search_lib.beam_reorder(cache, reorder, per_sentence)

  penalties = search_lib.length_penalties(max_len, alpha)

  def rows_of(max_lengths):
    max_lengths = jnp.clip(jnp.asarray(max_lengths, jnp.int32), 1, max_len)
    return {"max_lengths": max_lengths, "best_possible_lp": penalties[max_lengths]}

  def outputs(state, which, valid):
    """The pool's outputs with the results of the slots `which` int32 [M] written where
    `valid` bool [M] (and the slot holds a sentence)."""
    part = {name: state[name][which] for name in (*search_lib.HYPOTHESES, "step", "sentence")}
    results = search_lib.final_hypotheses(part, part["step"], penalties)
    at = jnp.where(valid & (part["sentence"] >= 0), part["sentence"], pool_size)
    return tuple(o.at[at].set(r, mode="drop") for o, r in zip(state["out"], results,
                                                              strict=True))

  def left(state):
    return num_sentences - state["next"]

  def can_refill(state):
    free = jnp.sum(state["done"])
    return (left(state) > 0) & (free >= jnp.minimum(refill, left(state)))

  def first_steps(start):
    """The queue of the pool's sentences start .. start + Q - 1: their cache and hypotheses
    after their first step, taken from one row each (only beam 0 is live before it); greedy
    search's before it."""
    new_cache, max_lengths = fresh(start)
    hyps = {**search_lib.initial_hypotheses(q, k, max_len), "done": jnp.zeros((q,), bool),
            "rows": rows_of(max_lengths)}
    if k == 1:
      # Greedy: the first step is one row in a slot too, and stepping here would compile a
      # second decoder step; the slots take the sentences before it.
      return {**hyps, "step": jnp.zeros((q,), jnp.int32), "parent": jnp.zeros((q, 1), jnp.int32),
              "cache": new_cache, "start": start}
    logits, new_cache = tokens_to_logits(hyps["live_last"][:, :1], new_cache)
    new = search_lib.extend_beams(hyps, jnp.repeat(logits, k, axis=0),
                                  jnp.zeros((q,), jnp.int32), penalties, k=k, n=n,
                                  eos_id=eos_id, banned_id=banned_id, normalize=normalize)
    return {**new, "cache": new_cache, "start": start}

  def refill_once(state):
    # The first R free slots (stopped: their results are final) take the next R sentences.
    order = jnp.argsort(~state["done"], stable=True)[:refill]
    count = jnp.minimum(left(state), refill)
    take = (jnp.arange(refill) < count) & state["done"][order]
    targets = jnp.where(take, order, slots)
    out = outputs(state, order, take)
    queued = jax.lax.cond(state["next"] >= state["queue"]["start"] + q,
                          lambda: first_steps(state["next"]), lambda: state["queue"])
    at = state["next"] - queued["start"]
    part = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, at, refill),
                        {name: queued[name] for name in queued if name != "start"})
    parent = part.pop("parent")
    cache = search_lib.tile_beams(part.pop("cache"), k, per_sentence)
    new = {**part, "sentence": state["next"] + jnp.arange(refill, dtype=jnp.int32),
           "cache": cache if k == 1 else search_lib.gather_beams(cache, parent, reorder)}
    per_slot = {name: state[name] for name in new}
    state = {**state, **put_slots(per_slot, new, targets, slots)}
    return {**state, "next": state["next"] + count, "out": out, "queue": queued}

  def refill_all(state):
    return jax.lax.while_loop(can_refill, refill_once, state)

  def body(state):
    logits, cache = tokens_to_logits(
      search_lib.flatten_beams(state["live_last"])[:, None], state["cache"])
    new = search_lib.extend_beams(state, logits, state["step"], penalties, k=k, n=n,
                                  eos_id=eos_id, banned_id=banned_id, normalize=normalize)
    parent = new.pop("parent")
    # With one beam the parent is always itself: nothing to reorder.
    new["cache"] = cache if k == 1 else search_lib.gather_beams(cache, parent, reorder)
    new["step"] = jnp.where(state["done"], state["step"], new["step"])
    return refill_all({**state, **new})

  state = {
    **search_lib.initial_hypotheses(slots, k, max_len),
    "step": jnp.zeros((slots,), jnp.int32),
    "done": jnp.ones((slots,), bool),  # every slot free
    "sentence": jnp.full((slots,), -1, jnp.int32),
    "rows": rows_of(jnp.ones((slots,), jnp.int32)),
    "cache": search_lib.tile_beams(cache, k, per_sentence),
    "next": jnp.zeros((), jnp.int32),
    # Empty (its start a queue before the pool's): the first refill makes it.
    "queue": {**jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                             jax.eval_shape(first_steps, jnp.zeros((), jnp.int32))),
              "start": jnp.full((), -q, jnp.int32)},
    "out": (jnp.zeros((pool_size, k, max_len), jnp.int32),
            jnp.full((pool_size, k), NEG_INF, jnp.float32),
            jnp.full((pool_size, k), NEG_INF, jnp.float32)),
  }
  state = jax.lax.while_loop(lambda s: jnp.any(~s["done"]), body, refill_all(state))
  return outputs(state, jnp.arange(slots), jnp.ones((slots,), bool))
