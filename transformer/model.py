"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017) as Flax Linen modules.

Every module is usable on its own. Parameters are float32 and carry logical axis names
(`embed`, `heads`, `kv`, `mlp`, `vocab`, and `layers` when the layers are scanned), so that a
mesh can shard them through `nn.logical_to_mesh_sharding`; the compute dtype comes from the
config. Attention logits, softmax and the output logits are float32.

Shapes: b = batch, s = source length, t = target length, d = d_model, h = heads,
k = d_k = d_v = d_model / h, f = d_ff, V = vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer import attention as attn_lib
from transformer import dropout as dropout_lib

Array = jax.Array

POSITIONAL = ("sinusoidal", "learned")
REMAT_POLICIES = ("none", "full", "dots")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of a model family (`kind`: the Transformer, or the LSTM baseline of
  rnn.py, which reads the shared fields); names follow the paper (Table 3)."""

  vocab_size: int = 37000
  num_layers: int = 6  # N, for the encoder and for the decoder
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8  # h
  d_kv: int = 0  # d_k = d_v; 0 means d_model // num_heads as in the paper
  dropout_rate: float = 0.1  # P_drop, on sublayer outputs and embedding sums
  attention_dropout_rate: float = 0.0  # on attention weights (not in the paper)
  dropout_mask_bits: int = 8  # mask resolution (dropout.py): 8 is free on CPU, 32 exact
  max_len: int = 256  # length of the positional table
  positional: str = "sinusoidal"  # or "learned" (Table 3, row E)
  share_embeddings: bool = True  # source, target and pre-softmax weights (section 3.4)
  pre_layer_norm: bool = False  # False: LayerNorm(x + Sublayer(x)) as in the paper
  dtype: str = "auto"  # compute dtype (auto: bfloat16 on GPU/TPU, float32 on CPU); params f32
  attention: str = "xla"  # one of attention.IMPLEMENTATIONS
  attention_chunk_size: int = 128
  scan_layers: bool = False  # nn.scan over layers: compile time independent of depth
  remat: str = "none"  # rematerialisation per layer: none | full | dots
  kind: str = "transformer"  # model family: transformer | lstm (the baseline in rnn.py)
  lstm_attention: bool = True  # lstm only: attention over the encoder states

  def __post_init__(self):
    for name in ("vocab_size", "num_layers", "d_model", "d_ff", "num_heads", "max_len"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"model.{name} must be a positive integer, got {getattr(self, name)!r}")
    if self.d_kv == 0 and self.d_model % self.num_heads:
      raise ValueError(
        f"model.num_heads={self.num_heads} must divide model.d_model={self.d_model} "
        "(d_k = d_model / num_heads), or set model.d_kv"
      )
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"model.dropout_rate must be in [0, 1), got {self.dropout_rate}")
    if not 0.0 <= self.attention_dropout_rate < 1.0:
      raise ValueError(
        f"model.attention_dropout_rate must be in [0, 1), got {self.attention_dropout_rate}"
      )
    if self.dropout_mask_bits not in dropout_lib.MASK_BITS:
      raise ValueError(f"model.dropout_mask_bits must be one of {dropout_lib.MASK_BITS}, "
                       f"got {self.dropout_mask_bits!r}")
    if self.positional not in POSITIONAL:
      raise ValueError(f"model.positional must be one of {POSITIONAL}, got {self.positional!r}")
    if self.attention not in attn_lib.IMPLEMENTATIONS:
      raise ValueError(
        f"model.attention must be one of {', '.join(attn_lib.IMPLEMENTATIONS)}, "
        f"got {self.attention!r}"
      )
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"model.remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
    if self.dtype not in DTYPES:
      raise ValueError(f"model.dtype must be one of {DTYPES}, got {self.dtype!r}")

  @property
  def head_dim(self) -> int:
    return self.d_kv or self.d_model // self.num_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    if self.dtype == "auto":
      # Mixed precision where the hardware has fast bfloat16 matmuls; CPUs mostly do not.
      return jnp.dtype(jnp.bfloat16 if jax.default_backend() in ("gpu", "tpu") else jnp.float32)
    return jnp.dtype(self.dtype)


def _init(names: tuple[str | None, ...], init: Callable | None = None):
  """An initializer (Glorot uniform by default) that names the parameter's logical axes."""
  return nn.with_logical_partitioning(init or nn.initializers.xavier_uniform(), names)


