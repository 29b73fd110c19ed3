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

from transformer.nn import attention as attn_lib
from transformer.nn import dropout as dropout_lib

Array = jax.Array

# sinusoidal: the paper's table, sin and cos interleaved (section 3.5); sinusoidal_halves: the
# same frequencies laid out [sin of all | cos of all], as Marian (OPUS-MT) has them.
POSITIONAL = ("sinusoidal", "learned", "sinusoidal_halves")
# The feed-forward nonlinearity: the paper's ReLU (section 3.3), or swish (SiLU) and the exact
# (erf) GELU, by the names Hugging Face gives them in Marian configs.
ACTIVATIONS = ("relu", "swish", "gelu")
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
  dropout_mask_bits: int = 8  # mask resolution (dropout.py): 8 hashes 4x less, 32 exact
  max_len: int = 256  # length of the positional table
  positional: str = "sinusoidal"  # or "learned" (Table 3, row E)
  share_embeddings: bool = True  # source, target and pre-softmax weights (section 3.4)
  pre_layer_norm: bool = False  # False: LayerNorm(x + Sublayer(x)) as in the paper
  layer_norm_epsilon: float = 1e-6  # Flax's default; Marian (PyTorch's LayerNorm) has 1e-5
  activation: str = "relu"  # of the feed-forward networks: one of ACTIVATIONS
  attention_bias: bool = False  # biases on W^Q, W^K, W^V and W^O (Marian has them)
  logits_bias: bool = False  # a bias on the output logits (Marian's final_logits_bias)
  scale_embeddings: bool = True  # embeddings times sqrt(d_model) (section 3.4)
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
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"model.activation must be one of {ACTIVATIONS}, got {self.activation!r}")
    if not 0.0 < self.layer_norm_epsilon < 1.0:
      raise ValueError(f"model.layer_norm_epsilon must be in (0, 1), got {self.layer_norm_epsilon}")
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


