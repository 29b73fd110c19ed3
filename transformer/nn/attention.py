"""Scaled dot-product attention (Vaswani et al. 2017, section 3.2.1) as pure functions.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Layout everywhere: query [batch, q_len, heads, head_dim], key/value [batch, kv_len, heads,
head_dim] (the layout of `jax.nn.dot_product_attention`), so implementations are
interchangeable. Masks are boolean, True where attention is allowed, broadcastable to
[batch, heads, q_len, kv_len]. A query row with nothing to attend to yields zeros, never NaN.
Packed rows (several sequences per row) pass segment ids in factored form, per query
[batch, q_len] and per key [batch, kv_len]: a query attends only to keys of its own segment.
Logits and softmax are always computed in float32, whatever the input dtype.

Implementations (`implementation=`):
  xla      einsum + softmax, the reference; materialises the [b, h, q, k] weights.
  chunked  Rabe & Staats (2021), "Self-attention Does Not Need O(n^2) Memory": queries and keys
           in blocks, an online (running max) softmax, and rematerialisation, so the memory of
           a training step grows about linearly in the length when the mask is given in
           factored form (`kv_mask`, `is_causal`, segment ids) instead of as a full [q, k]
           array: segment ids are compared block by block.
  cudnn    `jax.nn.dot_product_attention(implementation='cudnn')`, the fused kernel, on GPU.
           Falls back to `xla` where cuDNN does not apply: attention dropout in training,
           a non-GPU backend, float32 inputs, or a head_dim that is not a multiple of 8 or
           is above 128. Segment ids become a dense [batch, 1, q, k] mask for the kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from transformer.nn import dropout as dropout_lib

IMPLEMENTATIONS = ("xla", "chunked", "cudnn")

# A large negative logit for masked positions; finite so that a fully masked row gives no NaN.
MASKED = -1e30

Array = jax.Array


def padding_mask(query_tokens: Array, key_tokens: Array) -> Array:
  """Mask from token ids, 0 being padding.

  Args:
    query_tokens: int [batch, q_len].
    key_tokens: int [batch, kv_len].
  Returns:
    bool [batch, 1, q_len, kv_len], True where neither token is padding.
  """
  q = query_tokens > 0
  k = key_tokens > 0
  return q[:, None, :, None] & k[:, None, None, :]


def causal_mask(q_len: int, kv_len: int | None = None, offset: int = 0) -> Array:
  """bool [1, 1, q_len, kv_len], True where key position <= query position + offset."""
  kv_len = q_len if kv_len is None else kv_len
  q_pos = jnp.arange(q_len)[:, None] + offset
  k_pos = jnp.arange(kv_len)[None, :]
  return (k_pos <= q_pos)[None, None]


def segment_mask(q_segment_ids: Array, kv_segment_ids: Array) -> Array:
  """bool [batch, 1, q_len, kv_len], True where query and key are in the same segment.

  Args:
    q_segment_ids: int [batch, q_len].
    kv_segment_ids: int [batch, kv_len].
  """
  return q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :]


def combine_masks(*masks: Array | None) -> Array | None:
  """Logical AND of the masks that are not None (None if all are None)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  return functools.reduce(jnp.logical_and, masks)