def _constrain(x: Array, names: tuple[str | None, ...]) -> Array:
  """Sharding constraint at block boundaries; a no-op outside a mesh with rules."""
  return nn.with_logical_constraint(x, names)


def sinusoidal_positions(max_len: int, d_model: int) -> np.ndarray:
  """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same).

  Returns float32 [max_len, d_model].
  """
  pos = np.arange(max_len, dtype=np.float64)[:, None]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
  angle = pos / np.power(10000.0, two_i / d_model)
  pe = np.zeros((max_len, d_model), dtype=np.float64)
  pe[:, 0::2] = np.sin(angle)
  pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
  return pe.astype(np.float32)


def project(x: Array, w: Array, inputs: int = 1) -> Array:
  """x [..., *w.shape[:inputs]] times w, contracting those axes: [..., *w.shape[inputs:]].

  As one 2-D matrix product of the tokens flattened into rows: XLA:CPU runs the einsum
  "bqd,dhk->bqhk" and its gradients about a third more slowly, with transposes of the
  activations around the products.
  """
  lead = x.shape[:x.ndim - inputs]
  d_in = int(np.prod(w.shape[:inputs]))
  y = x.reshape(-1, d_in) @ w.reshape(d_in, -1)
  return y.reshape(*lead, *w.shape[inputs:])


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

  Self-attention when `inputs_kv` is None, cross-attention otherwise. With `decode=True` and
  self-attention it keeps an incremental-decoding cache (collection 'cache'): the first call
  (under `init`) with full-length inputs sizes it; later calls take one token [b, 1, d] each.
  """

  num_heads: int
  d_model: int
  head_dim: int | None = None
  dropout_rate: float = 0.0
  dropout_bits: int = 8
  dtype: Any = jnp.float32
  implementation: str = "xla"
  chunk_size: int = 128
  decode: bool = False

  @nn.compact
  def __call__(
    self,
    inputs_q: Array,
    inputs_kv: Array | None = None,
    mask: Array | None = None,
    *,
    kv_mask: Array | None = None,
    is_causal: bool = False,
    q_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    deterministic: bool = True,
  ) -> Array:
    """inputs_q [b, q, d], inputs_kv [b, kv, d], mask bool broadcastable to [b, h, q, kv],
    kv_mask bool [b, kv] (True = real key), q_segment_ids int [b, q] and kv_segment_ids
    int [b, kv] (packed rows: attend within a segment only). Returns [b, q, d]."""
    head_dim = self.head_dim or self.d_model // self.num_heads
    self_attention = inputs_kv is None
    inputs_kv = inputs_q if self_attention else inputs_kv

    d_in_q, d_in_kv = inputs_q.shape[-1], inputs_kv.shape[-1]
    # W^Q, W^K, W^V: [d, h, k] per head; Glorot fans over the input and the concatenated heads.
    proj_init = nn.initializers.xavier_uniform(in_axis=0, out_axis=(1, 2))

    def weight(name, d_in):
      w = self.param(name, _init(("embed", "heads", "kv"), proj_init),
                     (d_in, self.num_heads, head_dim), jnp.float32)
      return w.astype(self.dtype)

    inputs_q = inputs_q.astype(self.dtype)
    inputs_kv = inputs_kv.astype(self.dtype)
    query = project(inputs_q, weight("query", d_in_q))
    w_k, w_v = weight("key", d_in_kv), weight("value", d_in_kv)

    def project_kv():
      return project(inputs_kv, w_k), project(inputs_kv, w_v)

    if self.decode and not self_attention:
      key, value = self._cached_cross_kv(project_kv, inputs_kv.shape[:2], head_dim)
    else:
      key, value = project_kv()
    owners = None
    if self.decode and self_attention:
      key, value, mask, kv_mask, is_causal, owners = self._update_cache(key, value, mask,
                                                                        kv_mask, is_causal)

    dropout_rng = None
    if self.dropout_rate > 0.0 and not deterministic:
      dropout_rng = self.make_rng("dropout")
    if owners is not None:
      x = _beam_group_attention(query, key, value, owners)
    else:
      x = attn_lib.dot_product_attention(
        query, key, value, mask, kv_mask=kv_mask, is_causal=is_causal,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
        dropout_rate=self.dropout_rate, dropout_rng=dropout_rng, dropout_bits=self.dropout_bits,
        deterministic=deterministic, implementation=self.implementation,
        chunk_size=self.chunk_size,
      )  # [b, q, h, k]
    # W^O: [h, k, d]; the product over (h, k) is Concat(head_1..head_h) W^O.
    w_o = self.param(
      "out", _init(("heads", "kv", "embed"),
                   nn.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2)),
      (self.num_heads, head_dim, self.d_model), jnp.float32,
    )
    return project(x, w_o.astype(self.dtype), inputs=2)

  def _cached_cross_kv(self, project_kv, batch_and_length, head_dim):
    """Encoder-side keys and values, projected at the first decoding step only.

    They depend on the encoder output alone, and recomputing them each step would cost
    more than the rest of the step (2 * s * d^2 per layer against ~12 * d^2).
    """
    initialized = self.has_variable("cache", "cross_key")
    batch, length = batch_and_length
    # Stored heads-major [b, h, s, k], the layout of the attention's batched matmuls, so that
    # no step transposes the cache.
    shape = (batch, self.num_heads, length, head_dim)
    cached_key = self.variable("cache", "cross_key", jnp.zeros, shape, self.dtype)
    cached_value = self.variable("cache", "cross_value", jnp.zeros, shape, self.dtype)
    if initialized and not self.has_variable("cache", "cross_ready"):
      # Filled before the decoding loop (`translate.prefill_cache` drops the flag): a plain
      # read, with no conditional whose output layout would force a copy every step.
      return jnp.swapaxes(cached_key.value, 1, 2), jnp.swapaxes(cached_value.value, 1, 2)
    ready = self.variable("cache", "cross_ready", lambda: jnp.zeros(shape[:1], bool))
    if not initialized:
      return project_kv()

    def project():
      return tuple(jnp.swapaxes(x, 1, 2) for x in project_kv())

    key, value = jax.lax.cond(
      ready.value[0], lambda: (cached_key.value, cached_value.value), project
    )
    cached_key.value, cached_value.value = key, value
    ready.value = jnp.ones_like(ready.value)
    return jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)

  def _update_cache(self, key, value, mask, kv_mask, is_causal):
    """Writes the step's key and value at the cache index; returns what attention reads.

    Without a `kv_owner` cache entry, the step attends over its row's cache (positions up to
    the index). With one (`translate.init_cache(..., beam_size=K)`), rows come in groups of K
    (the beams of a sentence), every row keeps the keys and values it computed in place, and
    kv_owner bool [b, K, max_len] says, for the hypothesis now in a row, which row of its group
    holds its position p. Beam search then reorders only kv_owner, never the cache, and the
    step attends through it (`_beam_group_attention`; `owners` is returned, else None).
    """
    initialized = self.has_variable("cache", "cached_key")
    # Heads-major [b, h, max_len, k], as for the cross-attention cache.
    heads_major = lambda x: jnp.swapaxes(x, 1, 2)
    shape = heads_major(key).shape
    cached_key = self.variable("cache", "cached_key", jnp.zeros, shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, shape, value.dtype)
    # One index per batch row (all equal) so every cache leaf is batch-major; beam search
    # and scanned layers then treat all leaves alike.
    cache_index = self.variable(
      "cache", "cache_index", lambda: jnp.zeros((key.shape[0],), jnp.int32)
    )
    if not initialized:
      return key, value, mask, kv_mask, is_causal, None
    if key.shape[1] != 1:
      raise ValueError(f"decoding takes one token per call, got length {key.shape[1]}")
    max_len = cached_key.value.shape[2]
    index = cache_index.value[0]
    key = jax.lax.dynamic_update_slice_in_dim(cached_key.value, heads_major(key), index, axis=2)
    value = jax.lax.dynamic_update_slice_in_dim(cached_value.value, heads_major(value), index,
                                                axis=2)
    cached_key.value, cached_value.value = key, value
    cache_index.value = cache_index.value + 1
    if self.has_variable("cache", "kv_owner"):
      if mask is not None or kv_mask is not None:
        raise ValueError("beam-grouped cached attention takes no mask")
      owner = self.variable("cache", "kv_owner")
      rows, group = owner.value.shape[:2]
      # Position `index` of every row's hypothesis is the row itself.
      own = jnp.arange(group)[None, :] == (jnp.arange(rows) % group)[:, None]
      owner.value = jax.lax.dynamic_update_slice_in_dim(owner.value, own[:, :, None], index,
                                                        axis=2)
      return key, value, None, None, False, owner.value
    key, value = heads_major(key), heads_major(value)
    # The new query at position `index` sees cache positions 0..index.
    step_mask = jnp.broadcast_to(jnp.arange(max_len) <= index, (key.shape[0], max_len))
    kv_mask = step_mask if kv_mask is None else kv_mask & step_mask
    return key, value, mask, kv_mask, False, None


def _beam_group_attention(query: Array, key: Array, value: Array, owners: Array) -> Array:
  """One decoding step of attention over in-place beam caches.

  query [b, 1, h, k]; key, value: the heads-major caches [b, h, L, k]; owners bool [b, K, L]
  (`MultiHeadAttention._update_cache`), b = sentences * K. Row r's query attends to position p
  of row (r // K) * K + i where owners[r, i, p]. All K queries of a sentence are scored
  against all K rows of its cache (K times the tiny score FLOPs), so each cache is read once
  and never copied. Same arithmetic as `attention._xla_attention` over the row's own keys.
  Returns [b, 1, h, k].
  """
  rows, _, heads, head_dim = query.shape
  group, length = owners.shape[1:]
  n = rows // group
  # Sentence, key row and head lead on every side, so the caches are read as stored.
  q = query.reshape(n, group, heads, head_dim).transpose(0, 2, 1, 3)  # [n, h, r, k]
  k = key.reshape(n, group, heads, length, head_dim)  # [n, i, h, L, k]
  v = value.reshape(n, group, heads, length, head_dim)
  if n == 1:
    # One sentence (latency-bound decoding): XLA:CPU's batched dots of [K, k] x [L, k]^T
    # blocks take about half the time of the fused multiply-reduce below.
    q_rows = jnp.broadcast_to(q[:, None], (n, group, heads, group, head_dim))
    logits = jax.lax.dot_general(q_rows, k, (((4,), (4,)), ((0, 1, 2), (0, 1, 2))),
                                 preferred_element_type=jnp.float32)  # [n, i, h, r, L]
  else:
    # Scores as a fused multiply-reduce: from two sentences on, the batched dots above are up
    # to several times slower than one pass over the keys.
    logits = jnp.sum(q[:, None, :, :, None, :].astype(jnp.float32)
                     * k[:, :, :, None, :, :].astype(jnp.float32), axis=-1)  # [n, i, h, r, L]
  logits = logits * head_dim ** -0.5
  mask = owners.reshape(n, group, group, length).transpose(0, 2, 1, 3)[:, :, None]
  logits = jnp.where(mask, logits, attn_lib.MASKED)
  weights = jnp.where(mask, jax.nn.softmax(logits, axis=(1, 4)), 0.0)
  out = jax.lax.dot_general(weights.astype(value.dtype), v,
                            (((4,), (3,)), ((0, 1, 2), (0, 1, 2))))  # [n, i, h, r, k]
  out = jnp.sum(out, axis=1)  # the rows' contributions: [n, h, r, k]
  return out.transpose(0, 2, 1, 3).reshape(rows, 1, heads, head_dim).astype(query.dtype)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (section 3.3). [b, n, d] -> [b, n, d]."""

  d_model: int
  d_ff: int
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    lead = x.shape[:-1]
    # Both products on the tokens flattened into rows, as in `project`.
    h = nn.Dense(
      self.d_ff, dtype=self.dtype, param_dtype=jnp.float32,
      kernel_init=_init(("embed", "mlp")), bias_init=_init(("mlp",), nn.initializers.zeros),
      name="wi",
    )(x.reshape(-1, x.shape[-1]))
    h = nn.relu(h)
    h = _constrain(h.reshape(*lead, self.d_ff), ("batch", "length", "mlp"))
    y = nn.Dense(
      self.d_model, dtype=self.dtype, param_dtype=jnp.float32,
      kernel_init=_init(("mlp", "embed")), bias_init=_init(("embed",), nn.initializers.zeros),
      name="wo",
    )(h.reshape(-1, self.d_ff))
    return y.reshape(*lead, self.d_model)


def make_dropout(cfg: ModelConfig) -> dropout_lib.Dropout:
  """Dropout with P_drop = cfg.dropout_rate (section 5.4) and the configured mask bits."""
  return dropout_lib.Dropout(cfg.dropout_rate, cfg.dropout_mask_bits)


class _Sublayer(nn.Module):
  """Residual connection and layer norm around a sublayer (section 3.1 / 5.4).

  post (the paper): LayerNorm(x + Dropout(Sublayer(x))); pre: x + Dropout(Sublayer(LayerNorm(x))).
  """

  config: ModelConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x: Array, fn: Callable[[Array], Array]) -> Array:
    cfg = self.config
    norm = nn.LayerNorm(
      dtype=cfg.compute_dtype, param_dtype=jnp.float32, name="norm",
      scale_init=_init(("embed",), nn.initializers.ones),
      bias_init=_init(("embed",), nn.initializers.zeros),
    )
    dropout = make_dropout(cfg)
    if cfg.pre_layer_norm:
      return x + dropout(fn(norm(x)), deterministic=self.deterministic)
    return norm(x + dropout(fn(x), deterministic=self.deterministic))


