"""Greedy decoding and beam search against NumPy float64 references on a toy cached model.

The toy model's next-token logits are a random table indexed by (sentence, position, token
before the previous one, previous token). The position is a scalar cache leaf (it must never
be tiled or gathered), the sentence id a [B] leaf and the token history a [B, max_len] leaf,
so a wrong cache expansion or reordering changes the logits.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decoding import search as search_lib

EOS = 1
VOCAB = 5


def make_table(seed, num_sentences=3, max_len=4, vocab=VOCAB, eos_bias=0.0):
  """Random logits float64[sentence, position, prev2, prev, next]."""
  rng = np.random.default_rng(seed)
  table = 2.0 * rng.standard_normal((num_sentences, max_len, vocab, vocab, vocab))
  table[..., EOS] += eos_bias
  return table


def toy_model(table):
  table_j = jnp.asarray(table, jnp.float32)  # [sentence, position, prev2, prev, vocab]

  def tokens_to_logits(ids, cache):
    index = cache["index"]
    assert index.ndim == 0, "the scalar cache leaf must stay a scalar"
    prev = ids[:, 0]
    prev2 = jnp.where(index > 0, cache["hist"][:, jnp.maximum(index - 1, 0)], 0)
    logits = table_j[cache["sent"], index, prev2, prev]
    hist = cache["hist"].at[:, index].set(prev)
    return logits, {"index": index + 1, "sent": cache["sent"], "hist": hist}

  return tokens_to_logits


def init_cache(sentence_ids, max_len):
  return {
    "index": jnp.array(0, jnp.int32),
    "sent": jnp.asarray(sentence_ids, jnp.int32),
    "hist": jnp.zeros((len(sentence_ids), max_len), jnp.int32),
  }


# Model steps run, recorded by `counting_toy_model` (from inside the compiled loop).
STEPS = []


def counting_toy_model(table):
  model = toy_model(table)

  def tokens_to_logits(ids, cache):
    jax.debug.callback(lambda: STEPS.append(1))
    return model(ids, cache)

  return tokens_to_logits


def count_steps(fn):
  """Runs fn() and returns (its result, the number of model steps it ran)."""
  STEPS.clear()
  result = fn()
  jax.effects_barrier()
  return result, len(STEPS)


@functools.partial(jax.jit, static_argnames=("max_len", "make_model"))
def _greedy(table, sentence_ids, max_lengths, *, max_len, make_model):
  # The table is an argument, not a closure constant, so same-shape calls share one compile.
  return search_lib.greedy_decode(
    make_model(table),
    init_cache(sentence_ids, max_len),
    batch_size=sentence_ids.shape[0],
    max_lengths=max_lengths,
    max_len=max_len,
  )[0]


@functools.partial(jax.jit, static_argnames=("max_len", "beam_size", "alpha", "make_model"))
def _beam(table, sentence_ids, max_lengths, *, max_len, beam_size, alpha, make_model):
  return search_lib.beam_search(
    make_model(table),
    init_cache(sentence_ids, max_len),
    batch_size=sentence_ids.shape[0],
    beam_size=beam_size,
    alpha=alpha,
    max_lengths=max_lengths,
    max_len=max_len,
  )[:2]


def run_greedy(table, sentence_ids, max_lengths, max_len, make_model=toy_model):
  args = (jnp.asarray(table, jnp.float32), jnp.asarray(sentence_ids), jnp.asarray(max_lengths))
  return np.asarray(_greedy(*args, max_len=max_len, make_model=make_model))


def run_beam(table, sentence_ids, max_lengths, max_len, *, beam_size, alpha, make_model=toy_model):
  args = (jnp.asarray(table, jnp.float32), jnp.asarray(sentence_ids), jnp.asarray(max_lengths))
  seqs, scores = _beam(
    *args, max_len=max_len, beam_size=beam_size, alpha=alpha, make_model=make_model
  )
  return np.asarray(seqs), np.asarray(scores)


def log_softmax64(table):
  table = np.asarray(table, np.float64)
  shifted = table - table.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def sequence_log_prob(log_probs, sentence, tokens):
  total, prev2, prev = 0.0, 0, 0
  for t, token in enumerate(tokens):
    total += log_probs[sentence, t, prev2, prev, token]
    prev2, prev = prev, token
  return total


def all_hypotheses(table, sentence, max_length, alpha):
  """Every EOS-terminated sequence of length <= max_length with its float64 score, best first."""
  log_probs = log_softmax64(table)
  non_eos = [v for v in range(table.shape[-1]) if v != EOS]
  hyps = []
  for length in range(1, max_length + 1):
    for prefix in itertools.product(non_eos, repeat=length - 1):
      tokens = (*prefix, EOS)
      lp = ((5.0 + length) / 6.0) ** alpha
      hyps.append((sequence_log_prob(log_probs, sentence, tokens) / lp, tokens))
  return sorted(hyps, key=lambda h: -h[0])


def greedy_reference(table, sentence, max_length):
  log_probs = log_softmax64(table)
  tokens, prev2, prev = [], 0, 0
  for t in range(max_length):
    token = EOS if t == max_length - 1 else int(np.argmax(log_probs[sentence, t, prev2, prev]))
    tokens.append(token)
    if token == EOS:
      return tokens
    prev2, prev = prev, token
  return tokens


def padded(tokens, max_len):
  return list(tokens) + [0] * (max_len - len(tokens))


def test_length_penalty_formula():
  lengths = np.arange(0, 12)
  for alpha in (0.0, 0.6, 1.0, 2.5):
    expected = ((5.0 + lengths) / 6.0) ** alpha
    np.testing.assert_allclose(search_lib.length_penalty(lengths, alpha), expected, rtol=1e-6)
  assert float(search_lib.length_penalty(1, 0.6)) == pytest.approx(1.0)


def test_flatten_tile_gather_beams():
  x = jnp.arange(2 * 3 * 4).reshape(2, 3, 4)
  np.testing.assert_array_equal(search_lib.unflatten_beams(search_lib.flatten_beams(x), 2), x)
  tree = {"kv": jnp.arange(2 * 5).reshape(2, 5), "index": jnp.array(7)}
  tiled = search_lib.tile_beams(tree, 3)
  assert tiled["kv"].shape == (6, 5) and tiled["index"].shape == ()
  np.testing.assert_array_equal(tiled["kv"][3], tree["kv"][1])
  gathered = search_lib.gather_beams(tiled, jnp.array([[2, 0, 0], [1, 1, 2]]))
  assert gathered["index"].shape == ()
  np.testing.assert_array_equal(gathered["kv"], tiled["kv"][jnp.array([2, 0, 0, 4, 4, 5])])
  # Leaves marked False (equal across the beams of a sentence) are passed through.
  kept = search_lib.gather_beams(tiled, jnp.array([[2, 0, 0], [1, 1, 2]]),
                             reorder={"kv": False, "index": True})
  np.testing.assert_array_equal(kept["kv"], tiled["kv"])


@pytest.mark.parametrize("rows,n,k,block,values", [
  (5, 1009, 4, 16, "normal"),  # 64 blocks, the last one padded (1009 is prime)
  (7, 333, 5, 8, "ties"),  # scores from {0, 1, 2, 3}: ties everywhere; blocks of 9
  (4, 64, 8, 4, "sparse"),  # a few finite scores per row, the rest -inf
  (3, 256, 1, 128, "normal"),  # 2 blocks
  (3, 40, 4, 16, "normal"),  # 3 blocks <= k: lax.top_k itself
])
def test_top_k_by_blocks_is_lax_top_k(rows, n, k, block, values):
  rng = np.random.default_rng(n)
  if values == "normal":
    scores = rng.standard_normal((rows, n))
  elif values == "ties":
    scores = rng.integers(0, 4, (rows, n)).astype(float)
  else:
    scores = np.full((rows, n), -np.inf)
    for row in range(rows - 1):  # the last row: -inf only
      scores[row, rng.integers(0, n, 3)] = rng.standard_normal(3)
  scores = jnp.asarray(scores, jnp.float32)
  expected = jax.lax.top_k(scores, k)
  got = jax.jit(search_lib.top_k_by_blocks, static_argnums=(1, 2))(scores, k, block)
  np.testing.assert_array_equal(got[0], expected[0])
  np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_matches_numpy_reference(seed):
  table = make_table(seed)
  max_lengths = [4, 3, 2]
  seqs = run_greedy(table, [0, 1, 2], max_lengths, max_len=4)
  for b, m in enumerate(max_lengths):
    assert seqs[b].tolist() == padded(greedy_reference(table, b, m), 4)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_size_one_equals_greedy(seed, alpha):
  table = make_table(seed, max_len=5, eos_bias=0.5)
  sentence_ids, max_lengths = [0, 1, 2], [5, 4, 5]
  greedy = run_greedy(table, sentence_ids, max_lengths, max_len=5)
  seqs, scores = run_beam(table, sentence_ids, max_lengths, 5, beam_size=1, alpha=alpha)
  np.testing.assert_array_equal(seqs[:, 0], greedy)
  # The score is the greedy sequence's length-penalized log probability.
  for b in range(3):
    tokens = greedy[b, : greedy[b].tolist().index(EOS) + 1].tolist()
    lp = ((5.0 + len(tokens)) / 6.0) ** alpha
    expected = sequence_log_prob(log_softmax64(table), b, tokens) / lp
    assert scores[b, 0] == pytest.approx(expected, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("alpha,block", [(0.0, None), (0.6, None), (1.5, None), (0.6, 2)])
def test_wide_beam_is_exhaustive(alpha, block, monkeypatch):
  # Vocab 5, max_len 4: at most 16 * 5 = 80 extensions per step and 85 hypotheses, so a beam
  # of 128 keeps everything, never fills its finished set and must enumerate all of them.
  # Blocks of 2 scores: the beam's top K searches 128 of 320 blocks (`search_lib.top_k_by_blocks`).
  if block:
    monkeypatch.setattr(search_lib, "TOP_K_BLOCK", block)
  table = make_table(seed=5)
  max_lengths = [4, 3, 2]
  seqs, scores = run_beam(table, [0, 1, 2], max_lengths, 4, beam_size=128, alpha=alpha)
  for b, m in enumerate(max_lengths):
    hyps = all_hypotheses(table, b, m, alpha)
    n = len(hyps)
    assert np.all(np.isfinite(scores[b, :n])) and np.all(scores[b, n:] == -np.inf)
    np.testing.assert_allclose(scores[b, :n], [h[0] for h in hyps], rtol=1e-5, atol=1e-5)
    assert seqs[b, 0].tolist() == padded(hyps[0][1], 4)  # the best hypothesis
    # Every returned hypothesis is one of the enumerated ones, each exactly once.
    returned = {tuple(s) for s in seqs[b, :n].tolist()}
    assert returned == {tuple(padded(h[1], 4)) for h in hyps}
    assert not seqs[b, n:].any()


@pytest.mark.parametrize("seed,block", [(0, None), (1, None), (2, None), (3, None), (3, 2)])
def test_early_stopping_keeps_the_best(seed, block, monkeypatch):
  # Beam search is not exact in general; for these tables (EOS likely, vocab 4, 3280
  # hypotheses) a beam of 4 finds the optimum, and the early stop ends the loop before max_len.
  if block:
    monkeypatch.setattr(search_lib, "TOP_K_BLOCK", block)
  max_len = 8
  table = make_table(seed, num_sentences=1, max_len=max_len, vocab=4, eos_bias=2.0)
  (seqs, scores), steps = count_steps(
    lambda: run_beam(
      table, [0], [max_len], max_len, beam_size=4, alpha=0.6, make_model=counting_toy_model
    )
  )
  assert steps < max_len
  best_score, best_tokens = all_hypotheses(table, 0, max_len, 0.6)[0]
  assert seqs[0, 0].tolist() == padded(best_tokens, max_len)
  assert scores[0, 0] == pytest.approx(best_score, rel=1e-5)
  # All K returned hypotheses are distinct, sorted and scored correctly.
  assert np.all(np.diff(scores[0]) <= 0) and len({tuple(x) for x in seqs[0].tolist()}) == 4
  for row, score in zip(seqs[0], scores[0], strict=True):
    tokens = row[: row.tolist().index(EOS) + 1].tolist()
    lp = ((5.0 + len(tokens)) / 6.0) ** 0.6
    assert score == pytest.approx(sequence_log_prob(log_softmax64(table), 0, tokens) / lp, rel=1e-5)


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_early_stop_bound_allows_longer_hypotheses(alpha):
  # Only EOS (p = 0.3) and token 2 (p = 0.7) are plausible at every step, so under a strong
  # length penalty the longest hypothesis wins although every live prefix soon has a lower
  # log prob than the finished ones: stopping must use lp(max_length), not the current lp.
  max_len = 8
  table = np.full((1, max_len, 4, 4, 4), -1e3)
  table[..., EOS], table[..., 2] = np.log(0.3), np.log(0.7)
  seqs, scores = run_beam(table, [0], [max_len], max_len, beam_size=2, alpha=alpha)
  best_score, best_tokens = all_hypotheses(table, 0, max_len, alpha)[0]
  if alpha == 2.0:
    assert best_tokens == (2,) * (max_len - 1) + (EOS,)
  assert seqs[0, 0].tolist() == padded(best_tokens, max_len)
  assert scores[0, 0] == pytest.approx(best_score, rel=1e-5)


def test_forced_eos_and_padding():
  # EOS is never preferred, so every output ends at its max length with a forced EOS.
  table = make_table(seed=7, max_len=6, eos_bias=-30.0)
  max_lengths = [1, 2, 4, 9]  # 9 > max_len is clipped to 6
  ends = [0, 1, 3, 5]
  greedy = run_greedy(table, [0, 1, 2, 0], max_lengths, max_len=6)
  seqs, scores = run_beam(table, [0, 1, 2, 0], max_lengths, 6, beam_size=3, alpha=0.6)
  for b, end in enumerate(ends):
    for row in [greedy[b]] + [s for s, sc in zip(seqs[b], scores[b], strict=True) if sc > -np.inf]:
      assert row[end] == EOS
      assert EOS not in row[:end].tolist()
      assert not row[end + 1 :].any()
  # A max length of 1 allows a single hypothesis, [EOS]; the other slots are empty.
  assert seqs[0, 0].tolist() == [EOS, 0, 0, 0, 0, 0]
  assert np.all(scores[0, 1:] == -np.inf) and not seqs[0, 1:].any()


def test_outputs_are_padded_after_early_eos():
  table = make_table(seed=3, max_len=5, eos_bias=1.5)
  greedy = run_greedy(table, [0, 1, 2], [5, 5, 5], max_len=5)
  seqs, scores = run_beam(table, [0, 1, 2], [5, 5, 5], 5, beam_size=4, alpha=0.6)
  rows = list(greedy) + list(seqs.reshape(-1, 5)[np.isfinite(scores.reshape(-1))])
  for row in rows:
    end = row.tolist().index(EOS)
    assert not row[end + 1 :].any()
  assert any(row.tolist().index(EOS) < 4 for row in rows)  # the check is not vacuous


@pytest.mark.parametrize("beam_size", [1, 3])
def test_batched_equals_alone(beam_size):
  table = make_table(seed=11, max_len=5, eos_bias=0.5)
  sentence_ids, max_lengths = [2, 0, 1], [5, 3, 4]
  greedy = run_greedy(table, sentence_ids, max_lengths, max_len=5)
  seqs, scores = run_beam(table, sentence_ids, max_lengths, 5, beam_size=beam_size, alpha=0.6)
  for b, (s, m) in enumerate(zip(sentence_ids, max_lengths, strict=True)):
    np.testing.assert_array_equal(run_greedy(table, [s], [m], max_len=5)[0], greedy[b])
    alone_seqs, alone_scores = run_beam(table, [s], [m], 5, beam_size=beam_size, alpha=0.6)
    np.testing.assert_array_equal(alone_seqs[0], seqs[b])
    np.testing.assert_allclose(alone_scores[0], scores[b], rtol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_asking_for_the_best_only_stops_sooner_with_the_same_best(seed):
  """num_hypotheses=1 stops a sentence once its best is final: the same best hypothesis and
  score as the search that waits for K finished ones, in no more steps (fewer on some)."""
  max_len = 8
  table = jnp.asarray(make_table(seed, num_sentences=3, max_len=max_len, vocab=4,
                                 eos_bias=1.0), jnp.float32)
  sentences, lengths = jnp.arange(3), jnp.full((3,), max_len)

  def search(n):
    return search_lib.beam_search(counting_toy_model(table), init_cache(sentences, max_len),
                              batch_size=3, beam_size=4, alpha=0.6, max_lengths=lengths,
                              max_len=max_len, num_hypotheses=n)

  (full, full_scores, _), full_steps = count_steps(lambda: search(None))
  (best, best_scores, _), best_steps = count_steps(lambda: search(1))
  np.testing.assert_array_equal(best[:, 0], full[:, 0])
  np.testing.assert_allclose(best_scores[:, 0], full_scores[:, 0], rtol=1e-6)
  assert best_steps <= full_steps
  for b in range(3):  # and the best is the exhaustive optimum's score or below it
    assert best_scores[b, 0] <= all_hypotheses(np.asarray(table), b, max_len, 0.6)[0][0] + 1e-5
  with pytest.raises(ValueError, match="num_hypotheses"):
    search(5)


def test_loops_stop_early():
  # EOS dominates, so greedy needs 1 step and beam 2 needs 2 (then nothing live can beat the
  # worst finished hypothesis), well before max_len = 6.
  table = make_table(seed=0, max_len=6, eos_bias=20.0)
  seqs, steps = count_steps(
    lambda: run_greedy(table, [0, 1], [6, 6], 6, make_model=counting_toy_model)
  )
  assert seqs[:, 0].tolist() == [EOS, EOS] and steps == 1
  (seqs, _), steps = count_steps(
    lambda: run_beam(
      table, [0, 1], [6, 6], 6, beam_size=2, alpha=0.6, make_model=counting_toy_model
    )
  )
  assert seqs[:, 0, 0].tolist() == [EOS, EOS] and steps == 2


@pytest.mark.parametrize("method", ["greedy", "beam", "beam_best", "sample", "prefix"])
def test_a_shrinking_batch_gives_each_sentence_the_outputs_of_the_whole_batch(method):
  """`stages` cut the stopped sentences out of the batch: every output (sequences, scores,
  log probabilities) is the unshrunk search's, bitwise, with sentences of every length."""
  batch, max_len = 8, 6
  table = jnp.asarray(make_table(7, num_sentences=batch, max_len=max_len, eos_bias=0.3),
                      jnp.float32)
  sentences = jnp.arange(batch)
  lengths = jnp.asarray([6, 2, 5, 1, 6, 3, 4, 6])
  prefix = jnp.asarray(np.random.default_rng(0).integers(2, VOCAB, (batch, 2)), jnp.int32)
  prefix_lengths = jnp.asarray([0, 1, 2, 0, 1, 0, 2, 1])
  keys = jax.random.split(jax.random.key(5), batch)

  def search(stages):
    cache = init_cache(sentences, max_len)
    options = dict(batch_size=batch, max_lengths=lengths, max_len=max_len, stages=stages)
    if method == "greedy":
      return search_lib.greedy_decode(toy_model(table), cache, **options)
    if method == "sample":
      return search_lib.sample_decode(toy_model(table), cache, rngs=keys, **options)
    if method == "prefix":
      options.update(prefix=prefix, prefix_lengths=prefix_lengths)
    return search_lib.beam_search(toy_model(table), cache, beam_size=3, alpha=0.6,
                                  num_hypotheses=1 if method == "beam_best" else None,
                                  **options)

  whole = jax.jit(lambda: search(()))()
  for stages in [(4,), (4, 2), (6, 3, 1)]:
    shrunk = jax.jit(lambda stages=stages: search(stages))()
    for a, b in zip(shrunk, whole, strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_stages_must_shrink_the_batch():
  table = jnp.asarray(make_table(0), jnp.float32)
  for stages in [(3,), (2, 2), (1, 2), (0,)]:
    with pytest.raises(ValueError, match="stages must decrease"):
      search_lib.greedy_decode(toy_model(table), init_cache(jnp.arange(3), 4), batch_size=3,
                               max_lengths=jnp.full((3,), 4), max_len=4, stages=stages)
  assert search_lib.shrinking_stages(64, multiple=8, count=2) == (16,)
  assert search_lib.shrinking_stages(64, count=2) == (16, 4)
  assert search_lib.shrinking_stages(64, multiple=3) == ()


def test_negative_alpha_is_rejected():
  with pytest.raises(ValueError, match="alpha"):
    run_beam(make_table(0), [0], [4], 4, beam_size=2, alpha=-0.5)


@pytest.mark.parametrize("scan_layers,batch", [(True, 3), (False, 1)])
def test_in_place_beam_caches_equal_reordered_caches(scan_layers, batch):
  """The Transformer's beams keep their self-attention caches in place (groups of K rows,
  `model.KV_OWNER`) and share the prefilled encoder-side keys and values, as in
  `translate.decode_tokens`: the same scores and sequences as one row per hypothesis whose
  caches beam search reorders with the rows."""
  import dataclasses

  from configs import wmt
  from transformer.decoding import translate
  from transformer.nn import model as model_lib
  from transformer.nn.model import ModelConfig, Transformer

  cfg = dataclasses.replace(ModelConfig(**wmt.get_config("tiny").model),
                            scan_layers=scan_layers, dropout_rate=0.0)
  src_len, max_len, k = 6, 7, 3
  rng = np.random.default_rng(0)
  src = jnp.asarray(rng.integers(2, cfg.vocab_size, (batch, src_len)), jnp.int32)
  src = src.at[:, -1].set(EOS)
  if batch > 1:
    src = src.at[1, 4:].set(0).at[1, 3].set(EOS)
  params = Transformer(cfg).init(jax.random.key(0), src, src)["params"]
  encoded = Transformer(cfg).apply({"params": params}, src, method=Transformer.encode)
  step_model = Transformer(cfg, incremental=True)
  encoded_b, src_b = search_lib.tile_beams((encoded, src), k)

  def tokens_to_logits(ids, cache):
    logits, mutated = step_model.apply(
      {"params": params, "cache": cache}, encoded_b, src_b, ids,
      method=Transformer.decode_logits, mutable=["cache"],
    )
    return logits[:, -1, :], mutated["cache"]

  def run(cache, reorder):
    return search_lib.beam_search(tokens_to_logits, cache, batch_size=batch, beam_size=k,
                              alpha=0.6, max_lengths=jnp.full((batch,), max_len),
                              max_len=max_len, eos_id=EOS, reorder=reorder)[:2]

  def cache(beam_size):
    fresh = translate.init_cache(cfg, batch, src_len, max_len, beam_size)
    return translate.prefill_cache(cfg, params, encoded, src, fresh)

  per_row, in_place = cache(1), cache(k)
  owners = [x for path, x in jax.tree_util.tree_leaves_with_path(in_place)
            if path[-1].key == model_lib.KV_OWNER]
  assert owners and all(x.shape[-2] == k for x in owners)
  seqs_old, scores_old = jax.jit(lambda c: run(c, translate.beam_reorder_mask(c)))(per_row)
  seqs_new, scores_new = jax.jit(lambda c: run(c, translate.beam_reorder_mask(c)))(in_place)
  np.testing.assert_array_equal(seqs_new, seqs_old)
  np.testing.assert_allclose(scores_new, scores_old, rtol=1e-5)

  # And with the encoder side once per sentence (`translate.per_source`): the K rows of a
  # sentence read its keys and values, and its encoder outputs, untiled.
  def tokens_to_logits_once(ids, cache):
    model_cache, (enc, inputs) = cache
    logits, mutated = step_model.apply(
      {"params": params, "cache": model_cache}, enc, inputs, ids,
      method=Transformer.decode_logits, mutable=["cache"],
    )
    return logits[:, -1, :], (mutated["cache"], (enc, inputs))

  def run_once(cache):
    once = (translate.per_source(cache, cfg), (True, True))
    assert any(jax.tree.leaves(once[0]))
    return search_lib.beam_search(
      tokens_to_logits_once, (cache, (encoded, src)), batch_size=batch, beam_size=k,
      alpha=0.6, max_lengths=jnp.full((batch,), max_len), max_len=max_len, eos_id=EOS,
      reorder=(translate.beam_reorder_mask(cache), (False, False)), per_sentence=once)[:2]

  seqs_once, scores_once = jax.jit(run_once)(in_place)
  np.testing.assert_array_equal(seqs_once, seqs_old)
  np.testing.assert_allclose(scores_once, scores_old, rtol=1e-5)


# Log probabilities of the hypotheses, and sampling.


def test_beam_log_probs_are_the_hypotheses_float64_log_probabilities():
  table = make_table(seed=5)
  args = (jnp.asarray(table, jnp.float32), jnp.asarray([0, 1, 2]), jnp.asarray([4, 3, 2]))
  run = jax.jit(lambda t, s, m: search_lib.beam_search(
    toy_model(t), init_cache(s, 4), batch_size=3, beam_size=128, alpha=0.6, max_lengths=m,
    max_len=4))
  seqs, scores, log_probs = map(np.asarray, run(*args))
  reference = log_softmax64(table)
  for b in range(3):
    for k in range(128):
      if scores[b, k] == -np.inf:
        assert log_probs[b, k] == -np.inf
        continue
      tokens = seqs[b, k, : seqs[b, k].tolist().index(EOS) + 1].tolist()
      want = sequence_log_prob(reference, b, tokens)
      assert log_probs[b, k] == pytest.approx(want, rel=1e-5, abs=1e-5)
      lp = ((5.0 + len(tokens)) / 6.0) ** 0.6
      assert scores[b, k] == pytest.approx(want / lp, rel=1e-5, abs=1e-5)


def _sample(table, sentence_ids, max_lengths, max_len, keys, **filters):
  return jax.jit(lambda t, s, m, k: search_lib.sample_decode(
    toy_model(t), init_cache(s, max_len), rngs=k, batch_size=len(sentence_ids),
    max_lengths=m, max_len=max_len, **filters))(
      jnp.asarray(table, jnp.float32), jnp.asarray(sentence_ids), jnp.asarray(max_lengths), keys)


def test_greedy_log_probs_and_top_k_1_sampling_equal_greedy():
  table = make_table(seed=3)
  ids, lengths = [0, 1, 2, 0], [4, 4, 3, 2]
  greedy, greedy_lp = jax.jit(lambda t, s, m: search_lib.greedy_decode(
    toy_model(t), init_cache(s, 4), batch_size=4, max_lengths=m, max_len=4))(
      jnp.asarray(table, jnp.float32), jnp.asarray(ids), jnp.asarray(lengths))
  keys = jax.random.split(jax.random.key(0), 4)
  sampled, sampled_lp = _sample(table, ids, lengths, 4, keys, top_k=1, temperature=0.7)
  np.testing.assert_array_equal(np.asarray(sampled), np.asarray(greedy))
  reference = log_softmax64(table)
  for b, s in enumerate(ids):
    tokens = greedy_reference(table, s, lengths[b])
    assert np.asarray(greedy)[b].tolist() == padded(tokens, 4)
    want = sequence_log_prob(reference, s, tokens)
    assert float(greedy_lp[b]) == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert float(sampled_lp[b]) == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_first_token_frequencies_match_the_softmax(temperature):
  # n draws of the first token; every frequency within 6 standard deviations of its
  # probability: a bound a correct sampler exceeds with probability below 1e-8.
  table = make_table(seed=7, num_sentences=1)
  n = 20000
  keys = jax.random.split(jax.random.key(1), n)
  seqs, _ = _sample(table, [0] * n, [4] * n, 4, keys, temperature=temperature)
  first = np.asarray(seqs)[:, 0]
  logits = table[0, 0, 0, 0] / temperature
  probs = np.exp(logits - logits.max())
  probs /= probs.sum()
  freq = np.bincount(first, minlength=VOCAB) / n
  sigma = np.sqrt(probs * (1 - probs) / n)
  assert np.all(np.abs(freq - probs) <= 6 * sigma + 1e-12), (freq, probs)


@pytest.mark.parametrize("top_k,top_p", [(2, 1.0), (0, 0.5), (3, 0.6)])
def test_top_k_and_top_p_never_leave_their_set(top_k, top_p):
  vocab = 12
  table = make_table(seed=11, num_sentences=1, max_len=5, vocab=vocab)
  n = 3000
  keys = jax.random.split(jax.random.key(2), n)
  seqs = np.asarray(_sample(table, [0] * n, [5] * n, 5, keys, top_k=top_k, top_p=top_p)[0])
  reference = log_softmax64(table)
  for row in seqs[:500]:
    prev2, prev = 0, 0
    for t, token in enumerate(row.tolist()):
      if t == 4 or token == 0:
        break  # EOS forced at the length limit, or finished
      probs = np.exp(reference[0, t, prev2, prev])
      order = np.argsort(-probs, kind="stable")
      allowed = order[: top_k or vocab]
      kept = probs[allowed] / probs[allowed].sum()
      before = np.cumsum(kept) - kept
      allowed = allowed[before < top_p]
      assert token in allowed, (t, token, allowed)
      if token == EOS:
        break
      prev2, prev = prev, token
  # The restriction is not vacuous: the first tokens drawn cover the allowed set.
  probs = np.exp(reference[0, 0, 0, 0])
  order = np.argsort(-probs, kind="stable")[: top_k or vocab]
  kept = probs[order] / probs[order].sum()
  allowed = set(order[(np.cumsum(kept) - kept) < top_p].tolist())
  assert set(seqs[:, 0].tolist()) == allowed


def test_a_rows_sample_depends_on_its_key_only():
  table = make_table(seed=4)
  keys = jax.random.split(jax.random.key(3), 3)
  together, _ = _sample(table, [0, 1, 2], [4, 4, 4], 4, keys)
  for b in range(3):
    alone, _ = _sample(table, [b], [4], 4, keys[b:b + 1])
    np.testing.assert_array_equal(np.asarray(alone)[0], np.asarray(together)[b])


def test_beam_reorder_mask_follows_the_declared_cache_entries():
  """Per-source entries are never reordered; in-place ones only with one row per hypothesis."""
  import dataclasses

  from configs import wmt
  from transformer.decoding import translate
  from transformer.nn import model as model_lib
  from transformer.nn.model import ModelConfig

  cfg = dataclasses.replace(ModelConfig(**wmt.get_config("tiny").model), num_layers=1)
  for beam_size in (1, 4):
    cache = translate.init_cache(cfg, 2, 5, 6, beam_size)
    reorder = translate.beam_reorder_mask(cache)
    flat = {tuple(p.key for p in path): x
            for path, x in jax.tree_util.tree_leaves_with_path(reorder)}
    names = {path[-1] for path in flat}
    assert set(model_lib.PER_SOURCE_CACHE) <= names and set(model_lib.IN_PLACE_CACHE) <= names
    for path, x in flat.items():
      if path[-1] in model_lib.PER_SOURCE_CACHE:
        assert x is False, path
      elif path[-1] in model_lib.IN_PLACE_CACHE:
        assert x is (beam_size == 1), path
      else:
        assert x is True, path


def test_beam_search_decodes_the_lstm_baseline():
  """Its cache entries hold (c, h) pairs: the reorder mask has a bool for each array."""
  import dataclasses

  from configs import wmt
  from transformer.decoding import translate
  from transformer.nn.model import ModelConfig
  from transformer.nn.model_family import build_model

  cfg = dataclasses.replace(ModelConfig(**wmt.get_config("tiny").model), kind="lstm",
                            dropout_rate=0.0)
  src = jnp.array([[5, 6, 7, EOS], [8, 9, EOS, 0]], jnp.int32)
  params = build_model(cfg).init(jax.random.key(0), src, src)["params"]
  out = jax.jit(lambda p, x: translate.decode_tokens(
    p, x, cfg, beam_size=3, alpha=0.6, max_extra_len=4, max_len=8))(params, src)
  assert out.shape == (2, 8) and out.dtype == jnp.int32


# ----------------------------------------------------------------- forced prefixes, ensembles


def _until_eos(seq):
  tokens = [int(x) for x in seq]
  return tuple(tokens[: tokens.index(EOS) + 1])


def _beam_with(table, prefix, lengths, *, max_len, beam_size, alpha, normalize=True,
               tokens_to_logits=None):
  sentences = jnp.arange(table.shape[0])
  return search_lib.beam_search(
    tokens_to_logits or toy_model(table), init_cache(sentences, max_len),
    batch_size=table.shape[0], beam_size=beam_size, alpha=alpha,
    max_lengths=jnp.full((table.shape[0],), max_len), max_len=max_len, normalize=normalize,
    prefix=None if prefix is None else jnp.asarray(prefix, jnp.int32),
    prefix_lengths=None if lengths is None else jnp.asarray(lengths, jnp.int32))


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_with_a_prefix_is_exhaustive_search_over_the_prefixed_sequences(alpha):
  """Every hypothesis starts with its sentence's prefix, and a beam wide enough finds the
  exhaustive ranking of the sequences that start with it, scored with the prefix's own log
  probabilities included."""
  max_len = 4
  table = make_table(11, num_sentences=3, max_len=max_len)
  prefixes = [[2, 3], [4], []]
  prefix = np.zeros((3, 2), np.int32)
  for b, p in enumerate(prefixes):
    prefix[b, :len(p)] = p
  seqs, scores, _ = _beam_with(jnp.asarray(table, jnp.float32), prefix, [2, 1, 0],
                               max_len=max_len, beam_size=128, alpha=alpha)
  for b, p in enumerate(prefixes):
    want = [(s, t) for s, t in all_hypotheses(table, b, max_len, alpha) if t[:len(p)] == tuple(p)]
    got = [(float(scores[b, k]), _until_eos(seqs[b, k]))
           for k in range(128) if scores[b, k] > -np.inf]
    assert [t for _, t in got] == [t for _, t in want]
    np.testing.assert_allclose([s for s, _ in got], [s for s, _ in want], rtol=1e-5, atol=1e-5)


def test_a_greedy_prefix_keeps_the_greedy_output_and_an_empty_one_changes_nothing():
  max_len = 6
  table = make_table(5, num_sentences=3, max_len=max_len)
  sentences, lengths = jnp.arange(3), jnp.full((3,), max_len)
  t = jnp.asarray(table, jnp.float32)

  def greedy(prefix=None, prefix_lengths=None):
    return search_lib.greedy_decode(toy_model(t), init_cache(sentences, max_len), batch_size=3,
                                    max_lengths=lengths, max_len=max_len, prefix=prefix,
                                    prefix_lengths=prefix_lengths)

  plain, plain_lp = greedy()
  for n in range(3):
    prefix = jnp.asarray(plain)[:, :max(n, 1)]
    seqs, lp = greedy(prefix, jnp.full((3,), n))
    np.testing.assert_array_equal(seqs, plain)
    np.testing.assert_array_equal(lp, plain_lp)


def test_an_ensembles_beam_search_is_exhaustive_search_of_the_averaged_log_probabilities():
  """Two toy models whose log probabilities are averaged with weights 0.3 and 0.7: a wide beam
  ranks every sequence by sum_t (0.3 log p1 + 0.7 log p2) / lp, as an enumeration does."""
  max_len, alpha, w = 4, 0.6, (0.3, 0.7)
  tables = [make_table(s, num_sentences=2, max_len=max_len) for s in (21, 22)]
  models = [toy_model(jnp.asarray(t, jnp.float32)) for t in tables]

  def ensemble(ids, cache):
    outs = [m(ids, c) for m, c in zip(models, cache, strict=True)]
    mixed = sum(wi * jax.nn.log_softmax(o, axis=-1) for wi, (o, _) in zip(w, outs, strict=True))
    return mixed, tuple(c for _, c in outs)

  sentences = jnp.arange(2)
  cache = tuple(init_cache(sentences, max_len) for _ in models)
  seqs, scores, log_probs = search_lib.beam_search(
    ensemble, cache, batch_size=2, beam_size=128, alpha=alpha,
    max_lengths=jnp.full((2,), max_len), max_len=max_len, normalize=False)
  mixed = w[0] * log_softmax64(tables[0]) + w[1] * log_softmax64(tables[1])
  for b in range(2):
    want = []
    non_eos = [v for v in range(VOCAB) if v != EOS]
    for length in range(1, max_len + 1):
      for p in itertools.product(non_eos, repeat=length - 1):
        tokens = (*p, EOS)
        lp = ((5.0 + length) / 6.0) ** alpha
        want.append((sequence_log_prob(mixed, b, tokens) / lp, tokens))
    want.sort(key=lambda h: -h[0])
    got = [(float(scores[b, k]), _until_eos(seqs[b, k])) for k in range(128)
           if scores[b, k] > -np.inf]
    assert [t for _, t in got] == [t for _, t in want]
    np.testing.assert_allclose([s for s, _ in got], [s for s, _ in want], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["beam", "greedy", "sample"])
def test_a_model_ensembled_with_itself_gives_its_own_outputs_and_scores(method):
  """`decode_hypotheses` and `target_log_probs` of the ensemble (params, params) with equal
  weights, bitwise the single model's: its outputs, scores and log probabilities."""
  from configs import wmt
  from transformer.decoding import translate
  from transformer.nn.model import ModelConfig, Transformer

  cfg = ModelConfig(**wmt.get_config("tiny").model)
  rng = np.random.default_rng(1)
  src = jnp.asarray(rng.integers(2, cfg.vocab_size, (3, 6)), jnp.int32).at[:, -1].set(EOS)
  src = src.at[2, 3:].set(0).at[2, 2].set(EOS)
  params = Transformer(cfg).init(jax.random.key(0), src, src)["params"]
  search = translate.Search(method=method, beam_size=3, max_extra_len=4, seed=3)
  nbest = {"beam": 2, "greedy": 1, "sample": 2}[method]
  run = jax.jit(lambda p, configs, w: translate.decode_hypotheses(
    p, src, configs, search, nbest=nbest, max_len=10, weights=w), static_argnums=(1, 2))
  single = run(params, cfg, None)
  for a, b in zip(single, run((params, params), (cfg, cfg), None), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Unequal weights: the same outputs; 0.25 x + 0.75 x rounds to x within an ulp or so.
  seqs, scores, log_probs = run((params, params), (cfg, cfg), (0.25, 0.75))
  np.testing.assert_array_equal(seqs, single[0])
  np.testing.assert_allclose(scores, single[1], rtol=1e-6)
  np.testing.assert_allclose(log_probs, single[2], rtol=1e-6)
  scored = translate.target_log_probs(params, src, src, cfg)
  np.testing.assert_array_equal(
    translate.target_log_probs((params, params), src, src, (cfg, cfg)), scored)
