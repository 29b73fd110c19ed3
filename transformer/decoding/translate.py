"""Translation with a trained Transformer: encode once, then beam search (or greedy) over the
decoder's KV cache, one token per step. Also the text-level helpers used by evaluation and the
translate mode.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer import compilation, storage
from transformer import sharding as sharding_lib
from transformer.data.tokenizer import EOS_ID, PAD_ID, truncate
from transformer.decoding import bleu as bleu_lib
from transformer.decoding import inflight
from transformer.decoding import mbr as mbr_lib
from transformer.decoding import search as decode_lib
from transformer.nn import model as model_lib
from transformer.nn.model import ModelConfig
from transformer.nn.model_family import build_model

Array = jax.Array


# In-flight batching (`Translator.pool_shape`): a pool holds up to this many batches of sources,
# and an eighth of a device's slots is refilled at once. Each pool ends with its slots draining
# (stopped slots step on until its last sentence stops), so pools are large: 64 batches, not 16,
# took 1.03x to 1.07x less time on the messages model (docs/decoding.md).
POOL_BATCHES = 64
REFILL_PART = 8


def queue_size(slots: int, refill: int, beams: int) -> int:
  """The sentences in-flight batching encodes and steps once at a time (`inflight`'s queue):
  a device's slots, rounded up to a multiple of `refill` and of `beams` (its first step reads
  the untiled cache as groups of K rows). The encoder over 32 sources instead of 4 took 0.72x
  the time per source, and a sentence's first step takes one row instead of K
  (docs/decoding.md); the queue's cache is a slot's untiled one, 1/K of the slots'
  self-attention caches."""
  multiple = math.lcm(refill, beams)
  return -(-slots // multiple) * multiple


def init_cache(model_config: ModelConfig, batch: int, src_len: int, max_len: int,
               beam_size: int = 1) -> Any:
  """A zero cache for `batch` rows and outputs of up to `max_len` tokens (no FLOPs spent).

  Its self-attention caches are kept in place (`model.IN_PLACE_CACHE`) by groups of
  `beam_size` rows: a beam search over `batch` sentences tiles the cache to batch * K rows,
  the beams of a sentence keep their keys and values where they computed them, and beam search
  reorders only the `model.KV_OWNER` tables (`beam_reorder_mask`). Fill the per-source entries
  with `prefill_cache` before the first step.
  """
  model = build_model(model_config, incremental=True)
  shapes = jax.eval_shape(
    lambda: model.init(
      jax.random.key(0), jnp.ones((batch, src_len), jnp.int32),
      jnp.ones((batch, max_len), jnp.int32),
    )["cache"]
  )
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  return _map_entries(cache, lambda name, x: _owner_groups(x, beam_size)
                      if name == model_lib.KV_OWNER else x)


def _map_entries(cache: Any, fn: Callable[[str, Any], Any]) -> Any:
  """`cache` with every entry x (a leaf, by its name in the collection) replaced by fn(name, x)."""
  return {k: _map_entries(v, fn) if isinstance(v, dict) else fn(k, v) for k, v in cache.items()}


def _owner_groups(owner: Array, beam_size: int) -> Array:
  """A zero KV_OWNER table [b, (layers,) K, L] for groups of K = beam_size rows."""
  return jnp.zeros(owner.shape[:-2] + (beam_size, owner.shape[-1]), owner.dtype)


def beam_reorder_mask(cache: Any) -> Any:
  """Bools with the structure of a model cache: False for the entries that beam search never
  reorders (`decode.beam_search`'s `reorder`): the per-source ones (`model.PER_SOURCE_CACHE`),
  and the in-place ones (`model.IN_PLACE_CACHE`) of a module whose rows form groups of K > 1
  (`init_cache` with beams)."""

  def mask(tree: Any) -> Any:
    owner = tree.get(model_lib.KV_OWNER)
    in_place = model_lib.IN_PLACE_CACHE if owner is not None and owner.shape[-2] > 1 else ()
    # An entry may hold several arrays (the LSTM baseline's (c, h) states): one bool for each.
    return {k: mask(v) if isinstance(v, dict) else jax.tree.map(
              lambda _, k=k: k not in model_lib.PER_SOURCE_CACHE and k not in in_place, v)
            for k, v in tree.items()}

  return mask(cache)


def per_source(cache: Any, model_config: ModelConfig) -> Any:
  """Bools with the structure of a model cache: True for the per-source entries
  (`model.PER_SOURCE_CACHE`) of a Transformer, which beam search keeps once per sentence
  (`search.beam_search`'s `per_sentence`); the LSTM baseline's cache has none."""
  transformer = model_config.kind == "transformer"
  return _map_entries(cache, lambda name, x: jax.tree.map(
    lambda _: transformer and name in model_lib.PER_SOURCE_CACHE, x))


def prefill_cache(model_config: ModelConfig, params: Any, encoded: Array, inputs: Array,
                  cache: Any) -> Any:
  """`cache` with the per-source entries filled in (`model.PER_SOURCE_CACHE`): the encoder-side
  keys and values, projected once per sentence before the decoding loop.

  encoded [b, s, d], inputs int32 [b, s], on the untiled batch (beam search then tiles them,
  so they are projected once per sentence, not per beam). One decoder call in
  `model.MODE_PREFILL` on the start token projects them and changes no other entry. A model
  without per-source entries (the LSTM baseline) gets its cache back unchanged.
  """
  if model_config.kind != "transformer":
    return cache
  step_model = build_model(model_config, incremental=True)
  _, mutated = step_model.apply(
    {"params": params, "cache": cache}, encoded, inputs,
    jnp.zeros((inputs.shape[0], 1), jnp.int32), method=type(step_model).decode_logits,
    mode=model_lib.MODE_PREFILL, mutable=["cache"],
  )
  return mutated["cache"]


METHODS = ("beam", "greedy", "sample", "mbr")


@dataclasses.dataclass(frozen=True)
class Search:
  """How hypotheses are found (`decode` in the config): the paper's beam search, greedy
  search, or sampling; static under jit."""

  method: str = "beam"
  beam_size: int = 4
  alpha: float = 0.6  # length penalty (GNMT); also normalises greedy and sampled scores
  max_extra_len: int = 50  # longest output = source length + this (section 6.1)
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  # Never choose the padding id (0): OPUS-MT models forbid it (Hugging Face's bad_words_ids).
  suppress_padding: bool = False
  # method 'mbr' (transformer/decoding/mbr.py): this many candidates from the sampler
  # ('sample' or 'beam'), ranked by their expected utility ('chrf' or 'bleu').
  mbr_candidates: int = 16
  mbr_sampler: str = "sample"
  mbr_utility: str = "chrf"

  @classmethod
  def from_config(cls, decode_config: Any) -> Search:
    """The search of a config's `decode` fields (absent ones, in older configs: defaults)."""
    fields = {f.name: decode_config.get(f.name, f.default) for f in dataclasses.fields(cls)}
    return cls(**fields)

  def max_hypotheses(self) -> int:
    """The most hypotheses per source this search can give (`--nbest`); 0: any number."""
    return {"beam": self.beam_size, "greedy": 1, "sample": 0,
            "mbr": self.mbr_candidates}[self.method]

  def beams(self) -> int:
    """K, the beams a sentence's cache is laid out for: `beam_size` for beam search, else 1."""
    return self.beam_size if self.method == "beam" else 1

  def candidate_search(self) -> Search:
    """The search that runs on the devices: MBR's sampler (its candidates), else this one."""
    if self.method != "mbr":
      return self
    return dataclasses.replace(self, method=self.mbr_sampler)


def members(params: Any, model_config: ModelConfig | tuple[ModelConfig, ...],
            weights: Sequence[float] | None = None
            ) -> tuple[tuple[Any, ...], tuple[ModelConfig, ...], tuple[float, ...]] | None:
  """An ensemble's (params, configs, weights), weights normalised to sum to 1; None for one
  model. An ensemble is a tuple of configs with a tuple of parameters (one per member)."""
  if not isinstance(model_config, tuple):
    return None
  weights = tuple(weights) if weights is not None else (1.0,) * len(model_config)
  if len(params) != len(model_config) or len(weights) != len(model_config):
    raise ValueError(f"an ensemble needs as many parameters and weights as members: "
                     f"{len(params)}, {len(weights)}, {len(model_config)}")
  total = float(sum(weights))
  return tuple(params), model_config, tuple(float(w) / total for w in weights)


def decode_hypotheses(params: Any, inputs: Array, model_config: ModelConfig | tuple,
                      search: Search, *, nbest: int = 1, max_len: int,
                      sentence_ids: Array | None = None,
                      logits_filter: Callable[[Array, Array], Array] | None = None,
                      weights: Sequence[float] | None = None, prefix: Array | None = None,
                      stages: tuple[int, ...] = ()) -> tuple[Array, Array, Array]:
  """The `nbest` hypotheses of each source in `inputs` int32 [b, s] (0-padded, EOS-terminated).

  Beam search keeps its `nbest` best (nbest <= beam_size); greedy search has one; sampling
  draws `nbest` samples per source, sample n of the source with id i from the key
  fold_in(fold_in(key(seed), i), n), so a source's samples depend on its id (`sentence_ids`
  int32 [b], default 0..b-1) and the seed only, not on the batch or the mesh.
  The longest output of a sentence is its length + max_extra_len, capped at max_len.
  `logits_filter(logits [rows, V], step int [rows])`, if given, changes every step's logits
  (the decoding benchmark forces exact output lengths with it); its step counter travels
  with the cache, so beam search tiles and reorders it too.

  An ensemble: `model_config` a tuple of the members' configs and `params` a tuple of their
  parameters (`members`). Each member encodes the source and keeps its own cache; at every step
  the search sees the members' log probabilities averaged with `weights` (default equal),
  sum_i w_i log p_i(y | x, y<t), for every search method.

  `prefix` int32 [b, P] (0-padded), if given, forces the first tokens of every hypothesis of
  each source (`search.beam_search`'s `prefix`); an all-zero row forces nothing.

  `stages` (sentence counts, of sources or, for sampling, of sources times `nbest`) shrink
  the batch as sentences stop (`search.beam_search`'s `stages`); the outputs are the same.

  Returns:
    sequences int32 [b, nbest, max_len] (0 after EOS), best first for beam search, in draw
    order for sampling; scores float32 [b, nbest], log_prob / lp(length) (the beam's score);
    log_probs float32 [b, nbest], the sum of the tokens' log probabilities, EOS included.
  """
  ensemble = members(params, model_config, weights)
  all_params, configs, member_weights = ensemble or ((params,), (model_config,), (1.0,))
  rows = nbest if search.method == "sample" else 1
  beams = search.beams()
  banned = PAD_ID if search.suppress_padding else None
  max_lengths = output_limits(inputs, search, max_len)
  prefix_lengths = None if prefix is None else jnp.sum(prefix > 0, axis=-1).astype(jnp.int32)
  cache, reorder, once = search_cache(all_params, configs, inputs, max_len, beams, rows)
  if rows > 1:
    max_lengths, prefix, prefix_lengths = decode_lib.tile_beams(
      (max_lengths, prefix, prefix_lengths), rows)
  batch = inputs.shape[0] * rows
  if logits_filter is not None:
    cache, reorder, once = (cache, jnp.zeros((batch,), jnp.int32)), (reorder, True), (once, False)
  tokens_to_logits = step_function(all_params, configs, member_weights if ensemble else None,
                                   logits_filter)

  options = dict(banned_id=banned, normalize=ensemble is None, prefix=prefix,
                 prefix_lengths=prefix_lengths, stages=stages)
  if search.method == "beam":
    seqs, scores, log_probs = decode_lib.beam_search(
      tokens_to_logits, cache, batch_size=batch, beam_size=beams, alpha=search.alpha,
      max_lengths=max_lengths, max_len=max_len, reorder=reorder, per_sentence=once,
      num_hypotheses=nbest, **options)
    return seqs[:, :nbest], scores[:, :nbest], log_probs[:, :nbest]
  if search.method == "greedy":
    seqs, log_probs = decode_lib.greedy_decode(tokens_to_logits, cache, batch_size=batch,
                                               max_lengths=max_lengths, max_len=max_len,
                                               **options)
  else:
    ids = jnp.arange(batch // rows) if sentence_ids is None else sentence_ids
    sources = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(search.seed), ids)
    keys = jax.vmap(lambda k: jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
      k, jnp.arange(rows)))(sources).reshape(-1)
    seqs, log_probs = decode_lib.sample_decode(
      tokens_to_logits, cache, rngs=keys, batch_size=batch, max_lengths=max_lengths,
      max_len=max_len, temperature=search.temperature, top_k=search.top_k, top_p=search.top_p,
      **options)
  scores = output_scores(seqs, log_probs, search.alpha, max_len)
  unflat = lambda x: decode_lib.unflatten_beams(x, batch // rows)
  return unflat(seqs), unflat(scores), unflat(log_probs)


def output_scores(seqs: Array, log_probs: Array, alpha: float, max_len: int) -> Array:
  """The score of greedy and sampled outputs `seqs` int32 [..., max_len] (0 after the EOS):
  `log_probs` [...] / lp(their length, EOS included)."""
  lengths = jnp.sum(seqs > 0, axis=-1)
  return log_probs / decode_lib.length_penalties(max_len, alpha)[lengths]


def output_limits(inputs: Array, search: Search, max_len: int) -> Array:
  """The longest output (EOS included) of each source of `inputs` int32 [b, s]: its length +
  `search.max_extra_len`, at most `max_len`."""
  src_lengths = jnp.sum(inputs > 0, axis=-1).astype(jnp.int32)
  return jnp.minimum(src_lengths + search.max_extra_len, max_len)


def search_cache(all_params: Sequence[Any], configs: Sequence[ModelConfig], inputs: Array,
                 max_len: int, beams: int, rows: int = 1) -> tuple[Any, Any, Any]:
  """The search's cache of `inputs` int32 [b, s] (each member encodes them and keeps its own
  cache, prefilled), for `beams` beams (`init_cache`) and `rows` rows per source (sampling's
  samples: the cache is tiled to b * rows); with beam search's `reorder` and `per_sentence`
  masks of it.

  Everything a step reads with a batch axis travels in the cache, which the search cuts when
  its batch shrinks (`stages`) and refills (`inflight`). The encoder outputs are the same for
  every beam of a sentence, so they are never reordered; a Transformer reads them, and its
  encoder-side keys and values, once per sentence for all its beams (`per_source`)."""
  caches, reorders, encodings = [], [], []
  for member_params, config in zip(all_params, configs, strict=True):
    model = build_model(config)
    encoded = model.apply({"params": member_params}, inputs, method=type(model).encode)
    member_inputs = inputs
    if rows > 1:
      encoded, member_inputs = decode_lib.tile_beams((encoded, inputs), rows)
    cache = init_cache(config, member_inputs.shape[0], inputs.shape[1], max_len, beams)
    cache = prefill_cache(config, member_params, encoded, member_inputs, cache)
    reorders.append(beam_reorder_mask(cache))
    caches.append(cache)
    encodings.append((encoded, member_inputs))
  cache = {"members": tuple(caches), "encoded": tuple(encodings)}
  reorder = {"members": tuple(reorders),
             "encoded": jax.tree.map(lambda _: False, tuple(encodings))}
  once = {"members": tuple(per_source(c, config) for c, config in zip(caches, configs,
                                                                      strict=True)),
          "encoded": tuple(jax.tree.map(lambda _, config=config: config.kind == "transformer",
                                        e) for e, config in zip(encodings, configs, strict=True))}
  return cache, reorder, once


def step_function(all_params: Sequence[Any], configs: Sequence[ModelConfig],
                  member_weights: Sequence[float] | None,
                  logits_filter: Callable[[Array, Array], Array] | None = None
                  ) -> decode_lib.TokensToLogits:
  """The search's `tokens_to_logits` over a `search_cache`: one model's logits, or an
  ensemble's (`member_weights` given) weighted average of its members' log probabilities;
  with `logits_filter`, the cache is (search cache, step counter)."""
  steps = [build_model(config, incremental=True) for config in configs]

  def member_logits(i, ids, cache):
    encoded, member_inputs = cache["encoded"][i]
    logits, mutated = steps[i].apply(
      {"params": all_params[i], "cache": cache["members"][i]}, encoded, member_inputs, ids,
      method=type(steps[i]).decode_logits, mutable=["cache"])
    return logits[:, -1, :], mutated["cache"]

  def tokens_to_logits(ids, cache):
    search_cache, step = cache if logits_filter is not None else (cache, None)
    outs = [member_logits(i, ids, search_cache) for i in range(len(steps))]
    if member_weights is None:
      logits = outs[0][0]
    else:
      # The members' weighted log probabilities: the search uses them as they are.
      logits = sum(w * jax.nn.log_softmax(out.astype(jnp.float32), axis=-1)
                   for w, (out, _) in zip(member_weights, outs, strict=True))
    search_cache = {"members": tuple(c for _, c in outs), "encoded": search_cache["encoded"]}
    if logits_filter is None:
      return logits, search_cache
    return logits_filter(logits, step), (search_cache, step + 1)

  return tokens_to_logits


def decode_pool(params: Any, pool: Array, num_sentences: Array,
                model_config: ModelConfig | tuple, search: Search, *, slots: int,
                refill: int, nbest: int = 1, max_len: int,
                weights: Sequence[float] | None = None) -> tuple[Array, Array, Array]:
  """`decode_hypotheses` of the first `num_sentences` (int32 scalar) sources of `pool` int32
  [P, s], searched `slots` sentences at a time, each stopped one's place taken by the pool's
  next sentence, `refill` at a time (in-flight batching: `inflight.beam_search_refilled`).
  Beam search and greedy search (one beam), of a Transformer or an ensemble of them; the
  outputs are `decode_hypotheses`' of each source: sequences int32 [P, nbest, max_len], scores
  and log_probs float32 [P, nbest] (empty past `num_sentences`). P must be a multiple of the
  queue (`queue_size`): the sources encoded and stepped once at a time."""
  ensemble = members(params, model_config, weights)
  all_params, configs, member_weights = ensemble or ((params,), (model_config,), (1.0,))
  if search.method not in ("beam", "greedy"):
    raise ValueError(f"in-flight batching searches with beam or greedy, not {search.method!r}")
  beams = search.beams()
  queue = queue_size(slots, refill, beams)
  if pool.shape[0] % queue:
    raise ValueError(f"the pool's {pool.shape[0]} sources are not a multiple of the queue's "
                     f"{queue}")
  cache, reorder, once = search_cache(all_params, configs, jnp.zeros((slots,) + pool.shape[1:],
                                                                     pool.dtype), max_len, beams)

  def fresh(start):
    sources = jax.lax.dynamic_slice_in_dim(pool, start, queue)
    new_cache, _, _ = search_cache(all_params, configs, sources, max_len, beams)
    return new_cache, output_limits(sources, search, max_len)

  seqs, scores, log_probs = inflight.beam_search_refilled(
    step_function(all_params, configs, member_weights if ensemble else None), cache, fresh,
    num_sentences=num_sentences, pool_size=pool.shape[0], refill=refill, queue=queue,
    beam_size=beams, alpha=search.alpha, max_len=max_len, reorder=reorder, per_sentence=once,
    num_hypotheses=nbest, banned_id=PAD_ID if search.suppress_padding else None,
    normalize=ensemble is None)
  seqs, scores, log_probs = seqs[:, :nbest], scores[:, :nbest], log_probs[:, :nbest]
  if search.method == "greedy":
    # Greedy search's score, as `decode_hypotheses` gives it: over the output's tokens.
    scores = jnp.where(scores > decode_lib.NEG_INF,
                       output_scores(seqs, log_probs, search.alpha, max_len), scores)
  return seqs, scores, log_probs


def decode_tokens(params: Any, inputs: Array, model_config: ModelConfig, *, beam_size: int,
                  alpha: float, max_extra_len: int, max_len: int,
                  logits_filter: Callable[[Array, Array], Array] | None = None) -> Array:
  """The best translation of each source of `inputs` int32 [b, s] -> int32 [b, max_len]:
  beam search, or greedy search for beam_size 1 (`decode_hypotheses`)."""
  search = Search(method="beam" if beam_size > 1 else "greedy", beam_size=beam_size,
                  alpha=alpha, max_extra_len=max_extra_len)
  return decode_hypotheses(params, inputs, model_config, search, max_len=max_len,
                           logits_filter=logits_filter)[0][:, 0]


def target_log_probs(params: Any, inputs: Array, targets: Array,
                     model_config: ModelConfig | tuple,
                     weights: Sequence[float] | None = None) -> Array:
  """log p(target | source) of each pair: the sum over the target's tokens (EOS included) of
  their natural-log probabilities under the model, teacher-forced. inputs int32 [b, s],
  targets int32 [b, t] (0-padded, EOS-terminated) -> float32 [b]. An ensemble (`members`)
  scores each token with its members' weighted average log probability, as it searches."""
  ensemble = members(params, model_config, weights)
  all_params, configs, member_weights = ensemble or ((params,), (model_config,), (1.0,))
  total = 0.0
  for member_params, config, w in zip(all_params, configs, member_weights, strict=True):
    model = build_model(config)
    logits = model.apply({"params": member_params}, inputs, targets)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    token = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    token_sum = jnp.sum(jnp.where(targets > 0, token, 0.0), axis=-1)
    total = token_sum if ensemble is None else total + w * token_sum
  return total


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One output of the search: token ids (up to, excluding, EOS), the search's length-
  normalised score, and the sum of the tokens' log probabilities (EOS included); an MBR
  search's hypotheses also carry their expected utility."""

  ids: list[int]
  score: float
  log_prob: float
  # MBR's expected utility against the other candidates (`mbr.expected_utilities`); else None.
  utility: float | None = None


class Translator:
  """Jitted batched translation and scoring of token ids, sharded over the mesh's batch axes.

  Sources are sorted by length and cut into batches of at most `decode.batch_size` sentences
  and `decode.tokens_per_batch` padded source tokens, padded to the bucket lengths (one
  compiled program per length), every process holding the whole batch and each device its
  rows of it.

  An ensemble translates as one model: `model_config` and `param_shardings` are tuples with an
  entry per member, the parameters passed to its methods a tuple too, and `weights` (default
  equal) weigh the members' log probabilities (`decode_hypotheses`).

  MBR (`decode.method='mbr'`) needs `detokenize` (token ids -> text, the tokenizer's
  `decode`): the candidates are compared as text.
  """

  def __init__(self, model_config: ModelConfig | tuple[ModelConfig, ...], decode_config: Any,
               mesh: Mesh, param_shardings: Any, bucket_lengths: Sequence[int] = (),
               weights: Sequence[float] | None = None,
               detokenize: Callable[[Sequence[int]], str] | None = None):
    self.model_config = model_config
    self.detokenize = detokenize
    self.weights = None if weights is None else tuple(float(w) for w in weights)
    configs = model_config if isinstance(model_config, tuple) else (model_config,)
    # The longest sequence every member can take.
    self.max_len = min(c.max_len for c in configs)
    self.mesh = mesh
    self.search = Search.from_config(decode_config)
    self.beam_size = self.search.beam_size
    self.max_extra_len = self.search.max_extra_len
    self.batch_size = int(decode_config.batch_size)
    self.in_flight = bool(decode_config.get("in_flight", True))
    self.tokens_per_batch = int(decode_config.get("tokens_per_batch", 0)) or None
    # Sources are padded to these lengths (the training buckets), so few shapes compile.
    self.bucket_lengths = sorted(bucket_lengths)
    self._param_shardings = param_shardings
    self._fns: dict[tuple, Any] = {}
    # Compiled programs, kept for later processes beside the persistent compilation cache.
    self._executables = compilation.Executables.beside_persistent_cache()

  def with_members(self, model_configs: Sequence[ModelConfig], param_shardings: Sequence[Any],
                   weights: Sequence[float] | None = None) -> Translator:
    """This translator's model and `model_configs` (with their parameters' shardings) as one
    ensemble, with this one's search and batching; its parameters are then the tuple of this
    model's and the members' (`weights`: one per model, this one first; default equal)."""
    configs = self.model_config if isinstance(self.model_config, tuple) else (self.model_config,)
    shardings = (self._param_shardings if isinstance(self.model_config, tuple)
                 else (self._param_shardings,))
    out = copy.copy(self)
    out.model_config = (*configs, *model_configs)
    out._param_shardings = (*shardings, *param_shardings)
    out.weights = None if not weights else tuple(float(w) for w in weights)
    out.max_len = min(c.max_len for c in out.model_config)
    out._fns = {}
    out._executables = compilation.Executables.beside_persistent_cache()
    return out

  def _run(self, key: tuple, jitted: Any, args: Sequence[Any]) -> Any:
    """`jitted(*args)` by its compiled program: from this process, from a former one
    (`compilation.Executables`), or compiled now."""
    parts = (key, self.model_config, self.search, self.weights)
    return self._executables.run("translator", parts, jitted, args)

  def stages(self, rows: int, nbest: int) -> tuple[int, ...]:
    """The sentence counts a batch of `rows` sources shrinks to as they stop
    (`search.shrinking_stages`): a quarter, and for greedy search and sampling a sixteenth
    too, each a multiple of the data-parallel size. A second stage paid for greedy search on
    the default model and not for beam search, whose K rows per sentence keep a quarter of the
    batch busy (docs/decoding.md, translating a file)."""
    method = self.search.candidate_search().method
    per_source = nbest if method == "sample" else 1
    return decode_lib.shrinking_stages(rows * per_source,
                                       sharding_lib.data_parallel_size(self.mesh),
                                       count=1 if method == "beam" else 2)

  def _searches_apart(self) -> bool:
    """Whether each device can search its rows of a batch alone: the batch is split and every
    device holds all the parameters (no tensor or fsdp split)."""
    shardings = jax.tree.leaves(self._param_shardings)
    return (sharding_lib.data_parallel_size(self.mesh) > 1
            and all(s.is_fully_replicated for s in shardings))

  def _decode_fn(self, nbest: int, src_len: int, max_len: int, prefixed: bool,
                 stages: tuple[int, ...]):
    key = ("decode", nbest, src_len, max_len, prefixed, stages)
    if key not in self._fns:
      batch = sharding_lib.batch_sharding(self.mesh)
      replicated = NamedSharding(self.mesh, PartitionSpec())
      apart = self._searches_apart()
      dp = sharding_lib.data_parallel_size(self.mesh)
      fn = functools.partial(decode_hypotheses, model_config=self.model_config,
                             search=self.search.candidate_search(), nbest=nbest,
                             max_len=max_len, weights=self.weights,
                             stages=tuple(s // dp for s in stages) if apart else stages)
      search = (lambda params, inputs, ids, prefix=None:
                fn(params, inputs, sentence_ids=ids, prefix=prefix))
      if apart:
        # Each device searches its rows as a batch of its own, its loop running until its
        # own sentences stop: a step exchanges nothing between devices (the loop's condition,
        # the top-k and the cache position would otherwise be agreed by all at every step),
        # and the outputs are the same, no row depending on another.
        rows = batch.spec
        search = jax.shard_map(search, mesh=self.mesh,
                               in_specs=(PartitionSpec(), rows, rows) + (rows,) * prefixed,
                               out_specs=rows, check_vma=False)
      in_shardings = (self._param_shardings, batch, batch) + (batch,) * prefixed
      self._fns[key] = jax.jit(search, in_shardings=in_shardings, out_shardings=replicated)
    return self._fns[key]

  def in_flight_search(self, prefixed: bool = False) -> bool:
    """Whether calls search with in-flight batching (`decode_pool`): `decode.in_flight`, for
    beam or greedy search (MBR's beam candidates too) of Transformers without forced prefixes,
    each device searching its rows apart (or one device)."""
    configs = self.model_config if isinstance(self.model_config, tuple) else (self.model_config,)
    return (self.in_flight and not prefixed
            and self.search.candidate_search().method in ("beam", "greedy")
            and all(c.kind == "transformer" for c in configs)
            and (self._searches_apart() or sharding_lib.data_parallel_size(self.mesh) == 1))

  def pool_shape(self, length: int, group: int) -> tuple[int, int, int]:
    """(slots, pool, refill) of in-flight batching for `group` sources padded to `length`:
    `rows_per_batch` slots (the power of two that holds a smaller group) of `pool_batch_size`
    sentences, a pool of up to `POOL_BATCHES` times as many sources (fewer for a smaller
    group), and an eighth of each device's slots refilled at once; global counts, each a
    multiple of the data-parallel size, the pool of each device's queue (`queue_size`)."""
    dp = sharding_lib.data_parallel_size(self.mesh)
    slots = self.rows_per_batch(length, group, self.pool_batch_size())
    per_device = slots // dp
    refill = max(1, per_device // REFILL_PART)
    batches = min(POOL_BATCHES, 1 << max(-(-group // slots) - 1, 0).bit_length())
    queue = queue_size(per_device, refill, self.search.candidate_search().beams())
    pool = -(-per_device * batches // queue) * queue
    return slots, pool * dp, refill

  def pool_batch_size(self) -> int:
    """The sentences of in-flight batching's slots: `decode.batch_size`, and for greedy search
    `decode.beam_size` times as many, the rows of a beam search's batch. A greedy step searches
    one row per sentence, and on 64 rows its products ran far below the matmul rate that a
    beam search's 256 rows reach (docs/decoding.md). A row's self-attention cache is a beam's;
    the encoder-side keys and values, kept once per sentence, are beam_size times a beam
    batch's."""
    if self.search.candidate_search().method == "greedy":
      return self.batch_size * max(1, self.beam_size)
    return self.batch_size

  def pools(self, lengths: Sequence[int]
            ) -> list[tuple[list[int], int, tuple[int, int, int] | None]]:
    """Indices of `lengths` grouped by padded length, shortest first, each group cut into
    pools of `pool_shape`'s size: [(indices, padded length, (slots, pool, refill))]. Every
    pool of a group, its partly filled last one too, has the group's shape, so that a length
    compiles one program. A pool lists its sources longest first: the slots take the longest
    sentences first and the last ones are short, so fewer slots wait for the pool's last
    sentences to stop. The shape is None for a group that fits one batch: its sources are
    searched in lockstep batches (no slot to refill)."""
    groups: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
      groups.setdefault(self.pad_length(lengths[i]), []).append(i)
    out = []
    for length, idx in groups.items():
      if len(idx) <= self.rows_per_batch(length, len(idx)):
        out.append((idx, length, None))
        continue
      shape = self.pool_shape(length, len(idx))
      out.extend((sorted(idx[start:start + shape[1]], key=lambda i: (-lengths[i], i)), length,
                  shape) for start in range(0, len(idx), shape[1]))
    return out

  def _pool_fn(self, nbest: int, src_len: int, max_len: int, slots: int, pool: int,
               refill: int):
    key = ("pool", nbest, src_len, max_len, slots, pool, refill)
    if key not in self._fns:
      batch = sharding_lib.batch_sharding(self.mesh)
      dp = sharding_lib.data_parallel_size(self.mesh)
      fn = functools.partial(decode_pool, model_config=self.model_config,
                             search=self.search.candidate_search(), slots=slots // dp,
                             refill=refill, nbest=nbest, max_len=max_len, weights=self.weights)
      search = lambda params, sources, counts: fn(params, sources, counts[0])  # noqa: E731
      if dp > 1:
        # Each device searches its pool apart (`_decode_fn`), with its own count.
        rows = batch.spec
        search = jax.shard_map(search, mesh=self.mesh, in_specs=(PartitionSpec(), rows, rows),
                               out_specs=rows, check_vma=False)
      self._fns[key] = jax.jit(search, in_shardings=(self._param_shardings, batch, batch),
                               out_shardings=NamedSharding(self.mesh, PartitionSpec()))
    return self._fns[key]

  def _score_fn(self, length: int):
    key = ("score", length)
    if key not in self._fns:
      fn = functools.partial(target_log_probs, model_config=self.model_config,
                             weights=self.weights)
      batch = sharding_lib.batch_sharding(self.mesh)
      self._fns[key] = jax.jit(fn, in_shardings=(self._param_shardings, batch, batch),
                               out_shardings=NamedSharding(self.mesh, PartitionSpec()))
    return self._fns[key]

  def rows_per_batch(self, length: int, sources: int | None = None,
                     batch_size: int | None = None) -> int:
    """The rows of a batch of sources padded to `length`: at most `batch_size` (default
    `decode.batch_size`), and at most `tokens_per_batch` padded tokens, rounded to the
    data-parallel size (at least one row per device). With `sources`, the number a call
    translates, a call of fewer takes the power of two that holds them: a sentence alone
    compiles and runs a program of one row, not a full batch's, and small calls share a few
    programs."""
    dp = sharding_lib.data_parallel_size(self.mesh)
    rows = batch_size or self.batch_size
    if self.tokens_per_batch is not None:
      rows = min(rows, self.tokens_per_batch // length)
    rows = max(dp, rows // dp * dp)
    if sources is not None:
      smallest = -(-(1 << max(sources - 1, 0).bit_length()) // dp) * dp
      rows = min(rows, smallest)
    return rows

  def batches(self, lengths: Sequence[int]) -> list[tuple[list[int], int]]:
    """Indices of `lengths` grouped into batches, shortest first: [(indices, padded length)]."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[tuple[list[int], int]] = []
    for i in order:
      length = self.pad_length(lengths[i])
      if out and out[-1][1] == length and len(out[-1][0]) < self.rows_per_batch(length):
        out[-1][0].append(i)
      elif out and len(out[-1][0]) < self.rows_per_batch(length):
        out[-1] = (out[-1][0] + [i], length)  # a longer source widens the batch it fits in
      else:
        out.append(([i], length))
    return out

  def _global(self, rows: np.ndarray):
    sharding = sharding_lib.batch_sharding(self.mesh)
    return jax.make_array_from_callback(rows.shape, sharding, lambda idx, a=rows: a[idx])

  def _padded(self, seqs: Sequence[Sequence[int]], rows: int, length: int) -> np.ndarray:
    arr = np.zeros((rows, length), np.int32)
    for row, ids in enumerate(seqs):
      ids = truncate(list(ids), length)
      arr[row, : len(ids)] = ids
    return arr

  def output_limit(self, source_length: int) -> int:
    """The longest output (EOS included) of a source of `source_length` tokens (EOS
    included): its length + `decode.max_extra_len`, within the model's `max_len`."""
    src_len = min(source_length, self.max_len - self.max_extra_len)
    return min(src_len + self.max_extra_len, self.max_len)

  def search_ids(self, params: Any, sources: Sequence[Sequence[int]], nbest: int = 1,
                 sentence_ids: Sequence[int] | None = None,
                 on_batch: Callable[[int], None] | None = None,
                 prefixes: Sequence[Sequence[int]] | None = None) -> list[list[Hypothesis]]:
    """The `nbest` hypotheses of each token-id source (EOS-terminated), best first (samples:
    in draw order). `sentence_ids` (default 0, 1, ...) key the samples of each source;
    `on_batch(n)` is called after each batch of n sources. `prefixes` (token ids without
    EOS, one per source; empty: none) force the start of every hypothesis of their source;
    each must be shorter than `output_limit` of its source (ValueError). MBR: the
    `decode.mbr_candidates` candidates ranked by expected utility, the `nbest` first."""
    if self.search.method == "mbr":
      return self._mbr(params, sources, nbest, sentence_ids, on_batch, prefixes)
    return self._search(params, sources, nbest, sentence_ids, on_batch, prefixes)

  def _search(self, params: Any, sources: Sequence[Sequence[int]], nbest: int,
              sentence_ids: Sequence[int] | None, on_batch: Callable[[int], None] | None,
              prefixes: Sequence[Sequence[int]] | None) -> list[list[Hypothesis]]:
    """`search_ids` on the devices, with `decode.method`'s search or MBR's sampler."""
    results: list[list[Hypothesis]] = [[] for _ in sources]
    if sentence_ids is None:
      sentence_ids = range(len(sources))
    if prefixes is not None:
      for i, (src, prefix) in enumerate(zip(sources, prefixes, strict=True)):
        if len(prefix) >= self.output_limit(len(src)):
          raise ValueError(f"prefix {i} has {len(prefix)} tokens: the output of its source is "
                           f"at most {self.output_limit(len(src))} tokens, EOS included")
    max_src = self.max_len - self.max_extra_len

    def dispatched() -> Iterator[tuple[list[tuple[int, int]], Any]]:
      """(source, output row) pairs and the outputs of each device call."""
      lengths = [len(s) for s in sources]
      if not self.in_flight_search(prefixes is not None):
        fits = self.batches(lengths)
      else:
        # Pools where a length has more sentences than a batch; the rest (small groups) in
        # lockstep batches as without pools: no slot to refill, fewer and simpler programs
        # to compile (a sentence alone, above all).
        pooled, rest = [], []
        for idx, length, shape in self.pools(lengths):
          if shape is None:
            rest.extend(idx)
          else:
            pooled.append((idx, length, shape))
        yield from self._dispatch_pools(params, sources, nbest, pooled)
        rest.sort()
        fits = [([rest[j] for j in idx], length)
                for idx, length in self.batches([lengths[i] for i in rest])]
      for idx, length in fits:
        src_len = min(length, max_src)
        rows = self.rows_per_batch(length, len(sources))
        arr = self._padded([sources[i] for i in idx], rows, src_len)
        ids = np.zeros((rows,), np.int32)
        ids[: len(idx)] = [sentence_ids[i] for i in idx]
        max_len = min(src_len + self.max_extra_len, self.max_len)
        args = [params, self._global(arr), self._global(ids)]
        if prefixes is not None:
          args.append(self._global(self._padded([prefixes[i] for i in idx], rows, max_len)))
        key = ("decode", nbest, src_len, max_len, prefixes is not None,
               self.stages(rows, nbest))
        placed = list(enumerate(idx))
        yield [(i, row) for row, i in placed], self._run(key, self._decode_fn(*key[1:]), args)

    for placed, out in read_one_behind(dispatched()):
      seqs, scores, log_probs = (np.asarray(x) for x in out)
      for i, row in placed:
        results[i] = [Hypothesis(_until_eos(seqs[row, n]), float(scores[row, n]),
                                 float(log_probs[row, n]))
                      for n in range(seqs.shape[1]) if scores[row, n] > -np.inf]
      if on_batch is not None:
        on_batch(len(placed))
    return results

  def _dispatch_pools(self, params: Any, sources: Sequence[Sequence[int]], nbest: int,
                      pools: Sequence[tuple[list[int], int, tuple[int, int, int]]]
                      ) -> Iterator[tuple[list[tuple[int, int]], Any]]:
    """`_search`'s device calls with in-flight batching (`decode_pool`) of `pools` (`pools`'
    groups of sources and their shapes): a pool's sources dealt to the devices in turn
    (source j of the pool to device j mod dp), so that every device's share has the same mix
    of lengths."""
    dp = sharding_lib.data_parallel_size(self.mesh)
    max_src = self.max_len - self.max_extra_len
    for idx, length, (slots, pool, refill) in pools:
      src_len = min(length, max_src)
      per_device = pool // dp
      rows = [(j % dp) * per_device + j // dp for j in range(len(idx))]
      arr = np.zeros((pool, src_len), np.int32)
      arr[rows] = self._padded([sources[i] for i in idx], len(idx), src_len)
      counts = np.bincount(np.arange(len(idx)) % dp, minlength=dp).astype(np.int32)
      max_len = min(src_len + self.max_extra_len, self.max_len)
      key = ("pool", nbest, src_len, max_len, slots, pool, refill)
      args = [params, self._global(arr), self._global(counts)]
      yield list(zip(idx, rows, strict=True)), self._run(key, self._pool_fn(*key[1:]), args)

  def _mbr(self, params: Any, sources: Sequence[Sequence[int]], nbest: int,
           sentence_ids: Sequence[int] | None, on_batch: Callable[[int], None] | None,
           prefixes: Sequence[Sequence[int]] | None) -> list[list[Hypothesis]]:
    """The candidates of MBR's sampler, ranked by expected utility (`mbr.rank`)."""
    if self.detokenize is None:
      raise ValueError("decode.method='mbr' compares candidates as text: the Translator needs "
                       "`detokenize`")
    found = self._search(params, sources, self.search.mbr_candidates, sentence_ids, on_batch,
                         prefixes)
    out = []
    for candidates in found:
      if len(candidates) < 2:
        out.append(candidates[:nbest])
        continue
      ranked = mbr_lib.rank([self.detokenize(h.ids) for h in candidates],
                            self.search.mbr_utility)
      out.append([dataclasses.replace(candidates[i], utility=u) for i, u in ranked[:nbest]])
    return out

  def translate_ids(self, params: Any, sources: Sequence[Sequence[int]]) -> list[list[int]]:
    """Token-id sentences (EOS-terminated) -> the best output's token ids (up to, excluding,
    EOS)."""
    return [hyps[0].ids if hyps else [] for hyps in self.search_ids(params, sources)]

  def score_ids(self, params: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                on_batch: Callable[[int], None] | None = None) -> list[float]:
    """log p(target | source) of each (source ids, target ids) pair (`target_log_probs`)."""
    results = [0.0] * len(pairs)

    def dispatched() -> Iterator[tuple[list[int], Any]]:
      for idx, length in self.batches([max(len(s), len(t)) for s, t in pairs]):
        length = min(length, self.max_len)
        rows = self.rows_per_batch(length, len(pairs))
        src = self._padded([pairs[i][0] for i in idx], rows, length)
        tgt = self._padded([pairs[i][1] for i in idx], rows, length)
        args = (params, self._global(src), self._global(tgt))
        yield idx, self._run(("score", length), self._score_fn(length), args)

    for idx, out in read_one_behind(dispatched()):
      values = np.asarray(out)
      for row, i in enumerate(idx):
        results[i] = float(values[row])
      if on_batch is not None:
        on_batch(len(idx))
    return results

  def pad_length(self, n: int) -> int:
    """The smallest bucket length >= n; beyond the buckets, the next power of two."""
    for length in self.bucket_lengths:
      if length >= n:
        return length
    size = 8
    while size < n:
      size *= 2
    return size


_Key = TypeVar("_Key")


def read_one_behind(dispatched: Iterable[tuple[_Key, Any]]) -> Iterator[tuple[_Key, Any]]:
  """Each (key, device output) of `dispatched`, read back to the host only after the next
  one is dispatched, so that the host prepares the next batch and reads out the last while
  the devices compute (JAX dispatches asynchronously)."""
  pending: tuple[_Key, Any] | None = None
  for item in dispatched:
    if pending is not None:
      yield pending[0], jax.device_get(pending[1])
    pending = item
  if pending is not None:
    yield pending[0], jax.device_get(pending[1])


def _until_eos(ids: np.ndarray) -> list[int]:
  out = []
  for t in ids.tolist():
    if t in (PAD_ID, EOS_ID):
      break
    out.append(t)
  return out


def translate_and_score(translator: Translator, params: Any, tokenizer,
                        pairs: list[tuple[str, str]], path: str | os.PathLike | None
                        ) -> tuple[dict[str, bleu_lib.CorpusScore], list[str]]:
  """Translates the sources of `pairs`, scores the outputs against the targets (BLEU, chrF,
  TER: `bleu.corpus_scores`) and writes them to `path` (if given), one line each."""
  src_ids = [tokenizer.encode(s) for s, _ in pairs]
  hyps = [tokenizer.decode(ids) for ids in translator.translate_ids(params, src_ids)]
  scores = bleu_lib.corpus_scores(hyps, [t for _, t in pairs])
  if path is not None and jax.process_index() == 0:
    storage.write_atomic(path, "".join(h + "\n" for h in hyps))
  return scores, hyps
