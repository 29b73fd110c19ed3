"""In-flight batching (transformer/decoding/inflight.py): a pool searched through fewer slots,
refilled as sentences stop, gives every sentence the outputs of the lockstep search, bitwise,
on a toy model with a position per row and on a trained Transformer through the Translator."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_decode import make_table
from transformer.decoding import inflight
from transformer.decoding import search as search_lib

MAX_LEN = 6
SENTENCES = 11
LENGTHS = np.asarray([6, 2, 5, 1, 6, 3, 4, 6, 2, 5, 3])


def row_model(table):
  """The toy model of tests/test_decode.py with a position per row: logits from a table by
  (sentence, the row's position, token before the previous, previous token)."""

  def tokens_to_logits(ids, cache):
    rows = jnp.arange(ids.shape[0])
    # A stopped row goes on stepping until its slot is refilled: keep its reads in the table.
    index = jnp.minimum(cache["index"], MAX_LEN - 1)
    prev = ids[:, 0]
    prev2 = jnp.where(index > 0, cache["hist"][rows, jnp.maximum(index - 1, 0)], 0)
    logits = table[cache["sent"], index, prev2, prev]
    hist = cache["hist"].at[rows, index].set(prev)
    return logits, {"index": cache["index"] + 1, "sent": cache["sent"], "hist": hist}

  return tokens_to_logits


def row_cache(sentence_ids):
  n = sentence_ids.shape[0]
  return {"index": jnp.zeros((n,), jnp.int32), "sent": sentence_ids.astype(jnp.int32),
          "hist": jnp.zeros((n, MAX_LEN), jnp.int32)}


def lockstep(table, beam_size, num_hypotheses):
  return search_lib.beam_search(
    row_model(table), row_cache(jnp.arange(SENTENCES)), batch_size=SENTENCES,
    beam_size=beam_size, alpha=0.6, max_lengths=jnp.asarray(LENGTHS), max_len=MAX_LEN,
    num_hypotheses=num_hypotheses, normalize=False)


def refilled(table, beam_size, num_hypotheses, slots, refill, queue=None):
  queue = queue or refill
  pool = -(-SENTENCES // queue) * queue
  lengths = jnp.asarray(np.pad(LENGTHS, (0, pool - SENTENCES), constant_values=1))

  def fresh(start):
    return (row_cache(start + jnp.arange(queue)),
            jax.lax.dynamic_slice_in_dim(lengths, start, queue))

  return inflight.beam_search_refilled(
    row_model(table), row_cache(jnp.zeros((slots,), jnp.int32)), fresh,
    num_sentences=jnp.int32(SENTENCES), pool_size=pool, refill=refill, queue=queue,
    beam_size=beam_size, alpha=0.6, max_len=MAX_LEN, num_hypotheses=num_hypotheses,
    normalize=False)


def log_prob_table(seed, **kwargs):
  """`make_table`'s logits as log probabilities: the searches use them as they are
  (normalize=False), so what they compute is sums, divisions and comparisons, exact in any
  batch shape (a softmax over arrays of other shapes may round otherwise, as it does in a
  lockstep batch of another size)."""
  table = make_table(seed, **kwargs)
  table = table - np.log(np.sum(np.exp(table), axis=-1, keepdims=True))
  return jnp.asarray(table, jnp.float32)


# Each search (beams, n-best 1, greedy) through slots refilled one at a time and two at a time;
# one slot and every slot refilled at once, each with one search; a queue of several refills
# (the sentences made and stepped once at a time), as long as the pool and longer than the slots.
@pytest.mark.parametrize("beam_size,num_hypotheses,slots,refill,queue", [
  (3, None, 3, 1, None), (3, 1, 3, 1, None), (1, None, 3, 1, None), (3, None, 4, 2, None),
  (3, 1, 4, 2, None), (1, None, 4, 2, None), (3, None, 5, 5, None), (3, 1, 1, 1, None),
  (3, None, 3, 1, 3), (3, 1, 4, 2, 6), (1, None, 4, 2, 4), (3, None, 2, 1, 12)])
def test_a_refilled_pool_gives_every_sentence_its_lockstep_outputs(beam_size, num_hypotheses,
                                                                   slots, refill, queue):
  size = queue or refill
  table = log_prob_table(7, num_sentences=SENTENCES + size, max_len=MAX_LEN, eos_bias=0.3)
  want = jax.jit(lambda t: lockstep(t, beam_size, num_hypotheses))(table)
  got = jax.jit(lambda t: refilled(t, beam_size, num_hypotheses, slots, refill, queue))(table)
  for a, b in zip(got, want, strict=True):
    assert a.shape[0] == -(-SENTENCES // size) * size
    np.testing.assert_array_equal(np.asarray(a)[:SENTENCES], np.asarray(b))
  # Past the sentences searched: nothing.
  assert np.all(np.asarray(got[1])[SENTENCES:] == -np.inf)
  assert not np.asarray(got[0])[SENTENCES:].any()


def test_one_beam_is_greedy_search():
  table = log_prob_table(3, num_sentences=SENTENCES + 2, max_len=MAX_LEN)
  greedy, _ = jax.jit(lambda t: search_lib.greedy_decode(
    row_model(t), row_cache(jnp.arange(SENTENCES)), batch_size=SENTENCES,
    max_lengths=jnp.asarray(LENGTHS), max_len=MAX_LEN, normalize=False))(table)
  seqs = jax.jit(lambda t: refilled(t, 1, None, 4, 2))(table)[0]
  np.testing.assert_array_equal(np.asarray(seqs)[:SENTENCES, 0], np.asarray(greedy))


def test_bad_settings_are_refused():
  table = jnp.asarray(make_table(0, num_sentences=SENTENCES + 4, max_len=MAX_LEN), jnp.float32)
  with pytest.raises(ValueError, match="refill"):
    refilled(table, 2, None, 3, 4)
  with pytest.raises(ValueError, match="queue"):
    refilled(table, 2, None, 3, 2, queue=3)
  with pytest.raises(ValueError, match="batch leading"):
    inflight.beam_search_refilled(
      row_model(table), {**row_cache(jnp.zeros((2,), jnp.int32)), "step": jnp.int32(0)},
      lambda start: None, num_sentences=jnp.int32(1), pool_size=2, refill=1, max_len=MAX_LEN)


@pytest.mark.slow
@pytest.mark.parametrize("method,nbest,ensemble", [("beam", 2, False), ("greedy", 1, False),
                                                   ("beam", 1, True)])
def test_the_translator_gives_the_same_hypotheses_in_flight(tiny_trained, method, nbest,
                                                             ensemble):
  """A trained Transformer over the 8 test devices: in-flight batching (sentences of several
  padded lengths, pools smaller than the call, slots refilled) gives every sentence the
  hypotheses of lockstep batches: the same ids, and the same scores up to float32 rounding
  (XLA's kernels may round a softmax or a product otherwise in a batch of another shape, as
  lockstep batches of other sizes do)."""
  from transformer import infer
  from transformer import workdir as workdir_lib
  from transformer.data import numbers

  workdir, _, _ = tiny_trained
  config = workdir_lib.load(workdir)
  with config.unlocked():
    config.decode.method = method
    config.decode.batch_size = 16
  lockstep_config = copy.deepcopy(config)
  with lockstep_config.unlocked():
    lockstep_config.decode.in_flight = False
  model = infer.restore(config, workdir)
  translator, lockstep_translator = (infer.restore(c, workdir).translator
                                     for c in (config, lockstep_config))
  params = model.params
  if ensemble:  # the model with itself, weighted 1:3
    translator, lockstep_translator = (
      t.with_members([t.model_config], [model.layout.param_shardings], [1.0, 3.0])
      for t in (translator, lockstep_translator))
    params = (params, params)
  rng = np.random.default_rng(0)
  lines = [numbers.english(int(n)) for n in rng.integers(1, 10**6, 150)]
  lines += [" and then ".join(lines[i:i + 3]) for i in range(0, 30, 3)]
  sources = [model.tokenizer.encode(line) for line in lines]
  assert translator.in_flight_search() and not lockstep_translator.in_flight_search()
  got = translator.search_ids(params, sources, nbest=nbest)
  want = lockstep_translator.search_ids(params, sources, nbest=nbest)
  assert [[h.ids for h in hyps] for hyps in got] == [[h.ids for h in hyps] for hyps in want]
  for name in ("score", "log_prob"):
    np.testing.assert_allclose([[getattr(h, name) for h in hyps] for hyps in got],
                               [[getattr(h, name) for h in hyps] for hyps in want], rtol=1e-5)


def test_a_long_group_is_searched_by_one_pool_program(monkeypatch):
  """A padded length with more sources than a pool is cut into pools of one shape, its partly
  filled last pool too (one program per length, not one more for the remainder), which give
  every source its lockstep hypotheses; a length with fewer sources than a batch is searched
  in lockstep."""
  import flax.linen as nn
  from ml_collections import config_dict

  from transformer import sharding as sharding_lib
  from transformer.decoding import translate
  from transformer.nn.model import ModelConfig, Transformer

  monkeypatch.setattr(translate, "POOL_BATCHES", 2)
  cfg = ModelConfig(vocab_size=40, num_layers=1, d_model=32, d_ff=64, num_heads=2, max_len=32,
                    dropout_rate=0.0, logits_bias=True)
  mesh = sharding_lib.make_mesh(config_dict.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1}),
                                jax.devices()[:1])
  src = jnp.ones((1, 8), jnp.int32)
  params = nn.unbox(Transformer(cfg).init(jax.random.key(0), src, src)["params"])
  bias = params["decoder"]["logits_bias"]  # EOS less likely: outputs of a few tokens
  params = {**params, "decoder": {**params["decoder"], "logits_bias": bias.at[1].set(-2.0)}}
  shardings = jax.tree.map(lambda _: jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec()), params)

  def translator(in_flight):
    decode = config_dict.ConfigDict({"method": "beam", "beam_size": 3, "alpha": 0.6,
                                     "max_extra_len": 5, "batch_size": 4,
                                     "in_flight": in_flight})
    return translate.Translator(cfg, decode, mesh, shardings, bucket_lengths=(8, 16))

  rng = np.random.default_rng(0)
  sources = [[*rng.integers(2, 40, rng.integers(2, 8)), 1] for _ in range(19)]
  sources += [[*rng.integers(2, 40, 12), 1] for _ in range(3)]
  in_flight, lockstep = translator(True), translator(False)
  plan = in_flight.pools([len(s) for s in sources])
  shapes = [(length, len(idx), shape) for idx, length, shape in plan]
  # Pools of 12: 2 batches of 4 slots, rounded up to the queue (6: 4 slots, a multiple of K).
  assert [(length, n) for length, n, _ in shapes] == [(8, 12), (8, 7), (16, 3)]
  assert shapes[0][2] == shapes[1][2] == (4, 12, 1) and shapes[2][2] is None
  for idx, _, _ in plan[:2]:  # a pool's longest sources first, its last ones short
    assert [len(sources[i]) for i in idx] == sorted((len(sources[i]) for i in idx), reverse=True)
  got = in_flight.search_ids(params, sources)
  want = lockstep.search_ids(params, sources)
  assert [h[0].ids for h in got] == [h[0].ids for h in want]
  assert len({len(h[0].ids) for h in got}) > 1  # outputs of several lengths


