"""The Transformer modules: masking, positional encodings, parameter counts, cache, reuse."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import wmt
from transformer.decoding.translate import init_cache, prefill_cache
from transformer.nn.model import (
  Encoder,
  FeedForward,
  ModelConfig,
  MultiHeadAttention,
  Transformer,
  attention_windows,
  sinusoidal_positions,
  tied_logits,
)
from transformer.training.train_state import cross_entropy, loss_sums

TINY = ModelConfig(vocab_size=40, num_layers=2, d_model=32, d_ff=64, num_heads=4,
                         max_len=32, dropout_rate=0.0)


def _tokens(rng, shape, vocab=40):
  return jnp.asarray(rng.integers(2, vocab, size=shape), jnp.int32)


def _init(cfg, src, tgt):
  return jax.jit(Transformer(cfg).init)(jax.random.key(0), src, tgt)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_decoder_is_causal(scan_layers):
  cfg = dataclasses.replace(TINY, scan_layers=scan_layers)
  rng = np.random.default_rng(0)
  src, tgt = _tokens(rng, (2, 7)), _tokens(rng, (2, 9))
  variables = _init(cfg, src, tgt)
  logits = jax.jit(Transformer(cfg).apply)(variables, src, tgt)
  changed = tgt.at[:, 5:].set(_tokens(rng, (2, 4)))
  logits2 = jax.jit(Transformer(cfg).apply)(variables, src, changed)
  # Target token i is predicted from tokens < i (shifted right), so positions <= 5 agree.
  np.testing.assert_allclose(logits[:, :6], logits2[:, :6], atol=1e-5)
  assert not np.allclose(logits[:, 6:], logits2[:, 6:])


def test_padded_source_tokens_change_nothing():
  rng = np.random.default_rng(1)
  src = _tokens(rng, (2, 8)).at[:, 5:].set(0)
  tgt = _tokens(rng, (2, 6))
  variables = _init(TINY, src, tgt)
  logits = jax.jit(Transformer(TINY).apply)(variables, src, tgt)
  # Padding positions hold 0; the model must ignore whatever sits there after encoding,
  # so compare against a longer padded source too.
  longer = jnp.pad(src, ((0, 0), (0, 4)))
  logits2 = jax.jit(Transformer(TINY).apply)(variables, longer, tgt)
  np.testing.assert_allclose(logits, logits2, atol=1e-5)


def test_sinusoidal_positions_follow_the_formula():
  pe = sinusoidal_positions(50, 16)
  for pos in (0, 1, 7, 49):
    for i in range(8):
      np.testing.assert_allclose(pe[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / 16)), atol=1e-6)
      np.testing.assert_allclose(pe[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / 16)),
                                 atol=1e-6)


def _count_params(cfg):
  shapes = jax.eval_shape(
    lambda: Transformer(cfg).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32),
                                  jnp.ones((1, 4), jnp.int32))["params"]
  )
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes)))


@pytest.mark.parametrize("variant,expected_millions", [("base", 63), ("big", 214)])
def test_parameter_counts_of_the_paper_models(variant, expected_millions):
  cfg = ModelConfig(**wmt.get_config(variant).model)
  n = _count_params(cfg)
  assert abs(n / 1e6 - expected_millions) < 1.0, n


# Each positional encoding once, one with the scanned layer stack and one without.
@pytest.mark.parametrize("positional,scan_layers", [("sinusoidal", False), ("learned", True)])
def test_cached_decoding_equals_full_forward(scan_layers, positional):
  """30 steps: past the first two attention windows (16 and 24 positions), so a step attends
  over windows of the cache and later over the whole of it (`model.attention_windows`)."""
  cfg = dataclasses.replace(TINY, scan_layers=scan_layers, positional=positional)
  rng = np.random.default_rng(2)
  length = 30
  src = _tokens(rng, (3, 6)).at[1, 4:].set(0)
  tgt = _tokens(rng, (3, length))
  variables = _init(cfg, src, tgt)
  full = jax.jit(Transformer(cfg).apply)(variables, src, tgt)
  encoded = Transformer(cfg).apply(variables, src, method=Transformer.encode)
  cache = prefill_cache(cfg, variables["params"], encoded, src, init_cache(cfg, 3, 6, length))
  tgt_in = jnp.pad(tgt, ((0, 0), (1, 0)))[:, :-1]
  step_model = Transformer(cfg, incremental=True)

  @jax.jit
  def step(cache, token):
    logits, mutated = step_model.apply(
      {"params": variables["params"], "cache": cache}, encoded, src, token,
      method=Transformer.decode_logits, mutable=["cache"],
    )
    return logits, mutated["cache"]

  steps = []
  for t in range(length):
    logits, cache = step(cache, tgt_in[:, t:t + 1])
    steps.append(logits)
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=2e-5)


def test_attention_windows_grow_by_half_up_to_the_cache_length():
  assert attention_windows(20) == (16, 20)
  assert attention_windows(74) == (16, 24, 32, 48, 64, 74)
  assert attention_windows(64) == (16, 24, 32, 48, 64)
  assert attention_windows(200) == (16, 24, 32, 48, 64, 96, 128, 192, 200)
  assert attention_windows(7) == (7,)


@pytest.mark.parametrize("heads", [1, 2, 4, 8, 16, 32])
def test_every_head_count_builds_and_runs(heads):
  cfg = ModelConfig(vocab_size=64, num_layers=1, d_model=512, d_ff=64, num_heads=heads,
                          max_len=16, dropout_rate=0.0)
  src = jnp.ones((1, 5), jnp.int32)
  variables = _init(cfg, src, src)
  q = variables["params"]["encoder"]["layer_0"]["self_attention"]["query"]
  assert nn.unbox(q).shape == (512, heads, 512 // heads)
  out = jax.jit(Transformer(cfg).apply)(variables, src, src)
  assert out.shape == (1, 5, 64) and np.all(np.isfinite(out))


def test_head_count_that_does_not_divide_d_model_names_num_heads():
  with pytest.raises(ValueError, match="num_heads"):
    ModelConfig(d_model=512, num_heads=7)


def test_bfloat16_compute_keeps_float32_params_and_stays_close():
  rng = np.random.default_rng(3)
  src, tgt = _tokens(rng, (2, 6)), _tokens(rng, (2, 5))
  variables = _init(TINY, src, tgt)
  bf16 = dataclasses.replace(TINY, dtype="bfloat16")
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nn.unbox(_init(bf16, src, tgt))))
  out32 = jax.jit(Transformer(TINY).apply)(variables, src, tgt)
  out16 = jax.jit(Transformer(bf16).apply)(variables, src, tgt)
  assert out16.dtype == jnp.float32  # logits are float32 whatever the compute dtype
  np.testing.assert_allclose(out16, out32, atol=0.1)
  p32, p16 = jax.nn.softmax(out32), jax.nn.softmax(out16)
  assert float(jnp.abs(p32 - p16).max()) < 0.02


def test_every_parameter_has_logical_axis_names():
  rng = np.random.default_rng(4)
  src = _tokens(rng, (1, 4))
  params = _init(dataclasses.replace(TINY, positional="learned"), src, src)["params"]
  leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
  names = {n for x in leaves for n in x.names if n is not None}
  assert {"embed", "heads", "kv", "mlp", "vocab"} <= names


def test_dropout_only_in_training():
  cfg = dataclasses.replace(TINY, dropout_rate=0.3)
  rng = np.random.default_rng(5)
  src, tgt = _tokens(rng, (2, 6)), _tokens(rng, (2, 5))
  variables = _init(cfg, src, tgt)
  model = Transformer(cfg)
  a = model.apply(variables, src, tgt)
  b = model.apply(variables, src, tgt)
  np.testing.assert_array_equal(a, b)
  c = model.apply(variables, src, tgt, train=True, rngs={"dropout": jax.random.key(1)})
  assert not np.allclose(a, c)


class _Classifier(nn.Module):
  """Another Linen model that reuses the encoder and an attention layer."""

  @nn.compact
  def __call__(self, tokens):
    x = Encoder(TINY)(tokens)
    x = MultiHeadAttention(num_heads=2, d_model=32)(x, kv_mask=tokens > 0)
    x = FeedForward(d_model=32, d_ff=16)(x)
    return nn.Dense(3)(x.mean(axis=1))


def test_modules_are_reusable_in_other_linen_code():
  tokens = jnp.array([[3, 4, 5, 0], [6, 7, 0, 0]])
  model = _Classifier()
  variables = model.init(jax.random.key(0), tokens)
  out = model.apply(variables, tokens)
  assert out.shape == (2, 3)
  grads = jax.jit(jax.grad(lambda v: model.apply(v, tokens).sum()))(variables)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_modules_work_from_nnx_through_the_bridge():
  x = jnp.ones((2, 5, 32))
  # Logical axis names need a mesh to become shardings; without one, NNX must not shard
  # variables eagerly.
  with nnx.use_eager_sharding(False):
    layer = nnx.bridge.ToNNX(MultiHeadAttention(num_heads=4, d_model=32), rngs=nnx.Rngs(0))
    nnx.bridge.lazy_init(layer, x)
    y = layer(x)
  assert y.shape == (2, 5, 32)
  params = nn.unbox(nnx.to_pure_dict(nnx.state(layer, nnx.Param)))
  reference = MultiHeadAttention(num_heads=4, d_model=32).apply({"params": params}, x)
  np.testing.assert_allclose(y, reference, atol=1e-6)


def test_auto_dtype_is_float32_on_cpu_and_bfloat16_on_accelerators(monkeypatch):
  cfg = ModelConfig(dtype="auto")
  assert cfg.compute_dtype == jnp.float32  # the tests run on CPU
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert cfg.compute_dtype == jnp.bfloat16


# Each policy once, one with the scanned layer stack and one without.
@pytest.mark.parametrize("remat,scan_layers", [("full", True), ("dots", False)])
def test_rematerialisation_changes_no_gradient(remat, scan_layers):
  rng = np.random.default_rng(6)
  src, tgt = _tokens(rng, (2, 6)), _tokens(rng, (2, 5))
  base = dataclasses.replace(TINY, scan_layers=scan_layers)
  variables = _init(base, src, tgt)

  def grads(cfg):
    loss = lambda v: jnp.sum(Transformer(cfg).apply(v, src, tgt) ** 2)
    return jax.jit(jax.grad(loss))(variables)

  for a, b in zip(jax.tree.leaves(grads(base)),
                  jax.tree.leaves(grads(dataclasses.replace(base, remat=remat))), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)  # fusion order differs


# ------------------------------------------------------------------ products, loss and gradients
# Against float64 NumPy, with their gradients where they are written out.


def _f64(x):
  return np.asarray(x, np.float64)


@pytest.mark.parametrize("self_attention", [True, False])
def test_multi_head_attention_matches_numpy(self_attention):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i
  with Q_i = X W_i^Q, ... (section 3.2.2), padding keys masked."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 8)).astype(np.float32)
  memory = x if self_attention else rng.normal(size=(2, 5, 8)).astype(np.float32)
  kv_mask = np.ones(memory.shape[:2], bool)
  kv_mask[1, -1] = False
  layer = MultiHeadAttention(num_heads=4, d_model=8, head_dim=5)
  inputs_kv = None if self_attention else jnp.asarray(memory)
  params = nn.unbox(layer.init(jax.random.key(0), jnp.asarray(x), inputs_kv)["params"])
  out = layer.apply({"params": params}, jnp.asarray(x), inputs_kv, kv_mask=jnp.asarray(kv_mask))
  w = {name: _f64(params[name]) for name in ("query", "key", "value", "out")}
  q = np.einsum("bqd,dhk->bhqk", _f64(x), w["query"])
  k = np.einsum("bsd,dhk->bhsk", _f64(memory), w["key"])
  v = np.einsum("bsd,dhk->bhsk", _f64(memory), w["value"])
  logits = np.where(kv_mask[:, None, None, :], q @ np.swapaxes(k, -1, -2) / np.sqrt(5), -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  expected = np.einsum("bhqk,hkd->bqd", weights @ v, w["out"])
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_tied_logits_and_their_gradients_match_numpy():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 3, 8)).astype(np.float32)
  embedding = rng.normal(size=(11, 8)).astype(np.float32)
  logits, vjp = jax.vjp(tied_logits, jnp.asarray(x), jnp.asarray(embedding))
  assert logits.shape == (2, 3, 11) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, np.einsum("bnd,vd->bnv", _f64(x), _f64(embedding)),
                             rtol=1e-5, atol=1e-5)
  g = rng.normal(size=logits.shape)
  dx, de = vjp(jnp.asarray(g, jnp.float32))
  np.testing.assert_allclose(dx, np.einsum("bnv,vd->bnd", g, _f64(embedding)), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(de, np.einsum("bnv,bnd->vd", g, _f64(x)), rtol=1e-5, atol=1e-5)


def test_feed_forward_matches_numpy():
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.float32)
  ff = FeedForward(d_model=8, d_ff=16)
  params = nn.unbox(ff.init(jax.random.key(0), x)["params"])
  params = jax.tree.map(lambda p: p + jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
  w1, b1 = _f64(params["wi"]["kernel"]), _f64(params["wi"]["bias"])
  w2, b2 = _f64(params["wo"]["kernel"]), _f64(params["wo"]["bias"])
  expected = np.maximum(_f64(x) @ w1 + b1, 0.0) @ w2 + b2
  np.testing.assert_allclose(ff.apply({"params": params}, x), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_gradient_matches_numpy(label_smoothing):
  """d smoothed / d logits = p - q and d nll / d logits = p - onehot, q the smoothed target."""
  rng = np.random.default_rng(3)
  vocab = 7
  logits = (3 * rng.normal(size=(2, 3, vocab))).astype(np.float32)
  targets = rng.integers(0, vocab, size=(2, 3))
  w_smoothed, w_nll = rng.normal(size=(2, 2, 3))

  def objective(z):
    smoothed, nll = cross_entropy(z, jnp.asarray(targets), label_smoothing)
    return jnp.sum(smoothed * w_smoothed + nll * w_nll)

  grad = jax.grad(objective)(jnp.asarray(logits))
  z = _f64(logits)
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  onehot = np.eye(vocab)[targets]
  q = onehot * (1 - label_smoothing) + (1 - onehot) * label_smoothing / (vocab - 1)
  expected = w_smoothed[..., None] * (p - q) + w_nll[..., None] * (p - onehot)
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vocab", [7, 130])
def test_correct_counts_argmax_hits_with_ties_and_nan(vocab):
  """loss_sums counts a hit where the target is the first largest logit, NaN the largest."""
  rng = np.random.default_rng(vocab)
  logits = rng.normal(size=(4, 5, vocab)).astype(np.float32)
  logits[0, :, [1, vocab - 1]] = 9.0  # a tie across blocks: the first one counts
  logits[1, 0, [2, 3]] = 9.0  # a tie inside a block
  logits[1, 1, vocab // 2] = np.nan  # NaN wins, as in jnp.argmax
  logits[1, 2, [0, vocab - 2]] = np.nan
  targets = np.argmax(logits, -1)  # NumPy's argmax has the same rules
  targets[2] = rng.integers(1, vocab, size=5)  # some misses
  targets[3, :2] = 0  # padding is not counted
  sums = jax.jit(loss_sums, static_argnums=2)(jnp.asarray(logits), jnp.asarray(targets), 0.1)
  hits = (np.argmax(logits, -1) == targets) & (targets > 0)
  assert float(sums["correct"]) == hits.sum()
  assert targets[0, 0] == 1 and targets[1, 0] == 2 and targets[1, 1] == vocab // 2
