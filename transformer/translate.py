"""Translation with a trained Transformer: encode once, then beam search (or greedy) over the
decoder's KV cache, one token per step. Also the text-level helpers used by evaluation and the
translate mode.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer import bleu as bleu_lib
from transformer import decode as decode_lib
from transformer import sharding as sharding_lib
from transformer import storage
from transformer.model import ModelConfig
from transformer.model_family import build_model

Array = jax.Array


def init_cache(model_config: ModelConfig, batch: int, src_len: int, max_len: int,
               beam_size: int = 1) -> Any:
  """A zero cache for `batch` rows and outputs of up to `max_len` tokens (no FLOPs spent).

  With beam_size K > 1 (the cache of a beam search over `batch` sentences, which tiles it to
  batch * K rows) every self-attention cache also gets `kv_owner` bool [batch, K, max_len]:
  the beams keep their keys and values in place and beam search reorders only kv_owner
  (`model.MultiHeadAttention._update_cache`, `beam_reorder_mask`).
  """
  model = build_model(model_config, incremental=True)
  shapes = jax.eval_shape(
    lambda: model.init(
      jax.random.key(0), jnp.ones((batch, src_len), jnp.int32),
      jnp.ones((batch, max_len), jnp.int32),
    )["cache"]
  )
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  return _add_owners(cache, beam_size) if beam_size > 1 else cache


def _add_owners(tree: Any, beam_size: int) -> Any:
  if not isinstance(tree, dict):
    return tree
  out = {k: _add_owners(v, beam_size) for k, v in tree.items()}
  if "cached_key" in tree:
    shape = tree["cached_key"].shape  # [b, (layers,) h, max_len, k]
    out["kv_owner"] = jnp.zeros(shape[:-3] + (beam_size, shape[-2]), bool)
  return out


# Decoder cache entries that depend on the source only (model.MultiHeadAttention's
# encoder-side keys and values): the same for every beam of a sentence.
BEAM_INVARIANT_CACHE = ("cross_key", "cross_value", "cross_ready")
# Self-attention keys and values, kept in place by the beams when `kv_owner` is present.
IN_PLACE_CACHE = ("cached_key", "cached_value")


def beam_reorder_mask(cache: Any) -> Any:
  """Bools with the structure of a model cache: False for the leaves that beam search never
  reorders (`decode.beam_search`'s `reorder`): the `BEAM_INVARIANT_CACHE` ones, and the
  `IN_PLACE_CACHE` ones of a module that has a `kv_owner` entry (`init_cache` with beams)."""

  def mask(tree: Any, in_place: bool) -> Any:
    if not isinstance(tree, dict):
      return not in_place
    in_place = "kv_owner" in tree
    return {k: False if k in BEAM_INVARIANT_CACHE
            else mask(v, in_place and k in IN_PLACE_CACHE) for k, v in tree.items()}

  return mask(cache, False)


def _has_key(tree: Any, name: str) -> bool:
  return isinstance(tree, dict) and any(k == name or _has_key(v, name) for k, v in tree.items())


def _merge_cross(fresh: Any, stepped: Any) -> Any:
  """`fresh` with the encoder-side keys and values of `stepped` and no `cross_ready` flags."""
  if not isinstance(fresh, dict):
    return fresh
  out = {}
  for k, v in fresh.items():
    if k == "cross_ready":
      continue
    if k in ("cross_key", "cross_value"):
      out[k] = stepped[k]
    else:
      out[k] = _merge_cross(v, stepped[k]) if k in stepped else v
  return out


def _without(tree: Any, name: str) -> Any:
  if not isinstance(tree, dict):
    return tree
  return {k: _without(v, name) for k, v in tree.items() if k != name}


def prefill_cache(model_config: ModelConfig, params: Any, encoded: Array, inputs: Array,
                  cache: Any) -> Any:
  """A fresh cache (`init_cache`) with the encoder-side keys and values filled in.

  encoded [b, s, d], inputs int32 [b, s]. One decoder step on a dummy token projects them; its
  other cache updates are discarded. The `cross_ready` flags are dropped, which tells the
  model that the keys and values are ready, so the steps of the decoding loop read them with
  no conditional. Beam search then tiles them (projected once per sentence, not per beam). A
  cache without them (another model family) is returned unchanged.
  """
  if not _has_key(cache, "cross_ready"):
    return cache
  step_model = build_model(model_config, incremental=True)
  _, mutated = step_model.apply(
    # Without the beam groups: this step runs on the untiled batch.
    {"params": params, "cache": _without(cache, "kv_owner")}, encoded, inputs,
    jnp.zeros((inputs.shape[0], 1), jnp.int32), method=type(step_model).decode_logits,
    mutable=["cache"],
  )
  return _merge_cross(cache, mutated["cache"])


def output_kernel(model_config: ModelConfig, params: Any) -> Array | None:
  """The Transformer's tied pre-softmax weights as [d, V] (its embedding [V, d] transposed),
  made once before a decoding loop and passed to every step (`Transformer.decode_logits`):
  XLA:CPU multiplies the few rows of a step (the beams of one sentence) by this layout about
  twice as fast, and the loop cannot transpose it once itself (XLA folds a transpose into
  the product). None for a model without tied embeddings. Costs one copy of the embedding.
  """
  if model_config.kind != "transformer" or not model_config.share_embeddings:
    return None
  return jnp.transpose(nn.unbox(params)["embed"]["embedding"])


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