@pytest.mark.parametrize("method,sentences", [("beam", 8), ("greedy", 24)])
def test_greedy_pools_hold_beam_size_times_the_sentences(method, sentences):
  """A greedy pool's slots are a beam search batch's rows: `decode.beam_size` times the
  sentences (one row each), still within `decode.tokens_per_batch`; lockstep batches keep
  `decode.batch_size`."""
  from ml_collections import config_dict

  from transformer import sharding as sharding_lib
  from transformer.decoding import translate
  from transformer.nn.model import ModelConfig

  cfg = ModelConfig(vocab_size=40, num_layers=1, d_model=32, d_ff=64, num_heads=2, max_len=64)
  mesh = sharding_lib.make_mesh(config_dict.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1}),
                                jax.devices()[:1])
  decode = config_dict.ConfigDict({"method": method, "beam_size": 3, "alpha": 0.6,
                                   "max_extra_len": 5, "batch_size": 8, "tokens_per_batch": 384,
                                   "in_flight": True})
  translator = translate.Translator(cfg, decode, mesh, None, bucket_lengths=(8, 16))
  assert translator.pool_shape(8, 1000)[0] == sentences
  assert translator.pool_shape(16, 1000)[0] == min(sentences, 384 // 16)
  assert translator.rows_per_batch(8) == 8
  assert translator.pool_shape(8, 12)[0] == (16 if method == "greedy" else 8)
