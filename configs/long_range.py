"""The long-range recall task of experiments/claims.py (experiments/long_range.py).

    python -m experiments.claims --part=long_range                          # these CPU defaults
    python -m experiments.claims --part=long_range --long_range.d_model=256 \
        --long_range.max_distance=2000 --long_range.steps=2000              # accelerators

A tiny Transformer and the LSTM baseline with the same number of parameters train on the same
batches (distances d drawn from each of `distributions` in turn), then answer fresh examples
at each of `distances` (at most `max_distance`).
"""

from ml_collections import config_dict


def get_config(arg: str | None = None) -> config_dict.ConfigDict:
  del arg
  c = config_dict.ConfigDict()
  c.d_model = 32  # the Transformer's; the LSTM's width matches its parameter count
  c.layers = 1  # encoder and decoder, both models
  c.heads = 2
  c.num_keys = 8  # key symbols: chance is 1 / num_keys
  c.max_distance = 400
  c.steps = 1000  # training steps per model and distribution
  c.batch_size = 16
  c.warmup = 100
  c.eval_examples = 128  # per evaluated distance
  # uniform: every d equally likely; log_uniform: each factor of two equally likely.
  c.distributions = ["uniform", "log_uniform"]
  c.distances = [2, 5, 10, 25, 50, 100, 200, 300, 400]
  c.seed = 0
  return c
