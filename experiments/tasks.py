"""Synthetic long-range task: recall a token after a delay of d positions.

Target sequence (what the decoder reads, shifted right, and predicts), for a delay d >= 2:

    position:  0    1 ... d-2        d-1    d    d+1
    token:     a    b ... b          QUERY  a    EOS

`a` is a key drawn uniformly from `num_keys` symbols, `b` a blank filler, QUERY a marker. The
answer at position d equals the token at position d - d = 0: the only information needed is
exactly d positions back, and nothing between carries it. Source (`inputs`) is just [EOS]: the
encoder has nothing to say, so the task goes through the decoder alone, where the Transformer
reaches position 0 from position d in one step of causal self-attention and the LSTM must
carry `a` through d recurrent steps (its attention reads encoder states only).

Token ids: 0 padding, 1 EOS (the project's), 2 QUERY, 3 blank, 4 .. 4 + num_keys - 1 keys.
Rows are padded with 0 to a common length; the loss ignores padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PAD, EOS, QUERY, BLANK = 0, 1, 2, 3
FIRST_KEY = 4


def vocab_size(num_keys: int) -> int:
  """Vocabulary of the task: the special ids and the keys."""
  return FIRST_KEY + num_keys


def recall_example(key: int, distance: int) -> np.ndarray:
  """int32 [distance + 2]: key, blanks, QUERY, key, EOS (see the module docstring)."""
  if distance < 2:
    raise ValueError(f"distance must be >= 2 (room for the QUERY marker), got {distance}")
  if key < FIRST_KEY:
    raise ValueError(f"key ids start at {FIRST_KEY}, got {key}")
  seq = np.full(distance + 2, BLANK, np.int32)
  seq[0] = key
  seq[distance - 1] = QUERY
  seq[distance] = key
  seq[distance + 1] = EOS
  return seq


def recall_batch(rng: np.random.Generator, distances: Sequence[int] | np.ndarray,
                 num_keys: int, length: int | None = None) -> dict[str, np.ndarray]:
  """One batch: a row per distance. Returns int32 'inputs' [b, 1], 'targets' [b, length],
  'distance' [b] and 'answer' [b] (the key, which is targets[i, distance[i]]).

  length defaults to max(distances) + 2; every row is padded with 0 to it.
  """
  distances = np.asarray(distances, np.int64)
  need = int(distances.max()) + 2
  length = need if length is None else length
  if length < need:
    raise ValueError(f"length {length} < the longest example ({need} tokens)")
  keys = rng.integers(FIRST_KEY, FIRST_KEY + num_keys, size=len(distances))
  targets = np.zeros((len(distances), length), np.int32)
  for i, (k, d) in enumerate(zip(keys.tolist(), distances.tolist(), strict=True)):
    targets[i, : d + 2] = recall_example(k, d)
  return {
    "inputs": np.full((len(distances), 1), EOS, np.int32),
    "targets": targets,
    "distance": distances.astype(np.int32),
    "answer": keys.astype(np.int32),
  }


def sample_distances(rng: np.random.Generator, size: int, min_distance: int, max_distance: int,
                     distribution: str = "log_uniform") -> np.ndarray:
  """int64 [size] distances in [min_distance, max_distance].

  'uniform': every distance equally likely. 'log_uniform': log(d) uniform, so each factor of
  two in d is equally likely and short dependencies, which a model learns first, are common.
  """
  if not 2 <= min_distance <= max_distance:
    raise ValueError(f"need 2 <= min_distance <= max_distance, got {min_distance}, {max_distance}")
  if distribution == "uniform":
    return rng.integers(min_distance, max_distance + 1, size=size)
  if distribution == "log_uniform":
    u = rng.uniform(np.log(min_distance), np.log(max_distance + 1), size=size)
    return np.clip(np.floor(np.exp(u)).astype(np.int64), min_distance, max_distance)
  raise ValueError(f"distribution must be 'uniform' or 'log_uniform', got {distribution!r}")


def training_batch(rng: np.random.Generator, batch_size: int, min_distance: int,
                   max_distance: int, num_keys: int,
                   distribution: str = "log_uniform") -> dict[str, np.ndarray]:
  """Distances from `sample_distances`; every row padded to max_distance + 2."""
  distances = sample_distances(rng, batch_size, min_distance, max_distance, distribution)
  return recall_batch(rng, distances, num_keys, length=max_distance + 2)
