"""Attention against a float64 NumPy reference, for every implementation, forward and grads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.nn import attention


def reference_attention(q, k, v, mask):
  """float64 softmax(QK^T/sqrt(d)) V with a boolean [b, h, q, k] mask; empty rows -> 0."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  mask = np.broadcast_to(mask, logits.shape)
  logits = np.where(mask, logits, -np.inf)
  row_max = np.max(logits, axis=-1, keepdims=True)
  row_max = np.where(np.isfinite(row_max), row_max, 0.0)
  w = np.where(mask, np.exp(logits - row_max), 0.0)
  denom = w.sum(-1, keepdims=True)
  w = np.where(denom > 0, w / np.where(denom > 0, denom, 1.0), 0.0)
  return np.einsum("bhqk,bkhd->bqhd", w, v)


def random_case(rng, b, q_len, kv_len, h, d):
  q = rng.normal(size=(b, q_len, h, d)).astype(np.float32)
  k = rng.normal(size=(b, kv_len, h, d)).astype(np.float32)
  v = rng.normal(size=(b, kv_len, h, d)).astype(np.float32)
  return q, k, v


@pytest.mark.parametrize("implementation", attention.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", [(2, 5, 7, 3, 4), (1, 33, 20, 2, 8), (3, 16, 16, 1, 16)])
def test_matches_numpy_reference_with_random_masks(implementation, shape):
  b, q_len, kv_len, h, d = shape
  rng = np.random.default_rng(sum(shape))
  q, k, v = random_case(rng, b, q_len, kv_len, h, d)
  mask = rng.random((b, h, q_len, kv_len)) < 0.6
  mask[0, 0, 0, :] = False  # a fully masked row must give zeros
  out = attention.dot_product_attention(q, k, v, mask, implementation=implementation,
                                        chunk_size=8)
  ref = reference_attention(q, k, v, mask)
  np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5, rtol=2e-5)
  assert np.all(np.asarray(out)[0, 0, 0] == 0)
  assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize("implementation", attention.IMPLEMENTATIONS)
def test_factored_masks_equal_full_mask(implementation):
  rng = np.random.default_rng(0)
  q, k, v = random_case(rng, 2, 13, 13, 2, 8)
  kv_mask = np.ones((2, 13), bool)
  kv_mask[1, 9:] = False
  full = attention.combine_masks(
    jnp.asarray(kv_mask)[:, None, None, :], attention.causal_mask(13)
  )
  ref = reference_attention(q, k, v, np.asarray(full))
  out = attention.dot_product_attention(q, k, v, kv_mask=kv_mask, is_causal=True,
                                        implementation=implementation, chunk_size=4)
  np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("implementation", ["chunked", "cudnn"])
def test_gradients_agree_with_xla(implementation):
  rng = np.random.default_rng(1)
  q, k, v = random_case(rng, 2, 19, 11, 2, 8)
  kv_mask = rng.random((2, 11)) < 0.8

  def loss(impl):
    def f(q, k, v):
      out = attention.dot_product_attention(q, k, v, kv_mask=kv_mask, is_causal=False,
                                            implementation=impl, chunk_size=4)
      return jnp.sum(jnp.sin(out))

    return jax.grad(f, argnums=(0, 1, 2))(q, k, v)

  for g_ref, g in zip(loss("xla"), loss(implementation), strict=True):
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-5, rtol=1e-4)


def test_logits_are_float32_for_bfloat16_inputs():
  rng = np.random.default_rng(2)
  q, k, v = random_case(rng, 1, 6, 6, 2, 8)
  out16 = attention.dot_product_attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)))
  assert out16.dtype == jnp.bfloat16
  ref = reference_attention(q, k, v, np.ones((1, 1, 6, 6), bool))
  np.testing.assert_allclose(np.asarray(out16, np.float32), ref, atol=5e-2)
  # The logits themselves are float32 in the compiled computation.
  hlo = jax.jit(attention.dot_product_attention).lower(
    *(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))).as_text()
  assert "f32" in hlo


def test_mask_helpers():
  tokens_q = jnp.array([[5, 6, 0]])
  tokens_k = jnp.array([[7, 0]])
  m = attention.padding_mask(tokens_q, tokens_k)
  assert m.shape == (1, 1, 3, 2)
  np.testing.assert_array_equal(np.asarray(m[0, 0]), [[1, 0], [1, 0], [0, 0]])
  c = attention.causal_mask(3)
  np.testing.assert_array_equal(np.asarray(c[0, 0]), np.tril(np.ones((3, 3), bool)))
  both = attention.combine_masks(attention.padding_mask(tokens_q, tokens_q), c)
  np.testing.assert_array_equal(np.asarray(both[0, 0]), [[1, 0, 0], [1, 1, 0], [0, 0, 0]])
  assert attention.combine_masks(None, None) is None


