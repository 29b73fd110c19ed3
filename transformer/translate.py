"""Translation with a trained Transformer: encode once, then beam search (or greedy) over the
decoder's KV cache, one token per step. Also the text-level helpers used by evaluation and the
translate mode.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer import bleu as bleu_lib
from transformer import decode as decode_lib
from transformer import model as model_lib
from transformer import sharding as sharding_lib
from transformer import storage
from transformer.model import ModelConfig
from transformer.model_family import build_model

Array = jax.Array


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


def output_kernel(model_config: ModelConfig, params: Any) -> Array | None:
  """None: the decoder multiplies by the tied embedding itself. Kept for callers written when
  the decoding loop passed the embedding transposed to `Transformer.decode_logits`."""
  del model_config, params
  return None


def decode_tokens(params: Any, inputs: Array, model_config: ModelConfig, *, beam_size: int,
                  alpha: float, max_extra_len: int, max_len: int,
                  logits_filter: Callable[[Array, Array], Array] | None = None) -> Array:
  """Translations of `inputs` int32 [b, s] (0-padded, EOS-terminated) -> int32 [b, max_len].

  beam_size 1 is greedy. The longest output of a sentence is its length + max_extra_len
  (section 6.1), capped at max_len. `logits_filter(logits [rows, V], step int [rows])`, if
  given, changes every step's logits (the decoding benchmark forces exact output lengths with
  it); its step counter travels with the cache, so beam search tiles and reorders it too.
  """
  model = build_model(model_config)
  step_model = build_model(model_config, incremental=True)
  batch = inputs.shape[0]
  encoded = model.apply({"params": params}, inputs, method=type(model).encode)
  src_lengths = jnp.sum(inputs > 0, axis=-1).astype(jnp.int32)
  max_lengths = jnp.minimum(src_lengths + max_extra_len, max_len)
  cache = init_cache(model_config, batch, inputs.shape[1], max_len, beam_size)
  cache = prefill_cache(model_config, params, encoded, inputs, cache)
  reorder = beam_reorder_mask(cache)
  if logits_filter is not None:
    cache, reorder = (cache, jnp.zeros((batch,), jnp.int32)), (reorder, True)
  if beam_size > 1:
    encoded, inputs = decode_lib.tile_beams((encoded, inputs), beam_size)
  kernel = output_kernel(model_config, params)
  step_kwargs = {} if kernel is None else {"output_kernel": kernel}

  def tokens_to_logits(ids, cache):
    model_cache, step = cache if logits_filter is not None else (cache, None)
    logits, mutated = step_model.apply(
      {"params": params, "cache": model_cache}, encoded, inputs, ids,
      method=type(step_model).decode_logits, mutable=["cache"], **step_kwargs,
    )
    if logits_filter is None:
      return logits[:, -1, :], mutated["cache"]
    return logits_filter(logits[:, -1, :], step), (mutated["cache"], step + 1)

  if beam_size == 1:
    return decode_lib.greedy_decode(tokens_to_logits, cache, batch_size=batch,
                                    max_lengths=max_lengths, max_len=max_len)
  seqs, _ = decode_lib.beam_search(tokens_to_logits, cache, batch_size=batch,
                                   beam_size=beam_size, alpha=alpha, max_lengths=max_lengths,
                                   max_len=max_len, reorder=reorder)
  return seqs[:, 0]


class Translator:
  """Jitted batched translation of token ids and of text, sharded over the mesh's batch axes."""

  def __init__(self, model_config: ModelConfig, decode_config: Any, mesh: Mesh,
               param_shardings: Any, bucket_lengths: Sequence[int] = ()):
    self.model_config = model_config
    self.mesh = mesh
    self.beam_size = int(decode_config.beam_size)
    self.alpha = float(decode_config.alpha)
    self.max_extra_len = int(decode_config.max_extra_len)
    self.batch_size = int(decode_config.batch_size)
    # Sources are padded to these lengths (the training buckets), so few shapes compile.
    self.bucket_lengths = sorted(bucket_lengths)
    self._param_shardings = param_shardings
    self._fns: dict[tuple[int, int], Any] = {}

  def _fn(self, src_len: int, max_len: int):
    key = (src_len, max_len)
    if key not in self._fns:
      fn = functools.partial(
        decode_tokens, model_config=self.model_config, beam_size=self.beam_size,
        alpha=self.alpha, max_extra_len=self.max_extra_len, max_len=max_len,
      )
      batch = sharding_lib.batch_sharding(self.mesh)
      self._fns[key] = jax.jit(fn, in_shardings=(self._param_shardings, batch),
                               out_shardings=NamedSharding(self.mesh, PartitionSpec()))
    return self._fns[key]

  def translate_ids(self, params: Any, sources: Sequence[Sequence[int]]) -> list[list[int]]:
    """Token-id sentences (EOS-terminated) -> output token ids (up to, excluding, EOS)."""
    results: list[list[int]] = [[] for _ in sources]
    if not sources:
      return results
    dp = sharding_lib.data_parallel_size(self.mesh)
    batch = max(dp, -(-self.batch_size // dp) * dp)
    max_src = self.model_config.max_len - self.max_extra_len
    # Sort by length so each batch pads little; a few padded lengths keep compiles few.
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    for start in range(0, len(order), batch):
      idx = order[start:start + batch]
      longest = max(len(sources[i]) for i in idx)
      src_len = min(self._pad_length(longest), max_src)
      arr = np.zeros((batch, src_len), np.int32)
      for row, i in enumerate(idx):
        ids = list(sources[i])[:src_len]
        if len(sources[i]) > src_len:
          ids[-1] = 1  # truncated: keep the EOS last
        arr[row, : len(ids)] = ids
      max_len = min(src_len + self.max_extra_len, self.model_config.max_len)
      # Every process holds the whole batch; each device takes its rows of it.
      sharding = sharding_lib.batch_sharding(self.mesh)
      global_arr = jax.make_array_from_callback(arr.shape, sharding, lambda idx, a=arr: a[idx])
      out = np.asarray(jax.device_get(self._fn(src_len, max_len)(params, global_arr)))
      for row, i in enumerate(idx):
        results[i] = _until_eos(out[row])
    return results


  def _pad_length(self, n: int) -> int:
    """The smallest bucket length >= n; beyond the buckets, the next power of two."""
    for length in self.bucket_lengths:
      if length >= n:
        return length
    size = 8
    while size < n:
      size *= 2
    return size


def _until_eos(ids: np.ndarray) -> list[int]:
  out = []
  for t in ids.tolist():
    if t in (0, 1):
      break
    out.append(t)
  return out


def bleu_on(translator: Translator, params: Any, tokenizer, pairs: list[tuple[str, str]],
            path: str | os.PathLike | None) -> tuple[bleu_lib.BleuResult, list[str]]:
  """Translates the sources of `pairs`, scores against the targets, writes the outputs."""
  src_ids = [tokenizer.encode(s) for s, _ in pairs]
  hyps = [tokenizer.decode(ids) for ids in translator.translate_ids(params, src_ids)]
  result = bleu_lib.corpus_bleu(hyps, [t for _, t in pairs])
  if path is not None and jax.process_index() == 0:
    storage.write_atomic(path, "".join(h + "\n" for h in hyps))
  return result, hyps
