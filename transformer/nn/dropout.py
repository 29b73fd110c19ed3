"""Dropout (section 5.4, P_drop) with keep masks drawn from narrow random lanes.

`jax.random.bernoulli` spends one threefry hash (two 32-bit words) per element. `keep_mask`
instead splits each 32-bit random word into 32 // bits lanes and compares each lane with a
threshold: 4x fewer hashes with 8-bit lanes, and a mask that the backward pass can keep
as one byte per element. On the base model's training step (on CPU) the 8-bit masks took
192 MiB less temporary memory than 32-bit ones, at the same speed
(benchmarks/results/train_step_vs_torch.md#dropout).

The price is resolution: the drop probability becomes round(rate * 2^bits) / 2^bits (8 bits:
0.1 -> 26/256 = 0.1016; 16 bits: 0.100006; 32 bits: exact to 2^-32). Kept values are scaled by
the exact 1 / keep probability, so the expectation of the output equals the input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

Array = jax.Array

MASK_BITS = (8, 16, 32)


def keep_probability(rate: float, bits: int = 8) -> float:
  """The exact keep probability of `keep_mask(rng, rate, shape, bits)`."""
  return 1.0 - round(rate * 2**bits) / 2**bits


def keep_mask(rng: Array, rate: float, shape: tuple[int, ...], bits: int = 8) -> Array:
  """bool[shape], True with probability keep_probability(rate, bits), independently.

  One 32-bit random word per 32 // bits elements along the last axis; when the last axis does
  not divide into whole words, one word per element (still `bits`-bit resolution).
  """
  if bits not in MASK_BITS:
    raise ValueError(f"dropout mask bits must be one of {MASK_BITS}, got {bits}")
  threshold = round(rate * 2**bits)
  lane = jnp.dtype(f"uint{bits}")
  per_word = 32 // bits
  *lead, last = shape
  if last % per_word:
    words = jax.random.bits(rng, tuple(shape), jnp.uint32)
    lanes = (words >> (32 - bits)).astype(lane)  # the top bits of each word
  else:
    words = jax.random.bits(rng, (*lead, last // per_word), jnp.uint32)
    # uint32 [..., w] -> uint{bits} [..., w, per_word] -> [..., last]
    lanes = lax.bitcast_convert_type(words, lane).reshape(shape)
  return lanes >= jnp.asarray(threshold, lane)


def apply(x: Array, rng: Array, rate: float, bits: int = 8) -> Array:
  """Inverted dropout: zero elements of x, scale the rest by 1 / keep probability."""
  keep = keep_mask(rng, rate, x.shape, bits)
  return jnp.where(keep, x * jnp.asarray(1.0 / keep_probability(rate, bits), x.dtype),
                   jnp.zeros((), x.dtype))


class Dropout(nn.Module):
  """Drop-in for `nn.Dropout` (same 'dropout' rng stream) with `keep_mask` masks."""

  rate: float
  bits: int = 8

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    return apply(x, self.make_rng("dropout"), self.rate, self.bits)