def test_dropout_is_applied_and_needs_an_rng():
  rng = np.random.default_rng(3)
  q, k, v = random_case(rng, 1, 8, 8, 1, 4)
  with pytest.raises(ValueError, match="dropout_rng"):
    attention.dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=False)
  for impl in ("xla", "chunked"):
    a = attention.dot_product_attention(q, k, v, dropout_rate=0.5, deterministic=False,
                                        dropout_rng=jax.random.key(0), implementation=impl,
                                        chunk_size=4)
    b = attention.dot_product_attention(q, k, v, implementation=impl, chunk_size=4)
    assert not np.allclose(np.asarray(a), np.asarray(b))
    # The expectation over dropout masks is the deterministic output.
    outs = jax.vmap(lambda key, impl=impl: attention.dot_product_attention(
      q, k, v, dropout_rate=0.5, deterministic=False, dropout_rng=key, implementation=impl,
      chunk_size=4))(jax.random.split(jax.random.key(1), 4000))
    np.testing.assert_allclose(np.asarray(outs.mean(0)), np.asarray(b), atol=0.1)


def test_unknown_implementation_lists_the_valid_ones():
  q = jnp.zeros((1, 2, 1, 4))
  with pytest.raises(ValueError, match="xla, chunked, cudnn"):
    attention.dot_product_attention(q, q, q, implementation="flash")


def numpy_segment_mask(q_seg, kv_seg, kv_mask=None, causal=False):
  """float64-reference mask [b, 1, q, k] of packed rows, built with NumPy loops."""
  b, q_len = q_seg.shape
  kv_len = kv_seg.shape[1]
  out = np.zeros((b, 1, q_len, kv_len), bool)
  for r in range(b):
    for i in range(q_len):
      for j in range(kv_len):
        ok = q_seg[r, i] == kv_seg[r, j]
        ok &= kv_mask is None or kv_mask[r, j]
        ok &= not causal or j <= i + kv_len - q_len
        out[r, 0, i, j] = ok
  return out


def random_segments(rng, b, n, pad=3):
  """Contiguous segments 1, 2, ... of random lengths, then `pad` positions of segment 0."""
  seg = np.zeros((b, n), np.int32)
  for r in range(b):
    cuts = np.sort(rng.choice(np.arange(1, n - pad), size=3, replace=False))
    seg[r, : n - pad] = np.searchsorted(cuts, np.arange(n - pad), side="right") + 1
  return seg


@pytest.mark.parametrize("implementation", attention.IMPLEMENTATIONS)
@pytest.mark.parametrize("causal", [False, True])
def test_segment_ids_match_numpy_reference(implementation, causal):
  """Packed rows: self-attention (optionally causal) and cross-attention between two packed
  sides stay inside segments; chunks of 4 straddle segment boundaries."""
  rng = np.random.default_rng(7)
  q_len, kv_len = 13, 13 if causal else 17
  q, k, v = random_case(rng, 2, q_len, kv_len, 2, 8)
  q_seg = random_segments(rng, 2, q_len)
  kv_seg = q_seg if causal else random_segments(rng, 2, kv_len)
  kv_mask = kv_seg > 0
  ref = reference_attention(q, k, v, numpy_segment_mask(q_seg, kv_seg, kv_mask, causal))
  out = attention.dot_product_attention(
    q, k, v, kv_mask=kv_mask, is_causal=causal, q_segment_ids=q_seg, kv_segment_ids=kv_seg,
    implementation=implementation, chunk_size=4)
  np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5, rtol=2e-5)
  np.testing.assert_array_equal(np.asarray(attention.segment_mask(q_seg, kv_seg)),
                                numpy_segment_mask(q_seg, kv_seg))
  with pytest.raises(ValueError, match="together"):
    attention.dot_product_attention(q, k, v, q_segment_ids=q_seg)


def test_chunked_segments_gradients_agree_with_xla_and_stay_linear():
  rng = np.random.default_rng(8)
  q, k, v = random_case(rng, 2, 19, 19, 2, 8)
  seg = random_segments(rng, 2, 19)

  def grads(impl):
    def f(q, k, v):
      out = attention.dot_product_attention(q, k, v, kv_mask=seg > 0, is_causal=True,
                                            q_segment_ids=seg, kv_segment_ids=seg,
                                            implementation=impl, chunk_size=4)
      return jnp.sum(jnp.sin(out))

    return jax.grad(f, argnums=(0, 1, 2))(q, k, v)

  for g_ref, g in zip(grads("xla"), grads("chunked"), strict=True):
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-5, rtol=1e-4)
  # No [q, k] array: at length 512 in chunks of 64 the largest mask or logits are 64 x 64.
  n = 512
  x = jnp.zeros((1, n, 1, 8))
  s = jnp.zeros((1, n), jnp.int32)
  hlo = jax.jit(lambda x, s: attention.dot_product_attention(
    x, x, x, is_causal=True, q_segment_ids=s, kv_segment_ids=s, implementation="chunked",
    chunk_size=64)).lower(x, s).as_text()
  assert f"{n},{n}" not in hlo.replace(" ", "") and f"x{n}x{n}" not in hlo