def _attention(cfg: ModelConfig, name: str, decode: bool = False) -> MultiHeadAttention:
  return MultiHeadAttention(
    num_heads=cfg.num_heads, d_model=cfg.d_model, head_dim=cfg.head_dim,
    dropout_rate=cfg.attention_dropout_rate, dropout_bits=cfg.dropout_mask_bits,
    dtype=cfg.compute_dtype,
    implementation=cfg.attention, chunk_size=cfg.attention_chunk_size, decode=decode, name=name,
  )


def _feed_forward(cfg: ModelConfig) -> FeedForward:
  return FeedForward(cfg.d_model, cfg.d_ff, dtype=cfg.compute_dtype, name="feed_forward")


class EncoderLayer(nn.Module):
  """Self-attention and feed-forward sublayers. x [b, s, d], src_mask bool [b, s] -> [b, s, d].

  src_segments int [b, s] (packed rows): attention stays inside a segment.
  """

  config: ModelConfig
  deterministic: bool = True
  scanned: bool = False  # return (x, None) as nn.scan expects

  @nn.compact
  def __call__(self, x: Array, src_mask: Array, src_segments: Array | None = None):
    cfg, det = self.config, self.deterministic
    self_attention = _attention(cfg, "self_attention")
    x = _Sublayer(cfg, det, name="attention_block")(
      x, lambda y: self_attention(y, kv_mask=src_mask, q_segment_ids=src_segments,
                                  kv_segment_ids=src_segments, deterministic=det)
    )
    feed_forward = _feed_forward(cfg)
    x = _Sublayer(cfg, det, name="feed_forward_block")(
      x, lambda y: feed_forward(y, deterministic=det)
    )
    x = _constrain(x, ("batch", "length", "embed"))
    return (x, None) if self.scanned else x


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention and feed-forward sublayers.

  y [b, t, d], encoded [b, s, d], src_mask bool [b, s] -> [b, t, d]. Packed rows also pass
  tgt_segments int [b, t] and src_segments int [b, s]: a target position attends to earlier
  positions of its own segment and to the source positions of the same segment.
  """

  config: ModelConfig
  deterministic: bool = True
  decode: bool = False
  scanned: bool = False

  @nn.compact
  def __call__(self, y: Array, encoded: Array, src_mask: Array,
               tgt_segments: Array | None = None, src_segments: Array | None = None):
    cfg, det = self.config, self.deterministic
    self_attention = _attention(cfg, "self_attention", decode=self.decode)
    y = _Sublayer(cfg, det, name="self_attention_block")(
      y, lambda z: self_attention(z, is_causal=True, q_segment_ids=tgt_segments,
                                  kv_segment_ids=tgt_segments, deterministic=det)
    )
    cross_attention = _attention(cfg, "cross_attention", decode=self.decode)
    y = _Sublayer(cfg, det, name="cross_attention_block")(
      y, lambda z: cross_attention(z, encoded, kv_mask=src_mask, q_segment_ids=tgt_segments,
                                   kv_segment_ids=src_segments, deterministic=det)
    )
    feed_forward = _feed_forward(cfg)
    y = _Sublayer(cfg, det, name="feed_forward_block")(
      y, lambda z: feed_forward(z, deterministic=det)
    )
    y = _constrain(y, ("batch", "length", "embed"))
    return (y, None) if self.scanned else y


def _remat_policy(name: str):
  return {
    "full": None,  # save nothing, recompute the whole layer
    "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
  }[name]


def _layer_stack(cls, cfg: ModelConfig, x: Array, args: tuple, **kwargs) -> Array:
  """Applies cfg.num_layers copies of `cls`, unrolled or under nn.scan, with optional remat."""
  if cfg.remat != "none":
    cls = nn.remat(cls, policy=_remat_policy(cfg.remat), prevent_cse=not cfg.scan_layers)
  if cfg.scan_layers:
    scanned = nn.scan(
      cls,
      # Batch-major cache: layer axis 1, so decoding utilities see batch first everywhere.
      variable_axes={"params": 0, "cache": 1},
      split_rngs={"params": True, "dropout": True},
      in_axes=(nn.broadcast,) * len(args),
      length=cfg.num_layers,
      metadata_params={nn.PARTITION_NAME: "layers"},
    )
    x, _ = scanned(cfg, scanned=True, name="layers", **kwargs)(x, *args)
    return x
  for i in range(cfg.num_layers):
    x = cls(cfg, name=f"layer_{i}", **kwargs)(x, *args)
  return x


class Embed(nn.Module):
  """Token embedding times sqrt(d_model) (section 3.4) plus positional encoding (3.5).

  Also the pre-softmax projection when the weights are tied (`attend`).
  """

  config: ModelConfig

  def setup(self):
    cfg = self.config
    # Std d^-0.5: after the sqrt(d) scaling the embeddings have unit scale, and the tied
    # output logits start near zero.
    self.embedding = self.param(
      "embedding", _init(("vocab", "embed"), nn.initializers.normal(cfg.d_model**-0.5)),
      (cfg.vocab_size, cfg.d_model), jnp.float32,
    )
    if cfg.positional == "learned":
      self.positions = self.param(
        "positions", _init((None, "embed"), nn.initializers.normal(0.02)),
        (cfg.max_len, cfg.d_model), jnp.float32,
      )
    else:
      self.positions = jnp.asarray(sinusoidal_positions(cfg.max_len, cfg.d_model))

  def __call__(self, tokens: Array, positions: Array | None = None) -> Array:
    """tokens int [b, n]; positions int [b, n] (default 0..n-1). Returns [b, n, d]."""
    cfg = self.config
    x = jnp.take(self.embedding, tokens, axis=0) * jnp.sqrt(jnp.float32(cfg.d_model))
    if positions is None:
      pe = self.positions[None, : tokens.shape[1]]
    else:
      pe = jnp.take(self.positions, positions, axis=0)
    return (x + pe).astype(cfg.compute_dtype)

  def attend(self, x: Array) -> Array:
    """Tied pre-softmax projection: [b, n, d] -> float32 logits [b, n, V]."""
    return tied_logits(x, self.embedding)


def tied_logits(x: Array, embedding: Array) -> Array:
  """x [..., d] times the transposed embedding [V, d]: float32 logits [..., V].

  The tokens are flattened into one matrix dimension first: with the batch and length kept
  apart, XLA:CPU computes the embedding's gradient by first transposing the whole [tokens, V]
  gradient of the logits, which costs more than the product itself at d_model 256.
  """
  lead, d = x.shape[:-1], x.shape[-1]
  logits = jnp.einsum("md,vd->mv", x.reshape(-1, d), embedding.astype(x.dtype),
                      preferred_element_type=jnp.float32)
  return logits.reshape(*lead, embedding.shape[0])


class Encoder(nn.Module):
  """Embeds the source and applies N encoder layers. src int [b, s] -> [b, s, d].

  Packed rows: segment_ids int [b, s] (0 = padding) and positions int [b, s] (restarting at 0
  in each segment).
  """

  config: ModelConfig
  shared_embedding: nn.Module | None = None

  @nn.compact
  def __call__(self, src: Array, deterministic: bool = True, *,
               segment_ids: Array | None = None, positions: Array | None = None) -> Array:
    cfg = self.config
    embed = self.shared_embedding or Embed(cfg, name="embed")
    src_mask = src > 0
    x = make_dropout(cfg)(embed(src, positions), deterministic=deterministic)
    x = _constrain(x, ("batch", "length", "embed"))
    # Unpacked batches pass no segment argument at all, so their program is unchanged.
    args = (src_mask,) if segment_ids is None else (src_mask, segment_ids)
    x = _layer_stack(EncoderLayer, cfg, x, args, deterministic=deterministic)
    if cfg.pre_layer_norm:
      x = nn.LayerNorm(dtype=cfg.compute_dtype, param_dtype=jnp.float32, name="final_norm",
                       scale_init=_init(("embed",), nn.initializers.ones),
                       bias_init=_init(("embed",), nn.initializers.zeros))(x)
    return x


class Decoder(nn.Module):
  """Embeds the shifted target, applies N decoder layers, projects to the vocabulary.

  tgt_in int [b, t] (target shifted right, 0 first), encoded [b, s, d], src_mask bool [b, s]
  -> float32 logits [b, t, V]. With `decode=True`, t = 1 and positions come from the cache.
  Packed rows: segment_ids int [b, t] and positions int [b, t] of the target, src_segment_ids
  int [b, s] of the source (0 = padding on both). output_kernel [d, V]: the tied embedding
  transposed once before a decoding loop (`translate.output_kernel`), used instead of it for
  the logits (the same products; XLA:CPU multiplies a few rows by it about twice as fast).
  """

  config: ModelConfig
  shared_embedding: nn.Module | None = None
  decode: bool = False

  @nn.compact
  def __call__(self, tgt_in: Array, encoded: Array, src_mask: Array,
               deterministic: bool = True, *, segment_ids: Array | None = None,
               positions: Array | None = None, src_segment_ids: Array | None = None,
               output_kernel: Array | None = None) -> Array:
    cfg = self.config
    embed = self.shared_embedding or Embed(cfg, name="embed")
    if self.decode:
      initialized = self.has_variable("cache", "position")
      position = self.variable(
        "cache", "position", lambda: jnp.zeros((tgt_in.shape[0],), jnp.int32)
      )
      if initialized:
        positions = position.value[:, None]
        position.value = position.value + 1
    y = make_dropout(cfg)(embed(tgt_in, positions), deterministic=deterministic)
    y = _constrain(y, ("batch", "length", "embed"))
    args = (encoded, src_mask)
    if segment_ids is not None:
      args += (segment_ids, src_segment_ids)
    y = _layer_stack(DecoderLayer, cfg, y, args, deterministic=deterministic, decode=self.decode)
    if cfg.pre_layer_norm:
      y = nn.LayerNorm(dtype=cfg.compute_dtype, param_dtype=jnp.float32, name="final_norm",
                       scale_init=_init(("embed",), nn.initializers.ones),
                       bias_init=_init(("embed",), nn.initializers.zeros))(y)
    if cfg.share_embeddings and output_kernel is not None:
      logits = jnp.einsum("btd,dv->btv", y, output_kernel.astype(y.dtype),
                          preferred_element_type=jnp.float32)
    elif cfg.share_embeddings:
      logits = embed.attend(y)
    else:
      logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=cfg.compute_dtype,
                        param_dtype=jnp.float32, kernel_init=_init(("embed", "vocab")),
                        name="logits")(y).astype(jnp.float32)
    return _constrain(logits, ("batch", "length", "vocab"))


def shift_right(targets: Array, segment_ids: Array | None = None) -> Array:
  """Decoder input: targets shifted right by one, with 0 as the start token. [b, t] -> [b, t].

  With segment_ids int [b, t] (packed rows), each segment is shifted on its own: its first
  position gets the start token, not the last token of the segment before.
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  if segment_ids is None:
    return shifted
  same = segment_ids == jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(same, shifted, 0)


