"""Greedy decoding and beam search over an incremental-decoding (KV) cache.

The model is abstracted as a pure function that advances the decoder by one token:

  tokens_to_logits(ids: int32[B, 1], cache) -> (logits: float32[B, vocab], new_cache)

`ids` is the previous token of every row (0, the BOS/padding id, at the first step) and
`cache` is any PyTree. Every cache leaf with `ndim >= 1` must have the batch as its leading
axis (e.g. cached keys/values `[B, max_len, heads, head_dim]`); scalar leaves (e.g. a cache
index shared by all rows) are passed through untouched, never tiled or gathered, which is
valid because all rows and beams advance in lockstep. The prefix is never re-run: each loop
iteration calls `tokens_to_logits` exactly once on one token per row.

Token ids: 0 is padding (and the first decoder input), 1 is end-of-sentence (EOS). Outputs
are 0 after the EOS.

Length convention: the length of a hypothesis counts the generated tokens including its EOS
(not the initial 0). A hypothesis whose EOS is produced at step `t` (0-based) has length
`t + 1`; `max_lengths[b]` is the largest such length, so EOS is forced at step
`max_lengths[b] - 1`.

`banned_id`, if given, is a token the search never chooses (the padding id, for a model that
would otherwise emit it: OPUS-MT models forbid theirs). It is removed after the log-softmax, as
Hugging Face's `bad_words_ids` does in beam search: the other tokens keep their log
probabilities, which are not renormalised.

`normalize=False` says that `tokens_to_logits` returns log probabilities already (an
ensemble's weighted average of its members' log probabilities, `translate.decode_hypotheses`),
which the searches then use as they are instead of applying a log-softmax.

`prefix` int32[B, P] with `prefix_lengths` int32[B], if given, forces the first
`prefix_lengths[b]` tokens of sentence b's every hypothesis (a forced target prefix: what
interactive translation and terminology constraints need); each forced token keeps its log
probability under the model, so a hypothesis's log probability is that of the whole
sequence, prefix included. A prefix must leave room for the EOS (`prefix_lengths[b] <
max_lengths[b]`).

`stages` (static), if given, are the sentence counts a batch shrinks to: once no more than
`stages[0]` sentences are still searching, the stopped ones leave the batch and the loop goes
on over `stages[0]` sentences, and so on. A batch's last steps are then not spent on
sentences that have stopped (sorted by source length, a batch's outputs still differ in
length, and one long output keeps the loop going); each stage's loop is compiled apart. Every
sentence's outputs are those of the unshrunk search, since a stopped sentence's results are
frozen and no row's step depends on another row. With stages, `tokens_to_logits` must take
everything it needs with a batch axis from the cache, which is cut with the batch, and close
over nothing with one.

All the decoders are jit-compatible: pass `tokens_to_logits` through a closure (or as a static
argument) and keep `max_len`, `beam_size`, `alpha`, `eos_id`, `banned_id` and `stages` static.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
TokensToLogits = Callable[[jax.Array, PyTree], tuple[jax.Array, PyTree]]

# Scores of impossible hypotheses: -inf is exact under + and / by positive numbers, and
# lax.top_k ranks it last, so invalid beams never displace valid ones.
NEG_INF = -np.inf

# `top_k_by_blocks`: blocks of about this many scores, a divisor of the row's where one is near
# (a padded row is copied, and the copy costs more than the blocks save on [64, 148000] scores).
TOP_K_BLOCK = 128


def top_k_block(n: int, block: int | None = None) -> int:
  """The block `top_k_by_blocks` takes for rows of `n` scores: the divisor of n nearest `block`
  (default TOP_K_BLOCK) within a factor of 2, or `block` itself (the row padded)."""
  block = block or TOP_K_BLOCK
  near = [d for d in range(max(1, block // 2), 2 * block + 1) if n % d == 0]
  return min(near, key=lambda d: (abs(d - block), d)) if near else block


def top_k_by_blocks(scores: jax.Array, k: int,
                     block: int | None = None) -> tuple[jax.Array, jax.Array]:
  """`lax.top_k(scores, k)` (values and indices [b, k], ties to the lower index), bitwise,
  for scores [b, N] without NaN, by blocks of about `block` scores (`top_k_block`): the top k of
  the blocks' maxima, then the top k of those k blocks' scores. A block that holds one of the k
  best scores has a maximum at least as high (and, tied, a lower index) as the k-th best, so it
  is among the k best blocks. The beam step's top K of K * V scores then reads every score once
  and searches K blocks instead of partially sorting every row (`benchmarks.top_k`)."""
  b, n = scores.shape
  block = top_k_block(n, block)
  blocks = -(-n // block)
  if blocks <= k:
    return jax.lax.top_k(scores, k)
  # Padding ranks last: -inf, at the highest indices.
  padded = jnp.pad(scores, ((0, 0), (0, blocks * block - n)), constant_values=NEG_INF)
  padded = padded.reshape(b, blocks, block)
  _, best_blocks = jax.lax.top_k(jnp.max(padded, axis=-1), k)  # [b, k]
  # In index order, so that ties among the candidates still go to the lower index.
  best_blocks = jnp.sort(best_blocks, axis=-1)
  candidates = jnp.take_along_axis(padded, best_blocks[:, :, None], axis=1).reshape(b, -1)
  values, at = jax.lax.top_k(candidates, k)
  indices = jnp.take_along_axis(best_blocks, at // block, axis=1) * block + at % block
  return values, indices


def length_penalty(length: jax.Array | int, alpha: float) -> jax.Array:
  """GNMT length penalty lp(length) = ((5 + length) / 6) ** alpha (Wu et al., 2016).

  Args:
    length: number of generated tokens including the EOS, any shape.
    alpha: strength; 0 disables the penalty (lp = 1).

  Returns:
    float32 array of the shape of `length`.
  """
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def length_penalties(max_len: int, alpha: float) -> jax.Array:
  """`length_penalty` of every length 0 .. max_len, float32 [max_len + 1]: the searches index
  this table, computed over the same shape whatever the batch, so a sentence's penalties are
  the same numbers in a batch of any size or with its own step (`inflight`), where a power
  computed over arrays of other shapes may round otherwise."""
  return length_penalty(jnp.arange(max_len + 1), alpha)


def flatten_beams(x: jax.Array) -> jax.Array:
  """Merges the batch and beam axes: [B, K, ...] -> [B * K, ...] (row b * K + k)."""
  return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def unflatten_beams(x: jax.Array, batch_size: int) -> jax.Array:
  """Splits the leading axis: [B * K, ...] -> [B, K, ...]; inverse of `flatten_beams`."""
  return x.reshape((batch_size, x.shape[0] // batch_size) + x.shape[1:])


def tile_beams(tree: PyTree, beam_size: int, once: PyTree | None = None) -> PyTree:
  """Repeats every batch row `beam_size` times: leaves [B, ...] -> [B * K, ...].

  Scalar leaves are returned unchanged, and so are the leaves that `once` (bools with the
  structure of `tree`, if given) marks True. Use it also for anything `tokens_to_logits` closes
  over that has a batch axis (encoder outputs, source padding masks) before beam search.
  """

  def tile(x, keep=False):
    x = jnp.asarray(x)
    return x if x.ndim == 0 or keep else jnp.repeat(x, beam_size, axis=0)

  if once is None:
    return jax.tree.map(tile, tree)
  return jax.tree.map(lambda keep, x: tile(x, keep), once, tree)


def gather_beams(tree: PyTree, beam_indices: jax.Array, reorder: PyTree | None = None) -> PyTree:
  """Selects beams per sentence in a flattened PyTree.

  Args:
    tree: leaves [B * K, ...] (row b * K + k), or scalars (returned unchanged).
    beam_indices: int32[B, K_new], indices into the K beams of each sentence.
    reorder: None (every leaf), or bools with the structure of `tree`: False leaves are
      returned unchanged (valid only for leaves equal across the beams of each sentence, and
      with K_new = K).

  Returns:
    The tree with leaves [B * K_new, ...]; new row (b, j) is old row (b, beam_indices[b, j]).
  """
  batch_size = beam_indices.shape[0]

  def gather(x):
    if x.ndim == 0:
      return x
    beam_size = x.shape[0] // batch_size
    rows = jnp.arange(batch_size)[:, None] * beam_size + beam_indices
    # In bounds by construction: no bounds checks or fill values in the per-step copy.
    return x.at[rows.reshape(-1)].get(mode="promise_in_bounds")

  if reorder is None:
    return jax.tree.map(gather, tree)
  return jax.tree.map(lambda r, x: gather(x) if r else x, reorder, tree)


def take_sentences(tree: PyTree, keep: jax.Array, batch_size: int) -> PyTree:
  """Sentences `keep` int32[B'] of a batch of B = `batch_size`: every leaf [B * g, ...] (g rows
  per sentence: 1, or the K beams) becomes [B' * g, ...]; scalar leaves are kept."""

  def take(x):
    if x.ndim == 0:
      return x
    group = x.shape[0] // batch_size
    x = x.reshape((batch_size, group) + x.shape[1:])[keep]
    return x.reshape((keep.shape[0] * group,) + x.shape[2:])

  return jax.tree.map(take, tree)


def shrinking_stages(batch_size: int, multiple: int = 1, factor: int = 4,
                     count: int = 1) -> tuple[int, ...]:
  """`stages` for a batch of `batch_size` sentences: up to `count` sizes, each 1/`factor` of
  the one before, kept while they are multiples of `multiple` (the data-parallel size, so
  every device keeps its share of rows)."""
  out = []
  size = batch_size
  for _ in range(count):
    size //= factor
    if size < multiple or size % multiple:
      break
    out.append(size)
  return tuple(out)


def _staged_loop(cond: Callable[[PyTree, int], jax.Array], body: Callable[[PyTree], PyTree],
                 state: PyTree, finalize: Callable[[PyTree], PyTree], stopped: str,
                 stages: tuple[int, ...]) -> PyTree:
  """`while_loop(cond, body, state)` over a batch that shrinks by `stages` (see the module
  docstring); returns `finalize(state)` for the whole batch, each sentence's from the stage
  where it stopped. `cond(state, m)` says whether the loop goes on while more than m sentences
  are still searching; `state[stopped]` bool [b] marks the stopped ones; `state["step"]` is a
  scalar, every other leaf is sentence-leading."""
  batch_size = state[stopped].shape[0]
  sizes = (batch_size, *stages)
  if any(not 0 < b < a for a, b in zip(sizes, sizes[1:], strict=False)):
    raise ValueError(f"stages must decrease within (0, {batch_size}), got {stages}")
  results, where = None, None
  for m in (*stages, 0):
    state = jax.lax.while_loop(lambda s, m=m: cond(s, m), body, state)
    out = finalize(state)
    results = out if where is None else jax.tree.map(
      lambda r, o, where=where: r.at[where].set(o), results, out)
    if m == 0:
      break
    # The sentences still searching first (argsort of False < True is stable), then stopped
    # ones to fill the stage: their results are frozen, so the same again.
    keep = jnp.argsort(state[stopped], stable=True)[:m]
    where = keep if where is None else where[keep]
    state = take_sentences(state, keep, state[stopped].shape[0])
  return results


def _effective_max_lengths(max_lengths: jax.Array, batch_size: int, max_len: int) -> jax.Array:
  max_lengths = jnp.asarray(max_lengths, jnp.int32)
  if max_lengths.shape != (batch_size,):
    raise ValueError(f"max_lengths has shape {max_lengths.shape}, expected ({batch_size},)")
  # Every sequence needs room for at least its EOS, and no more than the output buffer.
  return jnp.clip(max_lengths, 1, max_len)


def greedy_decode(
  tokens_to_logits: TokensToLogits,
  cache: PyTree,
  *,
  batch_size: int,
  max_lengths: jax.Array,
  max_len: int,
  eos_id: int = 1,
  banned_id: int | None = None,
  normalize: bool = True,
  prefix: jax.Array | None = None,
  prefix_lengths: jax.Array | None = None,
  stages: tuple[int, ...] = (),
) -> tuple[jax.Array, jax.Array]:
  """Greedy (argmax) decoding with an incremental cache.

  Args:
    tokens_to_logits: ids int32[B, 1], cache -> (logits float32[B, V], new cache).
    cache: the decoder cache for batch size B (batch-leading leaves, scalars kept).
    batch_size: B.
    max_lengths: int32[B], the longest allowed output of each sentence (EOS included);
      clipped to [1, max_len]. EOS is forced at step max_lengths[b] - 1.
    max_len: static size of the output buffer.
    eos_id: the EOS token id.
    banned_id: a token id never chosen, or None.
    normalize, prefix, prefix_lengths, stages: see the module docstring.

  Returns:
    sequences: int32[B, max_len]; each row ends with EOS (at index <= max_lengths[b] - 1) and
      is 0 after it. The loop stops as soon as every row has produced its EOS.
    log_probs: float32[B], the sum of the chosen tokens' log probabilities (EOS included).
  """
  return _decode_loop(tokens_to_logits, cache,
                      lambda logits, step, rngs: jnp.argmax(logits, -1),
                      batch_size=batch_size, max_lengths=max_lengths, max_len=max_len,
                      eos_id=eos_id, banned_id=banned_id, normalize=normalize, prefix=prefix,
                      prefix_lengths=prefix_lengths, stages=stages)


def _decode_loop(tokens_to_logits: TokensToLogits, cache: PyTree,
                 choose: Callable[[jax.Array, jax.Array, PyTree], jax.Array], *, batch_size: int,
                 max_lengths: jax.Array, max_len: int, eos_id: int,
                 banned_id: int | None = None, normalize: bool = True,
                 prefix: jax.Array | None = None, prefix_lengths: jax.Array | None = None,
                 rngs: jax.Array | None = None, stages: tuple[int, ...] = ()
                 ) -> tuple[jax.Array, jax.Array]:
  """One token per row and step, `choose(logits [B, V], step, rngs [B] or None) -> int [B]`
  (`banned_id`'s logit set to -inf first), EOS forced at the row's length limit; returns the
  sequences [B, max_len] and their log probabilities [B] (under the model's unrestricted
  logits)."""
  # What a row needs besides its cache: cut with the batch when it shrinks (`stages`).
  rows = {"max_lengths": _effective_max_lengths(max_lengths, batch_size, max_len),
          "prefix": prefix, "prefix_lengths": prefix_lengths, "rngs": rngs}

  def cond(state, running):
    return (state["step"] < max_len) & (jnp.sum(~state["finished"]) > running)

  def body(state):
    step, finished, row = state["step"], state["finished"], state["rows"]
    logits, cache = tokens_to_logits(state["last"][:, None], state["cache"])
    logits = logits.astype(jnp.float32)
    allowed = logits if banned_id is None else logits.at[:, banned_id].set(NEG_INF)
    token = choose(allowed, step, row["rngs"]).astype(jnp.int32)
    if prefix is not None:
      forced = row["prefix"][:, jnp.minimum(step, prefix.shape[1] - 1)]
      token = jnp.where(step < row["prefix_lengths"], forced, token)
    token = jnp.where(step + 1 >= row["max_lengths"], eos_id, token)
    # Rows already finished emit padding; their model outputs are ignored.
    token = jnp.where(finished, 0, token)
    log_probs = jax.nn.log_softmax(logits, axis=-1) if normalize else logits
    chosen = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
    return {"step": step + 1,
            "seqs": jax.lax.dynamic_update_slice(state["seqs"], token[:, None], (0, step)),
            "last": token, "finished": finished | (token == eos_id),
            "total": state["total"] + jnp.where(finished, 0.0, chosen), "cache": cache,
            "rows": row}

  state = {
    "step": jnp.array(0, jnp.int32),
    "seqs": jnp.zeros((batch_size, max_len), jnp.int32),
    "last": jnp.zeros((batch_size,), jnp.int32),
    "finished": jnp.zeros((batch_size,), bool),
    "total": jnp.zeros((batch_size,), jnp.float32),
    "cache": cache,
    "rows": rows,
  }
  return _staged_loop(cond, body, state, lambda s: (s["seqs"], s["total"]), "finished",
                      stages)


def filter_logits(logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> tuple[jax.Array, jax.Array | None]:
  """The distribution sampling draws from: logits [B, V] / temperature, restricted to the
  `top_k` most likely tokens (0: all), then to the smallest set of them whose probability
  reaches `top_p` (1.0: all; "nucleus sampling", Holtzman et al. 2020).

  Returns (logits', ids): with a restriction, logits' [B, k] are the kept tokens' logits in
  descending order (-inf where top_p cut them) and ids int32 [B, k] their token ids; without
  one, logits' [B, V] and None. The most likely token is always kept.
  """
  logits = logits.astype(jnp.float32) / temperature
  vocab = logits.shape[-1]
  if top_k in (0, vocab) and top_p >= 1.0:
    return logits, None
  values, ids = top_k_by_blocks(logits, top_k if 0 < top_k < vocab else vocab)
  if top_p < 1.0:
    probs = jax.nn.softmax(values, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # probability of the more likely tokens
    values = jnp.where(before < top_p, values, NEG_INF)
  return values, ids.astype(jnp.int32)


def sample_decode(
  tokens_to_logits: TokensToLogits,
  cache: PyTree,
  *,
  rngs: jax.Array,
  batch_size: int,
  max_lengths: jax.Array,
  max_len: int,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  eos_id: int = 1,
  banned_id: int | None = None,
  normalize: bool = True,
  prefix: jax.Array | None = None,
  prefix_lengths: jax.Array | None = None,
  stages: tuple[int, ...] = (),
) -> tuple[jax.Array, jax.Array]:
  """Ancestral sampling with an incremental cache: each token is drawn from the model's
  distribution given the tokens before it (`filter_logits` shapes that distribution).

  Args:
    tokens_to_logits: ids int32[B, 1], cache -> (logits float32[B, V], new cache).
    cache: the decoder cache for batch size B.
    rngs: a key per row, [B]; row b's draw at step t uses fold_in(rngs[b], t), so a row's
      output depends on its key alone, not on the batch it is in.
    batch_size, max_lengths, max_len, eos_id, banned_id, normalize, prefix, prefix_lengths,
      stages: as for `greedy_decode`.
    temperature, top_k, top_p: see `filter_logits` (static).

  Returns:
    sequences int32[B, max_len] as `greedy_decode`'s, and log_probs float32[B]: the sum of the
    drawn tokens' log probabilities under the model (temperature 1, unrestricted).
  """

  def choose(logits, step, rngs):
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(rngs, step)
    values, ids = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    drawn = jax.vmap(jax.random.categorical)(keys, values)
    if ids is None:
      return drawn
    return jnp.take_along_axis(ids, drawn[:, None], axis=-1)[:, 0]

  return _decode_loop(tokens_to_logits, cache, choose, batch_size=batch_size,
                      max_lengths=max_lengths, max_len=max_len, eos_id=eos_id,
                      banned_id=banned_id, normalize=normalize, prefix=prefix,
                      prefix_lengths=prefix_lengths, rngs=rngs, stages=stages)


def beam_search(
  tokens_to_logits: TokensToLogits,
  cache: PyTree,
  *,
  batch_size: int,
  beam_size: int = 4,
  alpha: float = 0.6,
  max_lengths: jax.Array,
  max_len: int,
  eos_id: int = 1,
  reorder: PyTree | None = None,
  per_sentence: PyTree | None = None,
  num_hypotheses: int | None = None,
  banned_id: int | None = None,
  normalize: bool = True,
  prefix: jax.Array | None = None,
  prefix_lengths: jax.Array | None = None,
  stages: tuple[int, ...] = (),
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Beam search with the GNMT length penalty and an incremental cache.

  Per sentence the search holds up to K = `beam_size` live hypotheses (ranked by log
  probability) and the K best finished ones (ranked by score = log_prob / lp(length), with
  `length_penalty`). At every step all K * V one-token extensions of the live hypotheses are
  ranked by log probability and the top K form the new beam: those ending in EOS are moved to
  the finished set, the others stay live. With K = 1 this is exactly greedy decoding (the top
  extension is the argmax; once it is EOS nothing is left live). With K at least the number
  of extensions at every step, the search is exhaustive.

  A sentence stops (its results are frozen) once no live hypothesis can beat the n-th best
  of its finished ones (n = `num_hypotheses`, default K): log probs are <= 0 and, for
  alpha >= 0, lp grows with length, so a live hypothesis can at best reach
  live_log_prob / lp(max_lengths[b]). The n best hypotheses are then final, so asking for
  fewer than K (one, for plain translation) stops sooner and returns the same n best; the
  remaining slots hold what was found by then. The loop ends when
  every sentence has stopped, at the latest after max_len steps. EOS is forced at step
  max_lengths[b] - 1. The cache is tiled to B * K rows and reordered by the chosen beams
  every step (except the leaves that `reorder` marks False).

  Args:
    tokens_to_logits: ids int32[B * K, 1], cache -> (logits float32[B * K, V], new cache).
      Anything it closes over with a batch axis must already be tiled (`tile_beams`).
    cache: the decoder cache for batch size B (it is tiled here); scalar leaves are kept.
    batch_size: B.
    beam_size: K.
    alpha: length-penalty strength, >= 0 (0.6 in the paper's setup).
    max_lengths: int32[B], longest allowed output per sentence (EOS included); clipped to
      [1, max_len].
    max_len: static size of the output buffer.
    eos_id: the EOS token id.
    num_hypotheses: n in [1, K], how many of the best hypotheses must be final when a sentence
      stops (None: K).
    reorder: None, or bools with the structure of `cache`: False marks leaves that are tiled
      but never reordered, which saves a copy of them per step (`gather_beams`): leaves equal
      for all beams of a sentence (e.g. cached encoder-side keys and values), or leaves that
      each row keeps in place and `tokens_to_logits` addresses through a beam-ancestry leaf
      that is reordered (the Transformer's self-attention caches with `kv_owner`,
      `translate.init_cache` with beams and `translate.beam_reorder_mask`).
    per_sentence: None, or bools with the structure of `cache`: True marks leaves [B, ...] kept
      once per sentence, neither tiled nor reordered, which `tokens_to_logits` reads for the K
      rows of their sentence (the Transformer's encoder-side keys and values,
      `model._cross_attention_step`, and the encoder outputs).
    banned_id: a token id no hypothesis contains, or None.
    normalize, prefix, prefix_lengths: see the module docstring (prefix rows per sentence,
      [B, P] and [B]: every beam of a sentence starts with its prefix).
    stages: see the module docstring (counts of sentences, each with its K beams).

  Returns:
    sequences: int32[B, K, max_len], best first, 0 after the EOS.
    scores: float32[B, K], log_prob / lp(length), descending. A sentence that finished no
      hypothesis falls back to its live ones (scored log_prob / lp(steps run)). Slots with no
      hypothesis (fewer than K exist) have score -inf and an all-zero sequence.
    log_probs: float32[B, K], each hypothesis's log_prob: the sum of its tokens' log
      probabilities, EOS included (-inf for empty slots).
  """
  k = beam_size
  n = kept_hypotheses(beam_size, num_hypotheses, alpha)
  max_lengths = _effective_max_lengths(max_lengths, batch_size, max_len)
  # What a sentence needs besides its cache: cut with the batch when it shrinks (`stages`).
  penalties = length_penalties(max_len, alpha)
  rows = {"max_lengths": max_lengths, "best_possible_lp": penalties[max_lengths],
          "prefix": prefix, "prefix_lengths": prefix_lengths}

  def cond(state, running):
    return (state["step"] < max_len) & (jnp.sum(~state["done"]) > running)

  def body(state):
    logits, cache = tokens_to_logits(flatten_beams(state["live_last"])[:, None], state["cache"])
    new_state = extend_beams(state, logits, state["step"], penalties, k=k, n=n, eos_id=eos_id,
                             banned_id=banned_id, normalize=normalize)
    new_state["cache"] = gather_beams(cache, new_state.pop("parent"), reorder)
    return new_state

  def finalize(state):
    return final_hypotheses(state, state["step"], penalties)

  reorder = beam_reorder(cache, reorder, per_sentence)
  state = {
    "step": jnp.array(0, jnp.int32),
    **initial_hypotheses(batch_size, k, max_len),
    "done": jnp.zeros((batch_size,), bool),
    "cache": tile_beams(cache, k, per_sentence),
    "rows": rows,
  }
  sequences, scores, log_probs = _staged_loop(cond, body, state, finalize, "done", stages)
  return sequences, scores, log_probs


def kept_hypotheses(beam_size: int, num_hypotheses: int | None, alpha: float) -> int:
  """n, the hypotheses that must be final when a sentence stops (`beam_search`'s
  `num_hypotheses`, None: K); ValueError for n outside [1, K] or alpha < 0."""
  if alpha < 0:
    raise ValueError(f"alpha must be >= 0 for the early-stopping bound, got {alpha}")
  n = beam_size if num_hypotheses is None else num_hypotheses
  if not 1 <= n <= beam_size:
    raise ValueError(f"num_hypotheses must be in [1, beam_size={beam_size}], got "
                     f"{num_hypotheses}")
  return n


def beam_reorder(cache: PyTree, reorder: PyTree | None, per_sentence: PyTree | None) -> PyTree:
  """`beam_search`'s `reorder` with the `per_sentence` leaves (never tiled) left out too."""
  if per_sentence is None:
    return reorder
  return jax.tree.map(lambda once, r: r and not once, per_sentence,
                      jax.tree.map(lambda _: True, cache) if reorder is None else reorder)


# A sentence's hypotheses in a beam search's state (`extend_beams`).
HYPOTHESES = ("live_seqs", "live_log_probs", "live_last", "fin_seqs", "fin_scores",
              "fin_log_probs")


def initial_hypotheses(sentences: int, k: int, max_len: int) -> dict[str, jax.Array]:
  """The `HYPOTHESES` of `sentences` sentences before their first step. Only beam 0 is live,
  so the K identical initial beams do not yield K copies of each extension."""
  return {
    "live_seqs": jnp.zeros((sentences, k, max_len), jnp.int32),
    "live_log_probs": jnp.full((sentences, k), NEG_INF, jnp.float32).at[:, 0].set(0.0),
    "live_last": jnp.zeros((sentences, k), jnp.int32),
    "fin_seqs": jnp.zeros((sentences, k, max_len), jnp.int32),
    "fin_scores": jnp.full((sentences, k), NEG_INF, jnp.float32),
    "fin_log_probs": jnp.full((sentences, k), NEG_INF, jnp.float32),
  }


def extend_beams(state: PyTree, logits: jax.Array, step: jax.Array, penalties: jax.Array, *,
                 k: int, n: int, eos_id: int, banned_id: int | None = None,
                 normalize: bool = True) -> PyTree:
  """One step of `beam_search` for every sentence of `state` (its entries: `live_seqs`,
  `live_log_probs`, `live_last`, `fin_seqs`, `fin_scores`, `fin_log_probs`, `done`, `rows`),
  given the step's logits [b * K, V]; `step` is the sentences' step, a scalar (all in
  lockstep) or int32 [b] (each its own: `inflight.beam_search_refilled`); `penalties` the
  search's `length_penalties`. Returns the new state
  with `step` + 1 and `parent` int32 [b, K], the beam each new hypothesis extends (the caller
  reorders its cache by it); a stopped sentence keeps its hypotheses."""
  done, row = state["done"], state["rows"]
  b = done.shape[0]
  per_sentence = jnp.ndim(step) == 1
  logits = logits.astype(jnp.float32)
  log_probs = jax.nn.log_softmax(logits, axis=-1) if normalize else logits
  log_probs = unflatten_beams(log_probs, b)  # [b, K, V]
  vocab = log_probs.shape[-1]
  if banned_id is not None:
    log_probs = jnp.where(jnp.arange(vocab) == banned_id, NEG_INF, log_probs)
  if row.get("prefix") is not None:
    width = row["prefix"].shape[1]
    at = jnp.broadcast_to(jnp.minimum(step, width - 1), (b,))
    forced = jnp.take_along_axis(row["prefix"], at[:, None], axis=1)[:, :, None]  # [b, 1, 1]
    in_prefix = (step < row["prefix_lengths"])[:, None, None]  # [b, 1, 1]
    log_probs = jnp.where(in_prefix & (jnp.arange(vocab) != forced), NEG_INF, log_probs)
  forced = (step + 1 >= row["max_lengths"])[:, None, None]
  log_probs = jnp.where(forced & (jnp.arange(vocab) != eos_id), NEG_INF, log_probs)

  # The new beam: top K of all K * V extensions by total log prob.
  ext = state["live_log_probs"][:, :, None] + log_probs
  top_log_probs, top_flat = top_k_by_blocks(ext.reshape(b, k * vocab), k)
  parent = top_flat // vocab  # [b, K]
  token = (top_flat % vocab).astype(jnp.int32)
  seqs = jnp.take_along_axis(state["live_seqs"], parent[:, :, None], axis=1)
  if per_sentence:
    at_step = jnp.arange(seqs.shape[2])[None, None, :] == step[:, None, None]
    seqs = jnp.where(at_step, token[:, :, None], seqs)
  else:
    seqs = jax.lax.dynamic_update_slice(seqs, token[:, :, None], (0, 0, step))
  is_eos = token == eos_id

  # Finished: merge the new EOS hypotheses into the K best; old ones win ties (come first).
  penalty = penalties[step + 1]
  penalty = penalty[:, None] if per_sentence else penalty
  new_scores = jnp.where(is_eos, top_log_probs / penalty, NEG_INF)
  all_scores = jnp.concatenate([state["fin_scores"], new_scores], axis=1)
  all_seqs = jnp.concatenate([state["fin_seqs"], seqs], axis=1)
  fin_scores, fin_idx = jax.lax.top_k(all_scores, k)
  fin_seqs = jnp.take_along_axis(all_seqs, fin_idx[:, :, None], axis=1)
  all_log_probs = jnp.concatenate(
    [state["fin_log_probs"], jnp.where(is_eos, top_log_probs, NEG_INF)], axis=1)
  fin_log_probs = jnp.take_along_axis(all_log_probs, fin_idx, axis=1)

  # Live: the non-EOS members of the beam; EOS slots become empty (-inf).
  live_log_probs = jnp.where(is_eos, NEG_INF, top_log_probs)

  # Stopped sentences keep their results, so they do not depend on the rest of the batch.
  keep = done[:, None]
  new_state = {
    "step": step + 1,
    "live_seqs": jnp.where(keep[:, :, None], state["live_seqs"], seqs),
    "live_log_probs": jnp.where(keep, state["live_log_probs"], live_log_probs),
    "live_last": jnp.where(keep, state["live_last"], token),
    "fin_seqs": jnp.where(keep[:, :, None], state["fin_seqs"], fin_seqs),
    "fin_scores": jnp.where(keep, state["fin_scores"], fin_scores),
    "fin_log_probs": jnp.where(keep, state["fin_log_probs"], fin_log_probs),
    "rows": row,
    "parent": parent,
  }
  best_live = jnp.max(new_state["live_log_probs"], axis=1) / row["best_possible_lp"]
  # fin_scores is sorted (top_k): its n-th entry is -inf until n have finished.
  nth_finished = new_state["fin_scores"][:, n - 1]
  new_state["done"] = done | (best_live <= nth_finished)
  return new_state


def final_hypotheses(state: PyTree, steps: jax.Array, penalties: jax.Array
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`beam_search`'s outputs (sequences, scores, log_probs) of every sentence of `state`
  (`extend_beams`'), after `steps` (scalar or int32 [b]) steps; `penalties` as there."""
  any_finished = jnp.any(state["fin_scores"] > NEG_INF, axis=1)[:, None]
  penalty = penalties[steps]
  penalty = penalty[:, None] if jnp.ndim(steps) == 1 else penalty
  live_scores = state["live_log_probs"] / penalty
  sequences = jnp.where(any_finished[:, :, None], state["fin_seqs"], state["live_seqs"])
  scores = jnp.where(any_finished, state["fin_scores"], live_scores)
  log_probs = jnp.where(any_finished, state["fin_log_probs"], state["live_log_probs"])
  sequences = jnp.where((scores > NEG_INF)[:, :, None], sequences, 0)
  return sequences, scores, log_probs
