"""The LSTM baseline: shapes, causality, padding, cached decoding, greedy search, param matching."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decoding import search as decode_lib
from transformer.nn.model import ModelConfig, Transformer, shift_right
from transformer.nn.model_family import lstm_config_for_params, param_count
from transformer.nn.rnn import LSTMSeq2Seq

TINY = ModelConfig(
  vocab_size=40, num_layers=2, d_model=24, d_ff=64, num_heads=4, max_len=32, dropout_rate=0.0,
  kind="lstm",
)
# XLA's CPU backend optimisations roughly double the compile time of the LSTM scans and their
# gradients, and compiling dominates these tests: turn them off (results are unaffected).
_jit = functools.partial(
  jax.jit,
  compiler_options={"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True},
)
B, S, T = 3, 6, 7  # batch, source and target lengths shared by the tests (fewer compilations)
VARIANTS = {
  "attention": TINY,
  "no_attention": dataclasses.replace(TINY, lstm_attention=False),
  # Odd d_model: forward and backward encoder halves of different sizes.
  "untied_odd": dataclasses.replace(TINY, share_embeddings=False, d_model=23, d_kv=8),
}


def _tokens(rng, shape, vocab=40):
  return jnp.asarray(rng.integers(2, vocab, size=shape), jnp.int32)


@functools.cache
def _fns(cfg):
  """Jitted forward / encode / one decoding step for a config (compiled once per shape)."""
  model, step_model = LSTMSeq2Seq(cfg), LSTMSeq2Seq(cfg, incremental=True)

  def step(params, cache, encoded, src, tokens):
    logits, mutated = step_model.apply(
      {"params": params, "cache": cache},
      encoded,
      src,
      tokens,
      method=LSTMSeq2Seq.decode_logits,
      mutable=["cache"],
    )
    return logits, mutated["cache"]

  return {
    "apply": _jit(model.apply),
    "encode": _jit(functools.partial(model.apply, method=LSTMSeq2Seq.encode)),
    "step": _jit(step),
  }


@functools.cache
def _variables(cfg, seed=0):
  """Random parameters of the right structure, without compiling `init` (seconds per config:
  the properties tested here hold for any parameters; test_init covers the real init)."""
  shapes = jax.eval_shape(
    lambda: LSTMSeq2Seq(cfg).init(
      jax.random.key(0), jnp.ones((1, 2), jnp.int32), jnp.ones((1, 2), jnp.int32)
    )
  )
  rng = np.random.default_rng(seed)
  return jax.tree.map(
    lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape), s.dtype), nn.unbox(shapes)
  )


def _init_cache(cfg, batch, src_len, max_len):
  """As translate.init_cache does for the Transformer: shapes from `init`, then zeros."""
  shapes = jax.eval_shape(
    lambda: LSTMSeq2Seq(cfg, incremental=True).init(
      jax.random.key(0),
      jnp.ones((batch, src_len), jnp.int32),
      jnp.ones((batch, max_len), jnp.int32),
    )["cache"]
  )
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def test_init_shapes_dtypes_and_logical_axis_names():
  rng = np.random.default_rng(0)
  src, tgt = _tokens(rng, (B, S)), _tokens(rng, (B, T))
  variables = _jit(LSTMSeq2Seq(TINY).init)(jax.random.key(0), src, tgt)
  leaves = jax.tree.leaves(variables["params"], is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
  names = {n for x in leaves for n in x.names if n is not None}
  assert names <= {"embed", "mlp", "vocab", "heads", "kv"} and {"embed", "mlp", "vocab"} <= names
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nn.unbox(variables)))
  assert sum(x.size for x in jax.tree.leaves(nn.unbox(variables))) == param_count(TINY)
  logits = _fns(TINY)["apply"](variables, src, tgt)
  assert logits.shape == (B, T, TINY.vocab_size) and logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits))
  assert _fns(TINY)["encode"](variables, src).shape == (B, S, TINY.d_model)


@pytest.mark.parametrize("name", VARIANTS)
def test_cache_is_batch_major_and_counts_match(name):
  cfg = VARIANTS[name]
  cache = _init_cache(cfg, B, S, T)
  assert cache and all(x.shape[0] == B for x in jax.tree.leaves(cache))
  n = sum(x.size for x in jax.tree.leaves(_variables(cfg)))
  assert n == param_count(cfg)


@pytest.mark.parametrize("name", ["attention", "no_attention"])
def test_decoder_is_causal(name):
  cfg = VARIANTS[name]
  rng = np.random.default_rng(1)
  src, tgt = _tokens(rng, (B, S)), _tokens(rng, (B, T))
  fns, variables = _fns(cfg), _variables(cfg)
  logits = fns["apply"](variables, src, tgt)
  changed = tgt.at[:, 4:].set(_tokens(rng, (B, T - 4)))
  logits2 = fns["apply"](variables, src, changed)
  # Target token i is predicted from tokens < i (shifted right), so positions <= 4 agree.
  np.testing.assert_allclose(logits[:, :5], logits2[:, :5], atol=1e-6)
  assert not np.allclose(logits[:, 5:], logits2[:, 5:])


@pytest.mark.parametrize("name", ["attention", "no_attention"])
def test_source_padding_changes_nothing(name):
  cfg = VARIANTS[name]
  rng = np.random.default_rng(2)
  src = _tokens(rng, (B, S)).at[0, 4:].set(0).at[1, 2:].set(0)
  tgt = _tokens(rng, (B, T))
  fns, variables = _fns(cfg), _variables(cfg)
  logits = fns["apply"](variables, src, tgt)
  logits2 = fns["apply"](variables, jnp.pad(src, ((0, 0), (0, 3))), tgt)
  np.testing.assert_allclose(logits, logits2, atol=1e-5)
  # And the source does reach the decoder (through attention or the initial states).
  other = src.at[:, 0].set((src[:, 0] + 1) % 38 + 2)
  assert not np.allclose(logits, fns["apply"](variables, other, tgt))


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_decoding_equals_full_forward(name):
  cfg = VARIANTS[name]
  rng = np.random.default_rng(3)
  src = _tokens(rng, (B, S)).at[1, 4:].set(0)
  tgt = _tokens(rng, (B, T))
  fns, variables = _fns(cfg), _variables(cfg)
  full = fns["apply"](variables, src, tgt)
  encoded = fns["encode"](variables, src)
  cache = _init_cache(cfg, B, S, T)
  tgt_in = shift_right(tgt)
  steps = []
  # A 3-token prefix in one call (allowed by the LSTM cache), then one token per call.
  bounds = [0, 3, *range(4, T + 1)]
  for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
    logits, cache = fns["step"](variables["params"], cache, encoded, src, tgt_in[:, lo:hi])
    assert logits.shape == (B, hi - lo, cfg.vocab_size)
    steps.append(logits)
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def _reference_greedy(apply, variables, src, max_lengths, max_len, eos_id=1):
  """Greedy decoding by re-running the full teacher-forced forward pass at every step."""
  b = src.shape[0]
  seqs = np.zeros((b, max_len), np.int32)
  finished = np.zeros(b, bool)
  for step in range(max_len):
    logits = np.asarray(apply(variables, src, jnp.asarray(seqs)))  # row i sees seqs[:, :i]
    token = logits[:, step].argmax(-1).astype(np.int32)
    token = np.where(step + 1 >= max_lengths, eos_id, token)
    token = np.where(finished, 0, token)
    seqs[:, step] = token
    finished |= token == eos_id
    if finished.all():
      break
  return seqs


def _tokens_to_logits(cfg, params, encoded, src):
  step_model = LSTMSeq2Seq(cfg, incremental=True)

  def tokens_to_logits(ids, cache):
    logits, mutated = step_model.apply(
      {"params": params, "cache": cache},
      encoded,
      src,
      ids,
      method=LSTMSeq2Seq.decode_logits,
      mutable=["cache"],
    )
    return logits[:, -1, :], mutated["cache"]

  return tokens_to_logits


@pytest.mark.parametrize("name", ["attention", "no_attention"])
def test_greedy_decode_matches_stepwise_argmax_of_full_forward(name):
  cfg = VARIANTS[name]
  rng = np.random.default_rng(4)
  src = _tokens(rng, (B, S)).at[2, 3:].set(0)
  max_lengths = np.array([T, 5, 3], np.int32)
  params = _variables(cfg)["params"]

  @_jit
  def greedy(params, src):
    encoded = LSTMSeq2Seq(cfg).apply({"params": params}, src, method=LSTMSeq2Seq.encode)
    return decode_lib.greedy_decode(
      _tokens_to_logits(cfg, params, encoded, src),
      _init_cache(cfg, B, S, T),
      batch_size=B,
      max_lengths=jnp.asarray(max_lengths),
      max_len=T,
    )[0]

  got = np.asarray(greedy(params, src))
  want = _reference_greedy(_fns(cfg)["apply"], {"params": params}, src, max_lengths, T)
  np.testing.assert_array_equal(got, want)
  assert np.all((got == 1).sum(-1) == 1)


def test_beam_search_scores_agree_with_the_full_forward():
  cfg, k = TINY, 3
  rng = np.random.default_rng(6)
  src = _tokens(rng, (B, S)).at[0, 4:].set(0)
  params = _variables(cfg)["params"]

  @_jit
  def search(params, src):
    encoded = LSTMSeq2Seq(cfg).apply({"params": params}, src, method=LSTMSeq2Seq.encode)
    encoded, src_b = decode_lib.tile_beams((encoded, src), k)
    return decode_lib.beam_search(
      _tokens_to_logits(cfg, params, encoded, src_b),
      _init_cache(cfg, B, S, T),
      batch_size=B,
      beam_size=k,
      max_lengths=jnp.full((B,), T),
      max_len=T,
    )

  seqs, scores, log_probs = search(params, src)
  assert seqs.shape == (B, k, T) and np.all(np.isfinite(scores))
  # The best hypothesis's score is its log probability under the full forward pass, so the
  # cache was reordered with the beams correctly.
  best = seqs[:, 0]
  logp = jax.nn.log_softmax(_fns(cfg)["apply"]({"params": params}, src, best))
  token_logp = jnp.take_along_axis(logp, best[:, :, None], axis=-1)[:, :, 0] * (best > 0)
  want = token_logp.sum(-1) / decode_lib.length_penalty((best > 0).sum(-1), 0.6)
  np.testing.assert_allclose(scores[:, 0], want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(log_probs[:, 0], token_logp.sum(-1), rtol=1e-4, atol=1e-4)


def test_gradients_are_finite_with_dropout():
  # One layer: differentiating through the scans is the slowest compilation here.
  cfg = dataclasses.replace(TINY, num_layers=1, dropout_rate=0.2)
  rng = np.random.default_rng(7)
  src = _tokens(rng, (B, S)).at[0, 4:].set(0)
  tgt = _tokens(rng, (B, T))
  model = LSTMSeq2Seq(cfg)

  @_jit
  def loss_and_grads(params, rng):
    def loss(params):
      logits = model.apply({"params": params}, src, tgt, train=True, rngs={"dropout": rng})
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[..., None], -1))

    return jax.value_and_grad(loss)(params)

  params = _variables(cfg)["params"]
  value, grads = loss_and_grads(params, jax.random.key(1))
  leaves = jax.tree.leaves(grads)
  assert np.isfinite(value) and all(np.all(np.isfinite(g)) for g in leaves)
  assert all(float(jnp.abs(g).sum()) > 0 for g in leaves)  # every parameter is used
  value2, _ = loss_and_grads(params, jax.random.key(2))
  assert value != value2  # dropout is active in training


def test_bfloat16_compute_stays_close_to_float32():
  rng = np.random.default_rng(8)
  src, tgt = _tokens(rng, (B, S)), _tokens(rng, (B, T))
  variables = _variables(TINY)
  bf16 = dataclasses.replace(TINY, dtype="bfloat16")
  out32 = _fns(TINY)["apply"](variables, src, tgt)
  out16 = _fns(bf16)["apply"](variables, src, tgt)
  assert out16.dtype == jnp.float32
  p32, p16 = jax.nn.softmax(out32), jax.nn.softmax(out16)
  assert float(jnp.abs(p32 - p16).max()) < 0.05


def test_config_for_params_matches_a_transformer_within_5_percent():
  base = ModelConfig(
    vocab_size=64, num_layers=2, d_model=32, d_ff=128, num_heads=4, max_len=32
  )
  shapes = jax.eval_shape(
    lambda: Transformer(base).init(
      jax.random.key(0), jnp.ones((1, 2), jnp.int32), jnp.ones((1, 2), jnp.int32)
    )["params"]
  )
  target = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes)))
  cfg = lstm_config_for_params(target, base)
  assert cfg.kind == "lstm" and cfg.num_layers == base.num_layers
  error = abs(param_count(cfg) - target)
  assert error <= 0.05 * target
  # The closest width: one unit more or less is no closer.
  for d in (cfg.d_model - 1, cfg.d_model + 1):
    assert abs(param_count(dataclasses.replace(cfg, d_model=d, d_kv=8)) - target) >= error