def sinusoidal_positions(max_len: int, d_model: int, halves: bool = False) -> np.ndarray:
  """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same).

  With `halves` the same values are laid out as Marian has them: the sines of every frequency
  first, then the cosines (PE(pos, i) = sin, PE(pos, ceil(d/2) + i) = cos).
  Returns float32 [max_len, d_model].
  """
  pos = np.arange(max_len, dtype=np.float64)[:, None]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
  angle = pos / np.power(10000.0, two_i / d_model)
  sin, cos = np.sin(angle), np.cos(angle[:, : d_model // 2])
  if halves:
    return np.concatenate([sin, cos], axis=1).astype(np.float32)
  pe = np.zeros((max_len, d_model), dtype=np.float64)
  pe[:, 0::2] = sin
  pe[:, 1::2] = cos
  return pe.astype(np.float32)


def activation_fn(name: str) -> Callable[[Array], Array]:
  """The feed-forward nonlinearity called `name` (one of ACTIVATIONS)."""
  return {"relu": nn.relu, "swish": nn.swish,
          "gelu": lambda x: nn.gelu(x, approximate=False)}[name]


# ------------------------------------------------------------------ incremental decoding
# A decoder made with `decode=True` keeps its state in the 'cache' collection. `init` with
# full-length inputs sizes the cache (the target length is that of the longest output); every
# later call names what it does with the cache, after MaxText's model modes:
MODE_PREFILL = "prefill"  # project the encoder output into the per-source entries, once
MODE_AUTOREGRESSIVE = "autoregressive"  # one target token: extend the cache and attend over it
DECODE_MODES = (MODE_PREFILL, MODE_AUTOREGRESSIVE)

# The cache entries of `MultiHeadAttention` and `Decoder`, by their name in the collection.
CROSS_KEY, CROSS_VALUE = "cross_key", "cross_value"  # [b, h, s, k] encoder-side keys, values
CACHED_KEY, CACHED_VALUE = "cached_key", "cached_value"  # [b, h, L, k] self-attention's
KV_OWNER = "kv_owner"  # bool [b, K, L]: which row of its group holds each past position
CACHE_INDEX = "cache_index"  # int [b]: each row's next position to write
POSITION = "position"  # int [b]: the decoder's next target position
# What beam search may do with them (`translate.beam_reorder_mask`). Per source: they depend on
# the encoder output alone, so the beams of a sentence share them; beam search tiles them once
# and never reorders them.
PER_SOURCE_CACHE = (CROSS_KEY, CROSS_VALUE)
# In place: every row keeps the keys and values it computed. Rows come in groups of K, the
# beams of a sentence (K = 1 without beam search), and KV_OWNER says, for the hypothesis now in
# a row, which row of its group holds each of its past positions. With K > 1 beam search
# reorders KV_OWNER only, instead of copying every layer's caches at every step; with K = 1 it
# reorders them with the rows.
IN_PLACE_CACHE = (CACHED_KEY, CACHED_VALUE)


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

  Self-attention when `inputs_kv` is None, cross-attention otherwise. With `decode=True` it
  keeps an incremental-decoding cache (collection 'cache'; entries above): `init` with
  full-length inputs sizes it, and `mode` says what a call does with it. MODE_PREFILL: a
  cross-attention projects and stores the encoder-side keys and values, a self-attention
  attends over the call's tokens as in training and leaves its cache alone.
  MODE_AUTOREGRESSIVE: a cross-attention reads the stored keys and values, a self-attention
  takes one token [b, 1, d], writes its key and value at the cache index and attends over its
  group's cache (`_cached_attention`).
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
  mode: str = MODE_AUTOREGRESSIVE  # with decode=True: one of DECODE_MODES
  use_bias: bool = False  # biases on the projections (not in the paper; Marian has them)

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
    if self.decode and self.mode not in DECODE_MODES:
      raise ValueError(f"decoding mode must be one of {DECODE_MODES}, got {self.mode!r}")
    head_dim = self.head_dim or self.d_model // self.num_heads
    self_attention = inputs_kv is None
    inputs_kv = inputs_q if self_attention else inputs_kv

    # W^Q, W^K, W^V: [d, h, k] per head; Glorot fans over the input and the concatenated heads.
    proj_init = nn.initializers.xavier_uniform(in_axis=0, out_axis=(1, 2))

    def project(name, x):
      """x [b, n, d_in] @ W [d_in, h, k] (+ bias [h, k]) -> [b, n, h, k]."""
      w = self.param(name, _init(("embed", "heads", "kv"), proj_init),
                     (x.shape[-1], self.num_heads, head_dim), jnp.float32)
      y = jnp.einsum("bnd,dhk->bnhk", x, w.astype(self.dtype))
      if self.use_bias:
        b = self.param(f"{name}_bias", _init(("heads", "kv"), nn.initializers.zeros),
                       (self.num_heads, head_dim), jnp.float32)
        y = y + b.astype(self.dtype)
      return y

    inputs_q = inputs_q.astype(self.dtype)
    inputs_kv = inputs_kv.astype(self.dtype)
    query = project("query", inputs_q)

    def project_kv():
      return project("key", inputs_kv), project("value", inputs_kv)

    x = None  # [b, q, h, k]
    if self.decode and not self_attention:
      key, value = self._encoder_side_kv(project_kv, inputs_kv.shape[:2], head_dim)
      if self.mode == MODE_AUTOREGRESSIVE and not self.is_initializing():
        if mask is not None or q_segment_ids is not None:
          raise ValueError("a cached decoding step attends over its source with kv_mask only")
        x = _cross_attention_step(query, key, value, kv_mask)
    else:
      key, value = project_kv()
    if self.decode and self_attention:
      x = self._self_attention_step(query, key, value, mask, kv_mask, q_segment_ids)
    if x is None:
      dropout_rng = None
      if self.dropout_rate > 0.0 and not deterministic:
        dropout_rng = self.make_rng("dropout")
      x = attn_lib.dot_product_attention(
        query, key, value, mask, kv_mask=kv_mask, is_causal=is_causal,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
        dropout_rate=self.dropout_rate, dropout_rng=dropout_rng, dropout_bits=self.dropout_bits,
        deterministic=deterministic, implementation=self.implementation,
        chunk_size=self.chunk_size,
      )
    # W^O: [h, k, d]; the product over (h, k) is Concat(head_1..head_h) W^O.
    w_o = self.param(
      "out", _init(("heads", "kv", "embed"),
                   nn.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2)),
      (self.num_heads, head_dim, self.d_model), jnp.float32,
    )
    out = jnp.einsum("bqhk,hkd->bqd", x, w_o.astype(self.dtype))
    if self.use_bias:
      b_o = self.param("out_bias", _init(("embed",), nn.initializers.zeros), (self.d_model,),
                       jnp.float32)
      out = out + b_o.astype(self.dtype)
    return out

  def _encoder_side_kv(self, project_kv, batch_and_length, head_dim):
    """The cross-attention's keys and values: projected by MODE_PREFILL (and `init`), stored
    and returned [b, s, h, k]; a MODE_AUTOREGRESSIVE step gets them as stored, heads-major
    [b, h, s, k] (`_cross_attention_step`).

    They depend on the encoder output alone, and projecting them at every step would cost
    more than the rest of the step (2 * s * d^2 per layer against ~12 * d^2).
    """
    # Stored heads-major [b, h, s, k], the layout the attention's batched products read.
    batch, length = batch_and_length
    shape = (batch, self.num_heads, length, head_dim)
    cached_key = self.variable("cache", CROSS_KEY, jnp.zeros, shape, self.dtype)
    cached_value = self.variable("cache", CROSS_VALUE, jnp.zeros, shape, self.dtype)
    if self.mode == MODE_AUTOREGRESSIVE and not self.is_initializing():
      return cached_key.value, cached_value.value
    key, value = project_kv()
    cached_key.value, cached_value.value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)
    return key, value

  def _self_attention_step(self, query, key, value, mask, kv_mask, segment_ids):
    """With MODE_AUTOREGRESSIVE, the attention of one step [b, 1, h, k]: writes the step's key
    and value at the cache index, marks the position as the row's own in KV_OWNER and attends
    over the group's cache. None otherwise (`init` sizes the cache from the call's length,
    MODE_PREFILL leaves it alone): the caller attends over the call's tokens."""
    batch, length, heads, head_dim = key.shape
    # Heads-major [b, h, L, k]: every step's attention reads the whole cache as a batched
    # product over (b, h); stored [b, L, h, k], the cache would be transposed at every step.
    shape = (batch, heads, length, head_dim)
    cached_key = self.variable("cache", CACHED_KEY, jnp.zeros, shape, key.dtype)
    cached_value = self.variable("cache", CACHED_VALUE, jnp.zeros, shape, value.dtype)
    owner = self.variable("cache", KV_OWNER, jnp.zeros, (batch, 1, length), bool)
    cache_index = self.variable("cache", CACHE_INDEX, jnp.zeros, (batch,), jnp.int32)
    if self.mode != MODE_AUTOREGRESSIVE or self.is_initializing():
      return None
    if length != 1:
      raise ValueError(f"decoding takes one token per call, got length {length}")
    if mask is not None or kv_mask is not None or segment_ids is not None:
      raise ValueError("a cached decoding step attends over its cache and takes no mask")
    # Each row writes at its own position (rows of a search refilled with new sentences are at
    # different steps: `inflight`); a row past the cache's end (a stopped sentence's, still
    # stepping) writes nothing.
    index = cache_index.value  # [b]
    every = jnp.arange(batch)
    cached_key.value = cached_key.value.at[every, :, index].set(key[:, 0], mode="drop")
    cached_value.value = cached_value.value.at[every, :, index].set(value[:, 0], mode="drop")
    cache_index.value = index + 1
    rows, group = owner.value.shape[:2]
    # Position `index` of every row's hypothesis is the row itself.
    own = jnp.arange(group)[None, :] == (jnp.arange(rows) % group)[:, None]  # [b, K]
    owner.value = owner.value.at[every, :, index].set(own, mode="drop")
    # Positions past a row's step are masked: attend over the smallest window of the cache
    # that holds every row's position, not over all of it (`attention_windows`).
    windows = attention_windows(cached_key.value.shape[2])

    def attend(width):
      return lambda: _cached_attention(query, cached_key.value[:, :, :width],
                                       cached_value.value[:, :, :width],
                                       owner.value[:, :, :width])

    window = jnp.searchsorted(jnp.asarray(windows), jnp.max(index) + 1)
    return jax.lax.switch(window, [attend(w) for w in windows])