def dot_product_attention(
  query: Array,
  key: Array,
  value: Array,
  mask: Array | None = None,
  *,
  kv_mask: Array | None = None,
  is_causal: bool = False,
  q_segment_ids: Array | None = None,
  kv_segment_ids: Array | None = None,
  dropout_rate: float = 0.0,
  dropout_rng: Array | None = None,
  dropout_bits: int = 8,
  deterministic: bool = True,
  implementation: str = "xla",
  chunk_size: int = 128,
  precision: lax.PrecisionLike = None,
) -> Array:
  """softmax(Q K^T / sqrt(d_k)) V.

  Args:
    query: [batch, q_len, heads, head_dim].
    key: [batch, kv_len, heads, head_dim].
    value: [batch, kv_len, heads, head_dim_v].
    mask: optional bool, broadcastable to [batch, heads, q_len, kv_len], True = attend.
    kv_mask: optional bool [batch, kv_len], True for real (non-padding) keys. Equivalent to
      mask[:, None, None, :], but lets `chunked` avoid building a quadratic mask.
    is_causal: query i attends only to keys j <= i (+ kv_len - q_len, so that a suffix of
      queries over a longer cache also works).
    q_segment_ids: optional int [batch, q_len], the segment of each query (packed rows).
    kv_segment_ids: int [batch, kv_len], the segment of each key; given with q_segment_ids.
      Query i attends to key j only if q_segment_ids[:, i] == kv_segment_ids[:, j].
    dropout_rate: dropout on the attention weights (applied when not deterministic).
    dropout_rng: PRNG key for that dropout.
    dropout_bits: resolution of the dropout masks (`dropout.keep_mask`).
    deterministic: no dropout when True.
    implementation: one of IMPLEMENTATIONS.
    chunk_size: block size of `chunked` for queries and keys.
    precision: matmul precision.
  Returns:
    [batch, q_len, heads, head_dim_v] in the dtype of `query`.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"attention implementation {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}"
    )
  # Names its ops in profiles (measuring/step_cost.py), apart from the projections around it.
  with jax.named_scope("dot_product_attention"):
    return _attention(query, key, value, mask, kv_mask, is_causal, q_segment_ids,
                      kv_segment_ids, dropout_rate, dropout_rng, dropout_bits, deterministic,
                      implementation, chunk_size, precision)


def _attention(query, key, value, mask, kv_mask, is_causal, q_segment_ids, kv_segment_ids,
               dropout_rate, dropout_rng, dropout_bits, deterministic, implementation,
               chunk_size, precision):
  if (q_segment_ids is None) != (kv_segment_ids is None):
    raise ValueError("q_segment_ids and kv_segment_ids are given together or not at all")
  segments = None if q_segment_ids is None else (q_segment_ids, kv_segment_ids)
  use_dropout = dropout_rate > 0.0 and not deterministic
  if use_dropout and dropout_rng is None:
    raise ValueError("dropout_rng is required when dropout_rate > 0 and not deterministic")
  if implementation == "cudnn" and _cudnn_applies(query, use_dropout):
    return _cudnn_attention(query, key, value, mask, kv_mask, is_causal, segments)
  if implementation == "chunked":
    return _chunked_attention(
      query, key, value, mask, kv_mask, is_causal, segments, dropout_rate if use_dropout else 0.0,
      dropout_rng, dropout_bits, chunk_size, precision,
    )
  return _xla_attention(
    query, key, value, mask, kv_mask, is_causal, segments, dropout_rate if use_dropout else 0.0,
    dropout_rng, dropout_bits, precision,
  )


def _full_mask(mask, kv_mask, is_causal, segments, q_len, kv_len):
  return combine_masks(
    mask,
    None if kv_mask is None else kv_mask[:, None, None, :],
    causal_mask(q_len, kv_len, offset=kv_len - q_len) if is_causal else None,
    None if segments is None else segment_mask(*segments),
  )


def _xla_attention(query, key, value, mask, kv_mask, is_causal, segments, dropout_rate,
                   dropout_rng, dropout_bits, precision):
  q_len, kv_len = query.shape[1], key.shape[1]
  scale = query.shape[-1] ** -0.5
  logits = jnp.einsum(
    "bqhd,bkhd->bhqk", query, key, precision=precision, preferred_element_type=jnp.float32
  )
  logits = logits * scale
  mask = _full_mask(mask, kv_mask, is_causal, segments, q_len, kv_len)
  if mask is not None:
    logits = jnp.where(mask, logits, MASKED)
  weights = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    # A fully masked row would otherwise be uniform; make it attend to nothing.
    weights = jnp.where(mask, weights, 0.0)
  if dropout_rate > 0.0:
    weights = dropout_lib.apply(weights, dropout_rng, dropout_rate, dropout_bits)
  return jnp.einsum(
    "bhqk,bkhd->bqhd", weights.astype(value.dtype), value, precision=precision
  ).astype(query.dtype)


def _chunked_attention(query, key, value, mask, kv_mask, is_causal, segments, dropout_rate,
                       dropout_rng, dropout_bits, chunk_size, precision):
  """Blockwise attention with an online softmax; memory O(n * chunk) instead of O(n^2)."""
  batch, q_len, heads, _ = query.shape
  kv_len, dv = key.shape[1], value.shape[-1]
  qc = min(chunk_size, q_len)
  kc = min(chunk_size, kv_len)
  nq = -(-q_len // qc)
  nk = -(-kv_len // kc)
  q_pad, k_pad = nq * qc - q_len, nk * kc - kv_len
  scale = query.shape[-1] ** -0.5
  causal_offset = kv_len - q_len

  q = jnp.pad(query, ((0, 0), (0, q_pad), (0, 0), (0, 0)))
  k = jnp.pad(key, ((0, 0), (0, k_pad), (0, 0), (0, 0)))
  v = jnp.pad(value, ((0, 0), (0, k_pad), (0, 0), (0, 0)))
  valid_k = jnp.arange(nk * kc) < kv_len
  if kv_mask is not None:
    valid_k = valid_k[None, :] & jnp.pad(kv_mask, ((0, 0), (0, k_pad)))
  else:
    valid_k = jnp.broadcast_to(valid_k[None, :], (1, nk * kc))
  if mask is not None:
    # A general mask is quadratic already; broadcast it once and slice blocks of it.
    mask = jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], q_len, kv_len))
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, q_pad), (0, k_pad)))
  if segments is not None:
    # Factored: [b, q] and [b, k], compared per block, so no [q, k] array is ever built.
    q_seg = jnp.pad(segments[0], ((0, 0), (0, q_pad)))
    k_seg = jnp.pad(segments[1], ((0, 0), (0, k_pad)))

  def block_mask(qi, ki):
    """bool broadcastable to [batch, heads, qc, kc]."""
    kmask = lax.dynamic_slice_in_dim(valid_k, ki * kc, kc, axis=1)[:, None, None, :]
    if is_causal:
      q_pos = qi * qc + jnp.arange(qc)[:, None] + causal_offset
      k_pos = ki * kc + jnp.arange(kc)[None, :]
      kmask = kmask & (k_pos <= q_pos)[None, None]
    if mask is not None:
      m = lax.dynamic_slice_in_dim(mask, qi * qc, qc, axis=2)
      kmask = kmask & lax.dynamic_slice_in_dim(m, ki * kc, kc, axis=3)
    if segments is not None:
      kmask = kmask & segment_mask(lax.dynamic_slice_in_dim(q_seg, qi * qc, qc, axis=1),
                                   lax.dynamic_slice_in_dim(k_seg, ki * kc, kc, axis=1))
    return kmask

  @jax.checkpoint
  def query_block(qi):
    q_blk = lax.dynamic_slice_in_dim(q, qi * qc, qc, axis=1)

    @jax.checkpoint
    def kv_step(carry, ki):
      m_prev, l_prev, acc = carry  # [b,h,qc], [b,h,qc], [b,qc,h,dv] float32
      k_blk = lax.dynamic_slice_in_dim(k, ki * kc, kc, axis=1)
      v_blk = lax.dynamic_slice_in_dim(v, ki * kc, kc, axis=1)
      s = jnp.einsum(
        "bqhd,bkhd->bhqk", q_blk, k_blk, precision=precision,
        preferred_element_type=jnp.float32,
      ) * scale
      allowed = block_mask(qi, ki)
      s = jnp.where(allowed, s, MASKED)
      m_new = jnp.maximum(m_prev, s.max(axis=-1))
      p = jnp.where(allowed, jnp.exp(s - m_new[..., None]), 0.0)
      correction = jnp.exp(m_prev - m_new)
      l_new = l_prev * correction + p.sum(axis=-1)
      if dropout_rate > 0.0:
        # dropout(softmax) @ V: drop terms of the numerator only, the normaliser stays whole.
        rng = jax.random.fold_in(jax.random.fold_in(dropout_rng, qi), ki)
        p = dropout_lib.apply(p, rng, dropout_rate, dropout_bits)
      pv = jnp.einsum(
        "bhqk,bkhd->bqhd", p.astype(v.dtype), v_blk, precision=precision,
        preferred_element_type=jnp.float32,
      )
      acc = acc * jnp.swapaxes(correction, 1, 2)[..., None] + pv
      return (m_new, l_new, acc), None

    init = (
      jnp.full((batch, heads, qc), MASKED, jnp.float32),
      jnp.zeros((batch, heads, qc), jnp.float32),
      jnp.zeros((batch, qc, heads, dv), jnp.float32),
    )
    (_, denom, acc), _ = lax.scan(kv_step, init, jnp.arange(nk))
    denom = jnp.swapaxes(denom, 1, 2)[..., None]  # [b, qc, h, 1]
    return jnp.where(denom > 0, acc / jnp.where(denom > 0, denom, 1.0), 0.0)

  out = lax.map(query_block, jnp.arange(nq))  # [nq, b, qc, h, dv]
  out = jnp.moveaxis(out, 0, 1).reshape(batch, nq * qc, heads, dv)[:, :q_len]
  return out.astype(query.dtype)


def _cudnn_applies(query, use_dropout) -> bool:
  head_dim = query.shape[-1]
  return (
    not use_dropout
    and jax.default_backend() == "gpu"
    and query.dtype in (jnp.bfloat16, jnp.float16)
    and head_dim % 8 == 0
    and head_dim <= 128
  )


def _cudnn_attention(query, key, value, mask, kv_mask, is_causal, segments):
  mask = combine_masks(mask, None if kv_mask is None else kv_mask[:, None, None, :],
                       None if segments is None else segment_mask(*segments))
  out = jax.nn.dot_product_attention(
    query, key, value, mask=mask, is_causal=is_causal, implementation="cudnn"
  )
  if mask is not None:
    # cuDNN averages the values for a fully masked row; the contract says zeros.
    any_allowed = jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], query.shape[1],
                                          key.shape[1])).any(-1)
    out = jnp.where(jnp.swapaxes(any_allowed, 1, 2)[..., None], out, 0)
  return out
