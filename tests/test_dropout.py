"""Dropout masks from random lanes: their rate, independence, scaling and determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.nn import dropout
from transformer.nn.model import ModelConfig


@pytest.mark.parametrize("bits", dropout.MASK_BITS)
@pytest.mark.parametrize("shape", [(64, 1024), (97, 1001)])  # whole words, and the fallback
def test_drop_fraction_matches_the_rounded_rate(bits, shape):
  rate = 0.1
  keep = np.asarray(dropout.keep_mask(jax.random.key(0), rate, shape, bits))
  expected_keep = dropout.keep_probability(rate, bits)
  n = keep.size
  # 5 standard deviations of a binomial proportion.
  tol = 5 * np.sqrt(expected_keep * (1 - expected_keep) / n)
  assert abs(keep.mean() - expected_keep) < tol
  # Neighbouring lanes come from the same 32-bit word: they must still be independent.
  a, b = keep[:, :-1].ravel().astype(float), keep[:, 1:].ravel().astype(float)
  assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(a.size)


def test_keep_probability_resolution():
  assert dropout.keep_probability(0.1, 8) == 1 - 26 / 256
  assert abs(dropout.keep_probability(0.1, 16) - 0.9) < 1e-4
  assert abs(dropout.keep_probability(0.1, 32) - 0.9) < 1e-9
  assert dropout.keep_probability(0.0, 8) == 1.0


def test_apply_keeps_the_expectation_and_zeroes_the_rest():
  x = jnp.full((256, 512), 3.0)
  y = np.asarray(dropout.apply(x, jax.random.key(1), 0.3, bits=8))
  kept = y != 0
  np.testing.assert_allclose(y[kept], 3.0 / dropout.keep_probability(0.3, 8), rtol=1e-6)
  assert abs(y.mean() - 3.0) < 0.03


def test_masks_are_deterministic_and_depend_on_the_key():
  a = dropout.keep_mask(jax.random.key(3), 0.5, (8, 64))
  b = dropout.keep_mask(jax.random.key(3), 0.5, (8, 64))
  c = dropout.keep_mask(jax.random.key(4), 0.5, (8, 64))
  np.testing.assert_array_equal(a, b)
  assert (np.asarray(a) != np.asarray(c)).any()


def test_module_is_identity_when_deterministic_or_rate_zero():
  x = jnp.arange(32.0).reshape(4, 8)
  module = dropout.Dropout(0.5)
  np.testing.assert_array_equal(module.apply({}, x, deterministic=True), x)
  np.testing.assert_array_equal(
    dropout.Dropout(0.0).apply({}, x, deterministic=False), x)
  y = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
  assert (np.asarray(y) == 0).any()


def test_bad_bits_are_rejected():
  with pytest.raises(ValueError, match="bits"):
    dropout.keep_mask(jax.random.key(0), 0.1, (4, 4), bits=4)
  with pytest.raises(ValueError, match="model.dropout_mask_bits"):
    ModelConfig(dropout_mask_bits=12)