def attention_windows(length: int, first: int = 16) -> tuple[int, ...]:
  """The cache prefixes a decoding step may attend over: first, 1.5 first, 2 first, 3 first,
  4 first, ... and `length`, the cache's. A step attends over the smallest that holds its
  position: windows growing by half, not doubling, attend over about 15% fewer positions of a
  corpus's steps (docs/decoding.md), at one more branch per doubling to compile."""
  windows = []
  while first < length:
    windows += [w for w in (first, first + first // 2) if w < length]
    first *= 2
  return (*windows, length)


def _cached_attention(query: Array, key: Array, value: Array, owners: Array) -> Array:
  """One decoding step of attention over the self-attention caches of a group of rows.

  query [b, 1, h, k]; key, value: the caches [b, h, L, k]; owners bool [b, K, L]. Rows come in
  groups of K (b = n K): position l of the hypothesis in row n K + j was written by row
  n K + i where owners[n K + j, i, l] (one i up to the row's step, none past it), so beams share
  the cache of a common prefix and beam search never copies a cache. Each row gathers its own
  hypothesis' keys and values [b, h, L, k] from its group and attends over them as
  `attention._xla_attention` does over a sequence's. K = 1: every row attends over its own
  cache, up to the current position. Returns [b, 1, h, k].
  """
  rows, _, heads, head_dim = query.shape
  group, length = owners.shape[1:]
  if group > 1:
    # K x L products per row, not the K x K x L of attending over the whole group with the
    # others' positions masked (several times slower on XLA:CPU: docs/decoding.md). Taken
    # along the group's axis, the sentences, heads and positions are batch axes of the
    # gather: a cache split over devices by rows or heads is gathered where it is.
    holder = jnp.argmax(owners, axis=1).reshape(rows // group, group, 1, length, 1)

    def own(x):  # [b, h, L, k] -> each row's hypothesis' [b, h, L, k]
      x = x.reshape(rows // group, group, heads, length, head_dim)
      return jnp.take_along_axis(x, holder, axis=1, mode="promise_in_bounds").reshape(key.shape)

    key, value = own(key), own(value)
  logits = jnp.einsum("bqhk,bhlk->bhql", query, key, preferred_element_type=jnp.float32)
  logits = logits * head_dim ** -0.5
  mask = jnp.any(owners, axis=1)[:, None, None, :]  # [b, 1, 1, L]
  logits = jnp.where(mask, logits, attn_lib.MASKED)
  weights = jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0)
  return jnp.einsum("bhql,bhlk->bqhk", weights.astype(value.dtype), value).astype(query.dtype)


def _cross_attention_step(query: Array, key: Array, value: Array, kv_mask: Array) -> Array:
  """One decoding step of the encoder-decoder attention, with the keys and values of each
  source stored once for the rows that decode it.

  query [n g, 1, h, k]: rows in groups of g per source (g = K, the beams of a sentence, or 1);
  key, value [n, h, s, k] as prefilled (heads-major); kv_mask bool [n, s], True for real source
  tokens. The g queries of a source form one product with its keys, which are read once, not
  once per beam. Same arithmetic as `attention._xla_attention`. Returns [n g, 1, h, k].
  """
  rows, _, heads, head_dim = query.shape
  sources = key.shape[0]
  q = query.reshape(sources, rows // sources, heads, head_dim)  # [n, g, h, k]
  logits = jnp.einsum("nghk,nhsk->nhgs", q, key, preferred_element_type=jnp.float32)
  logits = logits * head_dim ** -0.5
  mask = kv_mask[:, None, None, :]
  logits = jnp.where(mask, logits, attn_lib.MASKED)
  weights = jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0)
  # Heads-major out of the product, then one transpose of the small output: XLA:CPU runs the
  # product several times slower when asked for [n, g, h, k] directly (same bits).
  out = jnp.einsum("nhgs,nhsk->nhgk", weights.astype(value.dtype), value)
  return out.transpose(0, 2, 1, 3).reshape(rows, 1, heads, head_dim).astype(query.dtype)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (section 3.3). [b, n, d] -> [b, n, d].

  `activation` (ACTIVATIONS) replaces max(0, .), the ReLU, with swish or GELU.
  """

  d_model: int
  d_ff: int
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  activation: str = "relu"

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    h = nn.Dense(
      self.d_ff, dtype=self.dtype, param_dtype=jnp.float32,
      kernel_init=_init(("embed", "mlp")), bias_init=_init(("mlp",), nn.initializers.zeros),
      name="wi",
    )(x)
    h = _constrain(activation_fn(self.activation)(h), ("batch", "length", "mlp"))
    return nn.Dense(
      self.d_model, dtype=self.dtype, param_dtype=jnp.float32,
      kernel_init=_init(("mlp", "embed")), bias_init=_init(("embed",), nn.initializers.zeros),
      name="wo",
    )(h)


def make_dropout(cfg: ModelConfig) -> dropout_lib.Dropout:
  """Dropout with P_drop = cfg.dropout_rate (section 5.4) and the configured mask bits."""
  return dropout_lib.Dropout(cfg.dropout_rate, cfg.dropout_mask_bits)


def layer_norm(cfg: ModelConfig, name: str) -> nn.LayerNorm:
  """Layer normalization over d_model (Ba et al., 2016) with the config's epsilon."""
  return nn.LayerNorm(epsilon=cfg.layer_norm_epsilon, dtype=cfg.compute_dtype,
                      param_dtype=jnp.float32, name=name,
                      scale_init=_init(("embed",), nn.initializers.ones),
                      bias_init=_init(("embed",), nn.initializers.zeros))


class _Sublayer(nn.Module):
  """Residual connection and layer norm around a sublayer (section 3.1 / 5.4).

  post (the paper): LayerNorm(x + Dropout(Sublayer(x))); pre: x + Dropout(Sublayer(LayerNorm(x))).
  """

  config: ModelConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x: Array, fn: Callable[[Array], Array]) -> Array:
    cfg = self.config
    norm = layer_norm(cfg, "norm")
    dropout = make_dropout(cfg)
    if cfg.pre_layer_norm:
      return x + dropout(fn(norm(x)), deterministic=self.deterministic)
    return norm(x + dropout(fn(x), deterministic=self.deterministic))


def _attention(cfg: ModelConfig, name: str, decode: bool = False,
               mode: str = MODE_AUTOREGRESSIVE) -> MultiHeadAttention:
  return MultiHeadAttention(
    num_heads=cfg.num_heads, d_model=cfg.d_model, head_dim=cfg.head_dim,
    dropout_rate=cfg.attention_dropout_rate, dropout_bits=cfg.dropout_mask_bits,
    dtype=cfg.compute_dtype, implementation=cfg.attention, chunk_size=cfg.attention_chunk_size,
    decode=decode, mode=mode, use_bias=cfg.attention_bias, name=name,
  )


def _feed_forward(cfg: ModelConfig) -> FeedForward:
  return FeedForward(cfg.d_model, cfg.d_ff, dtype=cfg.compute_dtype, activation=cfg.activation,
                     name="feed_forward")


class EncoderLayer(nn.Module):
  """Self-attention and feed-forward sublayers. x [b, s, d], src_mask bool [b, s] -> [b, s, d].

  segment_ids int [b, s] (packed rows): attention stays inside a segment.
  """

  config: ModelConfig
  deterministic: bool = True
  scanned: bool = False  # return (x, None) as nn.scan expects

  @nn.compact
  def __call__(self, x: Array, src_mask: Array, segment_ids: Array | None = None):
    cfg, det = self.config, self.deterministic
    self_attention = _attention(cfg, "self_attention")
    x = _Sublayer(cfg, det, name="attention_block")(
      x, lambda y: self_attention(y, kv_mask=src_mask, q_segment_ids=segment_ids,
                                  kv_segment_ids=segment_ids, deterministic=det)
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
  segment_ids int [b, t] and src_segment_ids int [b, s]: a target position attends to earlier
  positions of its own segment and to the source positions of the same segment.
  """

  config: ModelConfig
  deterministic: bool = True
  decode: bool = False
  mode: str = MODE_AUTOREGRESSIVE  # with decode=True: one of DECODE_MODES
  scanned: bool = False

  @nn.compact
  def __call__(self, y: Array, encoded: Array, src_mask: Array,
               segment_ids: Array | None = None, src_segment_ids: Array | None = None):
    cfg, det = self.config, self.deterministic
    self_attention = _attention(cfg, "self_attention", self.decode, self.mode)
    y = _Sublayer(cfg, det, name="self_attention_block")(
      y, lambda z: self_attention(z, is_causal=True, q_segment_ids=segment_ids,
                                  kv_segment_ids=segment_ids, deterministic=det)
    )
    cross_attention = _attention(cfg, "cross_attention", self.decode, self.mode)
    y = _Sublayer(cfg, det, name="cross_attention_block")(
      y, lambda z: cross_attention(z, encoded, kv_mask=src_mask, q_segment_ids=segment_ids,
                                   kv_segment_ids=src_segment_ids, deterministic=det)
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
  """Token embedding times sqrt(d_model) (section 3.4; unscaled without
  `scale_embeddings`) plus positional encoding (3.5).

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
      self.positions = jnp.asarray(sinusoidal_positions(
        cfg.max_len, cfg.d_model, halves=cfg.positional == "sinusoidal_halves"))

  def __call__(self, tokens: Array, positions: Array | None = None) -> Array:
    """tokens int [b, n]; positions int [b, n] (default 0..n-1). Returns [b, n, d]."""
    cfg = self.config
    x = jnp.take(self.embedding, tokens, axis=0)
    if cfg.scale_embeddings:
      x = x * jnp.sqrt(jnp.float32(cfg.d_model))
    if positions is None:
      pe = self.positions[None, : tokens.shape[1]]
    else:
      pe = jnp.take(self.positions, positions, axis=0)
    return (x + pe).astype(cfg.compute_dtype)

  def attend(self, x: Array) -> Array:
    """Tied pre-softmax projection: [b, n, d] -> float32 logits [b, n, V]."""
    return tied_logits(x, self.embedding)


def tied_logits(x: Array, embedding: Array) -> Array:
  """x [..., d] times the transposed embedding [V, d]: float32 logits [..., V]."""
  return jnp.einsum("...d,vd->...v", x, embedding.astype(x.dtype),
                    preferred_element_type=jnp.float32)


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
      x = layer_norm(cfg, "final_norm")(x)
    return x


class Decoder(nn.Module):
  """Embeds the shifted target, applies N decoder layers, projects to the vocabulary.

  tgt_in int [b, t] (target shifted right, 0 first), encoded [b, s, d], src_mask bool [b, s]
  -> float32 logits [b, t, V]. Packed rows: segment_ids int [b, t] and positions int [b, t] of
  the target, src_segment_ids int [b, s] of the source (0 = padding on both).

  With `decode=True` the call's `mode` (DECODE_MODES) drives the cache: MODE_AUTOREGRESSIVE
  takes t = 1 and its position from the cache; MODE_PREFILL fills the per-source entries.
  """

  config: ModelConfig
  shared_embedding: nn.Module | None = None
  decode: bool = False

  @nn.compact
  def __call__(self, tgt_in: Array, encoded: Array, src_mask: Array,
               deterministic: bool = True, *, segment_ids: Array | None = None,
               positions: Array | None = None, src_segment_ids: Array | None = None,
               mode: str = MODE_AUTOREGRESSIVE) -> Array:
    cfg = self.config
    embed = self.shared_embedding or Embed(cfg, name="embed")
    if self.decode:
      if mode not in DECODE_MODES:
        raise ValueError(f"decoding mode must be one of {DECODE_MODES}, got {mode!r}")
      position = self.variable("cache", POSITION, jnp.zeros, (tgt_in.shape[0],), jnp.int32)
      if mode == MODE_AUTOREGRESSIVE and not self.is_initializing():
        positions = position.value[:, None]
        position.value = position.value + 1
    y = make_dropout(cfg)(embed(tgt_in, positions), deterministic=deterministic)
    y = _constrain(y, ("batch", "length", "embed"))
    args = (encoded, src_mask)
    if segment_ids is not None:
      args += (segment_ids, src_segment_ids)
    y = _layer_stack(DecoderLayer, cfg, y, args, deterministic=deterministic, decode=self.decode,
                     mode=mode)
    if cfg.pre_layer_norm:
      y = layer_norm(cfg, "final_norm")(y)
    if cfg.share_embeddings:
      logits = embed.attend(y)
    else:
      logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=cfg.compute_dtype,
                        param_dtype=jnp.float32, kernel_init=_init(("embed", "vocab")),
                        name="logits")(y).astype(jnp.float32)
    if cfg.logits_bias:
      logits = logits + self.param("logits_bias", _init(("vocab",), nn.initializers.zeros),
                                   (cfg.vocab_size,), jnp.float32)
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
  """The encoder-decoder. `__call__(inputs, targets, train=False) -> logits [b, t, V]`.

  With `incremental=True` the decoder keeps a cache (collection 'cache'), used in this order:
  `init` with full-length inputs sizes it (`translate.init_cache`); one `decode_logits` call in
  MODE_PREFILL fills its per-source entries from the encoder output
  (`translate.prefill_cache`); then one MODE_AUTOREGRESSIVE call per target token.
  """

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
                    train: bool = False, *, mode: str = MODE_AUTOREGRESSIVE,
                    **packing: Array | None) -> Array:
    """Decoder logits [b, t, V] for decoder input tgt_in [b, t] (already shifted right).

    `packing`: segment_ids, positions [b, t] and src_segment_ids [b, s]. `mode`: what an
    incremental model does with its cache (`Decoder`).
    """
    return self.decoder(tgt_in, encoded, inputs > 0, deterministic=not train, mode=mode,
                        **packing)

  def decode(self, encoded: Array, inputs: Array, targets: Array, train: bool = False,
             **packing: Array | None) -> Array:
    """Teacher-forced logits [b, t, V] for targets [b, t] (shifted right here, per segment
    when packed)."""
    tgt_in = shift_right(targets, packing.get("segment_ids"))
    return self.decode_logits(encoded, inputs, tgt_in, train, **packing)

  def __call__(self, inputs: Array, targets: Array, train: bool = False, *,
               inputs_segment_ids: Array | None = None, inputs_position: Array | None = None,
               targets_segment_ids: Array | None = None,
               targets_position: Array | None = None) -> Array:
    """inputs int [b, s], targets int [b, t] (0 = padding) -> float32 logits [b, t, V].

    Packed batches (transformer/data/packing.py) also pass the segment (0 = padding) and the
    position inside it of every source and target position, int [b, s] and [b, t]: attention
    never crosses segments, positions restart per segment and each segment's decoder input is
    shifted on its own. Segments are given for both sides or for none.
    """
    if (inputs_segment_ids is None) != (targets_segment_ids is None):
      raise ValueError("inputs_segment_ids and targets_segment_ids go together")
    encoded = self.encode(inputs, train, segment_ids=inputs_segment_ids,
                          positions=inputs_position)
    if targets_segment_ids is None:
      return self.decode(encoded, inputs, targets, train, positions=targets_position)
    return self.decode(encoded, inputs, targets, train, segment_ids=targets_segment_ids,
                       positions=targets_position, src_segment_ids=inputs_segment_ids)
