"""benchmarks/search_steps.py: the steps of beam search's exact stop against the early one."""

import numpy as np
import pytest


@pytest.mark.slow
def test_the_stops_coincide_without_a_length_penalty_and_the_exact_one_is_never_sooner(
    tiny_trained):
  from benchmarks import search_steps
  from transformer import infer
  from transformer import workdir as workdir_lib
  from transformer.data import numbers

  workdir, _, _ = tiny_trained
  rng = np.random.default_rng(0)
  lines = [numbers.english(int(n)) for n in rng.integers(1, 10**6, 40)]
  records = {}
  for alpha in (0.0, 0.6):
    config = workdir_lib.load(workdir)
    with config.unlocked():
      config.decode.method = "beam"
      config.decode.alpha = alpha
    restored = infer.restore(config, workdir)
    sources = [restored.tokenizer.encode(line) for line in lines]
    records[alpha] = search_steps.search_steps(restored, sources, batch_size=16)
  # lp = 1: the exact bound is the best live log probability, the early rule's own test.
  flat = records[0.0]
  assert flat["sentences"] == 40 and flat["beam_size"] == 4
  assert flat["exact_steps"] == flat["early_steps"] > 0 and flat["same_best"] == 1.0
  penalised = records[0.6]
  assert penalised["exact_steps"] >= penalised["early_steps"] > 0
  assert penalised["ratio"] >= 1.0 and 0.0 <= penalised["same_best"] <= 1.0