class Transformer(nn.Module):
  """The encoder-decoder. `__call__(inputs, targets, train=False) -> logits [b, t, V]`."""

  config: ModelConfig
  # Incremental decoding with a KV cache (named so as not to shadow the `decode` method).
  incremental: bool = False

  def setup(self):
    cfg = self.config
    if cfg.share_embeddings:
      shared = Embed(cfg, name="embed")
      self.encoder = Encoder(cfg, shared_embedding=shared)
      self.decoder = Decoder(cfg, shared_embedding=shared, decode=self.incremental)
    else:
      self.encoder = Encoder(cfg)
      self.decoder = Decoder(cfg, decode=self.incremental)

  def encode(self, inputs: Array, train: bool = False, *, segment_ids: Array | None = None,
             positions: Array | None = None) -> Array:
    """inputs int [b, s] -> encoded [b, s, d]; segment_ids, positions int [b, s] if packed."""
    return self.encoder(inputs, deterministic=not train, segment_ids=segment_ids,
                        positions=positions)

  def decode_logits(self, encoded: Array, inputs: Array, tgt_in: Array,
                    train: bool = False, *, output_kernel: Array | None = None,
                    **packing: Array | None) -> Array:
    """Decoder logits [b, t, V] for decoder input tgt_in [b, t] (already shifted right).

    `packing`: segment_ids, positions [b, t] and src_segment_ids [b, s]; output_kernel
    [d, V]: the tied embedding transposed (see `Decoder`).
    """
    return self.decoder(tgt_in, encoded, inputs > 0, deterministic=not train,
                        output_kernel=output_kernel, **packing)

  def decode(self, encoded: Array, inputs: Array, targets: Array, train: bool = False,
             **packing: Array | None) -> Array:
    """Teacher-forced logits [b, t, V] for targets [b, t] (shifted right here, per segment
    when packed)."""
    tgt_in = shift_right(targets, packing.get("segment_ids"))
    return self.decode_logits(encoded, inputs, tgt_in, train, **packing)

  def __call__(self, inputs: Array, targets: Array, train: bool = False, *,
               inputs_segmentation: Array | None = None, inputs_position: Array | None = None,
               targets_segmentation: Array | None = None,
               targets_position: Array | None = None) -> Array:
    """inputs int [b, s], targets int [b, t] (0 = padding) -> float32 logits [b, t, V].

    Packed batches (transformer/data/packing.py) also pass the segment (0 = padding) and the
    position inside it of every source and target position, int [b, s] and [b, t]: attention
    never crosses segments, positions restart per segment and each segment's decoder input is
    shifted on its own. Segments are given for both sides or for none.
    """
    if (inputs_segmentation is None) != (targets_segmentation is None):
      raise ValueError("inputs_segmentation and targets_segmentation go together")
    encoded = self.encode(inputs, train, segment_ids=inputs_segmentation,
                          positions=inputs_position)
    if targets_segmentation is None:
      return self.decode(encoded, inputs, targets, train, positions=targets_position)
    return self.decode(encoded, inputs, targets, train, segment_ids=targets_segmentation,
                       positions=targets_position, src_segment_ids=inputs_segmentation)
