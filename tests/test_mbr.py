"""Minimum Bayes risk decoding (transformer/decoding/mbr.py, `decode.method='mbr'`)."""

import random

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import config_dict
from sacrebleu.metrics import BLEU, CHRF

from transformer import sharding as sharding_lib
from transformer.decoding import mbr
from transformer.decoding.translate import Translator
from transformer.nn.model import ModelConfig, Transformer


def brute_force(candidates, utility):
  """Every ordered pair scored with sacrebleu directly: O(N^2) sentence scores, no caching."""
  metric = CHRF() if utility == "chrf" else BLEU(effective_order=True)
  n = len(candidates)
  return [sum(metric.sentence_score(candidates[i], [candidates[j]]).score
              for j in range(n) if j != i) / (n - 1) for i in range(n)]


@pytest.mark.parametrize("utility", mbr.UTILITIES)
def test_expected_utilities_equal_the_brute_force_computation(utility):
  rng = random.Random(0)
  words = "the a house cat sat on mat red big".split()
  for _ in range(5):
    candidates = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 7)))
                  for _ in range(rng.randint(2, 9))]
    candidates += candidates[:2]  # repeated samples count as often as drawn
    assert mbr.expected_utilities(candidates, utility) == pytest.approx(
      brute_force(candidates, utility), abs=1e-9)
    ranked = mbr.rank(candidates, utility)
    utilities = brute_force(candidates, utility)
    assert sorted(i for i, _ in ranked) == list(range(len(candidates)))
    assert [u for _, u in ranked] == pytest.approx(sorted(utilities, reverse=True), abs=1e-9)
    best = max(range(len(candidates)), key=lambda i: (utilities[i], -i))
    assert ranked[0][0] == best


def test_ties_go_to_the_earlier_candidate_and_one_candidate_is_refused():
  assert mbr.rank(["a b", "a b"], "chrf")[0][0] == 0
  with pytest.raises(ValueError, match="at least 2"):
    mbr.expected_utilities(["only"], "chrf")


def _translator(mesh_shape, method, **decode):
  cfg = ModelConfig(vocab_size=40, num_layers=1, d_model=32, d_ff=64, num_heads=2, max_len=32,
                    dropout_rate=0.0, logits_bias=True)
  config = config_dict.ConfigDict({
    "mesh": {"data": mesh_shape[0], "fsdp": mesh_shape[1], "tensor": 1}})
  mesh = sharding_lib.make_mesh(config.mesh, jax.devices()[:mesh_shape[0] * mesh_shape[1]])
  src = jnp.ones((1, 8), jnp.int32)
  params = nn.unbox(Transformer(cfg).init(jax.random.key(0), src, src)["params"])
  # EOS less likely, so that the candidates are sentences of a few tokens, not empty ones.
  bias = params["decoder"]["logits_bias"]
  params = {**params, "decoder": {**params["decoder"], "logits_bias": bias.at[1].set(-3.0)}}
  decode_config = config_dict.ConfigDict({"method": method, "beam_size": 4, "alpha": 0.6,
                                          "max_extra_len": 6, "batch_size": 8, "seed": 5,
                                          "temperature": 1.5, **decode})
  shardings = jax.tree.map(lambda _: jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec()), params)
  text = lambda ids: " ".join(map(str, ids))  # noqa: E731
  return Translator(cfg, decode_config, mesh, shardings, detokenize=text), params, text


SOURCES = [[5, 6, 7, 1], [9, 1], [3, 4, 5, 6, 7, 8, 1], [12, 13, 1]]


@pytest.mark.parametrize("sampler", mbr.SAMPLERS)
def test_mbr_picks_the_candidate_of_highest_expected_utility_on_any_mesh(sampler):
  """The candidates are the sampler's own hypotheses (same seed, same sentence ids); MBR ranks
  them as the brute-force computation does, and the choice is the same on 1 and 8 devices."""
  n = 4
  fields = {"mbr_candidates": n, "mbr_sampler": sampler, "mbr_utility": "chrf"}
  translator, params, text = _translator((1, 1), "mbr", **fields)
  found = translator.search_ids(params, SOURCES, nbest=n)
  sampler_translator, _, _ = _translator((1, 1), sampler, **fields)
  candidates = sampler_translator.search_ids(params, SOURCES, nbest=n)
  for hyps, cands in zip(found, candidates, strict=True):
    utilities = brute_force([text(h.ids) for h in cands], "chrf")
    order = sorted(range(n), key=lambda i: (-utilities[i], i))
    assert [h.ids for h in hyps] == [cands[i].ids for i in order]
    np.testing.assert_allclose([h.utility for h in hyps], [utilities[i] for i in order])
  assert len({tuple(h.ids) for hyps in found for h in hyps}) > len(SOURCES)  # not all alike
  wide, _, _ = _translator((2, 4), "mbr", **fields)
  on_8 = wide.search_ids(params, SOURCES, nbest=n)
  assert [[h.ids for h in hyps] for hyps in on_8] == [[h.ids for h in hyps] for hyps in found]
  np.testing.assert_allclose([h.utility for hyps in on_8 for h in hyps],
                             [h.utility for hyps in found for h in hyps])
  assert translator.translate_ids(params, SOURCES) == [h[0].ids for h in found]
