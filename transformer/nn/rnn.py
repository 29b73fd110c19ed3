"""An LSTM encoder-decoder baseline with the interface of `transformer.nn.model.Transformer`.

Encoder: `num_layers` bidirectional LSTM layers (forward ceil(d/2) units, backward floor(d/2),
concatenated to d), residual connections from the second layer on (Wu et al. 2016), padding
respected through `seq_lengths`. Decoder: `num_layers` unidirectional LSTM layers of d units,
residual likewise, whose initial states are a learned function (`bridge`) of the source
summary [forward state at the last real token; backward state at the first].

With `config.lstm_attention` (the default) the decoder attends over the encoder states with
Luong et al. (2015) "general" attention, score(h_t, h_s) = h_t^T W_a h_s / sqrt(d), padding
masked, and predicts from h~_t = tanh(W_c [c_t; h_t]). There is no input feeding, so the
teacher-forced decoder is one LSTM scan per layer followed by attention over all positions
at once. Without attention the source reaches the decoder only through its initial states
(Sutskever et al. 2014).

Parameters are float32 with logical axis names; the compute dtype comes from the config, but
the LSTM cell state (c, h) stays float32 so that long recurrences do not accumulate bfloat16
rounding. Attention logits, softmax and the output logits are float32.

Shapes: b = batch, s = source length, t = target length, d = d_model, V = vocabulary,
L = num_layers. Padding (token 0) is assumed to be trailing, as the input pipeline makes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.nn import attention as attn_lib
from transformer.nn.model import ModelConfig, make_dropout, shift_right

Array = jax.Array
Carry = tuple[Array, Array]  # (c, h), float32 [b, units] each


_XAVIER = nn.initializers.xavier_uniform()


def _init(names: tuple[str | None, ...], init: Callable = _XAVIER):
  return nn.with_logical_partitioning(init, names)


def _uses_attention(cfg: ModelConfig) -> bool:
  return bool(getattr(cfg, "lstm_attention", True))


def _check(cfg: ModelConfig) -> None:
  if cfg.d_model < 2:
    raise ValueError(f"model.d_model must be >= 2 for the bidirectional encoder, got {cfg.d_model}")


def _cell(cfg: ModelConfig, units: int, name: str) -> nn.OptimizedLSTMCell:
  # Named here, in the enclosing module, so parameters read layer_0/ii/kernel etc.
  return nn.OptimizedLSTMCell(
    units,
    dtype=cfg.compute_dtype,
    param_dtype=jnp.float32,
    name=name,
    kernel_init=_init(("embed", "mlp"), nn.initializers.lecun_normal()),
    recurrent_kernel_init=_init(("embed", "mlp"), nn.initializers.orthogonal()),
    bias_init=_init(("mlp",), nn.initializers.zeros),
  )


def _zero_carry(batch: int, units: int) -> Carry:
  return jnp.zeros((batch, units), jnp.float32), jnp.zeros((batch, units), jnp.float32)


class TokenEmbed(nn.Module):
  """Token embedding times sqrt(d) (no positions: the recurrence orders the tokens).

  Also the pre-softmax projection when the weights are tied (`attend`).
  """

  config: ModelConfig

  def setup(self):
    cfg = self.config
    # As in model.Embed: unit-scale inputs after the sqrt(d) factor, tied logits near zero.
    self.embedding = self.param(
      "embedding",
      _init(("vocab", "embed"), nn.initializers.normal(cfg.d_model**-0.5)),
      (cfg.vocab_size, cfg.d_model),
      jnp.float32,
    )

  def __call__(self, tokens: Array) -> Array:
    """tokens int [b, n] -> [b, n, d] in the compute dtype."""
    x = jnp.take(self.embedding, tokens, axis=0) * jnp.sqrt(jnp.float32(self.config.d_model))
    return x.astype(self.config.compute_dtype)

  def attend(self, x: Array) -> Array:
    """Tied pre-softmax projection: [b, n, d] -> float32 logits [b, n, V]."""
    return jnp.einsum(
      "bnd,vd->bnv", x, self.embedding.astype(x.dtype), preferred_element_type=jnp.float32
    )


class LSTMEncoder(nn.Module):
  """Embeds the source and applies L bidirectional LSTM layers. src int [b, s] -> [b, s, d].

  Outputs at padding positions are zero. Channels [:ceil(d/2)] are the forward direction,
  the rest the backward direction.
  """

  config: ModelConfig
  shared_embedding: nn.Module | None = None

  @nn.compact
  def __call__(self, src: Array, deterministic: bool = True) -> Array:
    cfg = self.config
    _check(cfg)
    embed = self.shared_embedding or TokenEmbed(cfg, name="embed")
    src_mask = (src > 0)[:, :, None]
    lengths = jnp.sum(src > 0, axis=-1).astype(jnp.int32)
    forward_units = cfg.d_model - cfg.d_model // 2
    x = make_dropout(cfg)(embed(src), deterministic=deterministic)
    for i in range(cfg.num_layers):
      rnn = nn.Bidirectional(
        nn.RNN(_cell(cfg, forward_units, f"layer_{i}_forward")),
        nn.RNN(_cell(cfg, cfg.d_model // 2, f"layer_{i}_backward")),
      )
      # seq_lengths: the backward direction starts at the last real token, and padding
      # never feeds into a real position in either direction.
      out = rnn(x, seq_lengths=lengths).astype(cfg.compute_dtype)
      out = make_dropout(cfg)(out, deterministic=deterministic)
      x = out if i == 0 else x + out
      x = jnp.where(src_mask, x, 0)  # padding outputs are garbage; keep them out of the sums
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


def source_summary(encoded: Array, src_mask: Array) -> Array:
  """[forward state at the last real token; backward state at the first]: [b, s, d] -> [b, d].

  src_mask bool [b, s], True for real tokens (trailing padding). Zero for an empty source.
  """
  d = encoded.shape[-1]
  forward_units = d - d // 2
  last = jnp.maximum(jnp.sum(src_mask, axis=-1) - 1, 0)  # [b]
  at_last = jnp.take_along_axis(encoded, last[:, None, None], axis=1)[:, 0]  # [b, d]
  return jnp.concatenate([at_last[:, :forward_units], encoded[:, 0, forward_units:]], axis=-1)


class LSTMDecoder(nn.Module):
  """L unidirectional LSTM layers, optional attention, projection to the vocabulary.

  tgt_in int [b, t] (target shifted right, 0 first), encoded [b, s, d], src_mask bool [b, s]
  -> float32 logits [b, t, V].

  With `decode=True` the cache collection holds, batch-major, `step` int32 [b] (tokens fed
  so far) and `carry_{l}` = (c, h) float32 [b, d] per layer. The first call (under `init`)
  creates it as zeros and leaves it so; on later calls rows with step 0 start from the
  bridged initial states, the others from the cached ones, and any number of tokens
  t >= 1 may be fed at once.
  """

  config: ModelConfig
  shared_embedding: nn.Module | None = None
  decode: bool = False

  @nn.compact
  def __call__(
    self, tgt_in: Array, encoded: Array, src_mask: Array, deterministic: bool = True
  ) -> Array:
    cfg = self.config
    _check(cfg)
    b, d = tgt_in.shape[0], cfg.d_model
    embed = self.shared_embedding or TokenEmbed(cfg, name="embed")

    summary = source_summary(encoded, src_mask)
    initial = []
    for i in range(cfg.num_layers):
      state = nn.Dense(
        2 * d,
        dtype=cfg.compute_dtype,
        param_dtype=jnp.float32,
        kernel_init=_init(("embed", "mlp")),
        bias_init=_init(("mlp",), nn.initializers.zeros),
        name=f"bridge_{i}",
      )(summary)
      c, h = jnp.split(jnp.tanh(state.astype(jnp.float32)), 2, axis=-1)
      initial.append((c, h))

    cached = None
    if self.decode:
      initialized = self.has_variable("cache", "step")
      step = self.variable("cache", "step", lambda: jnp.zeros((b,), jnp.int32))
      cached = [
        self.variable("cache", f"carry_{i}", functools.partial(_zero_carry, b, d))
        for i in range(cfg.num_layers)
      ]
      if initialized:
        fresh = (step.value == 0)[:, None]
        initial = [
          jax.tree.map(lambda new, old: jnp.where(fresh, new, old), init, var.value)
          for init, var in zip(initial, cached, strict=True)
        ]
        step.value = step.value + tgt_in.shape[1]
      else:
        cached = None  # sizing call: the cache stays zeros

    y = make_dropout(cfg)(embed(tgt_in), deterministic=deterministic)
    for i in range(cfg.num_layers):
      carry, out = nn.RNN(_cell(cfg, d, f"layer_{i}"))(
        y, initial_carry=initial[i], return_carry=True
      )
      if cached is not None:
        cached[i].value = carry
      out = make_dropout(cfg)(out.astype(cfg.compute_dtype), deterministic=deterministic)
      y = out if i == 0 else y + out

    if _uses_attention(cfg):
      query = nn.Dense(
        d,
        use_bias=False,
        dtype=cfg.compute_dtype,
        param_dtype=jnp.float32,
        kernel_init=_init(("embed", "mlp")),
        name="attention_query",
      )(y)  # W_a h_t
      # One head of the project's attention: masked, float32 softmax, zeros if no source.
      context = attn_lib.dot_product_attention(
        query[:, :, None],
        encoded[:, :, None],
        encoded[:, :, None],
        kv_mask=src_mask,
      )[:, :, 0]  # c_t [b, t, d]
      y = jnp.tanh(
        nn.Dense(
          d,
          use_bias=False,
          dtype=cfg.compute_dtype,
          param_dtype=jnp.float32,
          kernel_init=_init(("mlp", "embed")),
          name="attention_out",
        )(jnp.concatenate([context.astype(y.dtype), y], axis=-1))
      )  # h~_t = tanh(W_c [c_t; h_t])
      y = make_dropout(cfg)(y, deterministic=deterministic)

    y = nn.with_logical_constraint(y, ("batch", "length", "embed"))
    if cfg.share_embeddings:
      logits = embed.attend(y)
    else:
      logits = nn.Dense(
        cfg.vocab_size,
        use_bias=False,
        dtype=cfg.compute_dtype,
        param_dtype=jnp.float32,
        kernel_init=_init(("embed", "vocab")),
        name="logits",
      )(y).astype(jnp.float32)
    return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))


class LSTMSeq2Seq(nn.Module):
  """The LSTM encoder-decoder. `__call__(inputs, targets, train=False) -> logits [b, t, V]`.

  Same methods as `transformer.nn.model.Transformer` (`encode`, `decode_logits`, `decode`), so
  training and decoding code can take either. Of the config it reads vocab_size, num_layers,
  d_model, dropout_rate, share_embeddings, dtype and lstm_attention; the attention and
  feed-forward fields are ignored.
  """

  config: ModelConfig
  incremental: bool = False  # keep the decoder's LSTM states in the 'cache' collection

  def setup(self):
    cfg = self.config
    if cfg.share_embeddings:
      shared = TokenEmbed(cfg, name="embed")
      self.encoder = LSTMEncoder(cfg, shared_embedding=shared)
      self.decoder = LSTMDecoder(cfg, shared_embedding=shared, decode=self.incremental)
    else:
      self.encoder = LSTMEncoder(cfg)
      self.decoder = LSTMDecoder(cfg, decode=self.incremental)

  def encode(self, inputs: Array, train: bool = False) -> Array:
    """inputs int [b, s] -> encoder states [b, s, d] (compute dtype, zero at padding)."""
    return self.encoder(inputs, deterministic=not train)

  def decode_logits(
    self, encoded: Array, inputs: Array, tgt_in: Array, train: bool = False
  ) -> Array:
    """Decoder logits float32 [b, t, V] for decoder input tgt_in [b, t] (already shifted right).

    encoded: the output of `encode` for `inputs` int [b, s] (which supply the padding mask).
    """
    return self.decoder(tgt_in, encoded, inputs > 0, deterministic=not train)

  def decode(self, encoded: Array, inputs: Array, targets: Array, train: bool = False) -> Array:
    """Teacher-forced logits [b, t, V] for targets [b, t] (shifted right here)."""
    return self.decode_logits(encoded, inputs, shift_right(targets), train)

  def __call__(self, inputs: Array, targets: Array, train: bool = False) -> Array:
    """inputs int [b, s], targets int [b, t] (0 = padding) -> float32 logits [b, t, V]."""
    encoded = self.encode(inputs, train)
    return self.decode(encoded, inputs, targets, train)


def closed_form_param_count(config: ModelConfig, d_model: int) -> int:
  """Parameters of LSTMSeq2Seq(config) with d_model set to `d_model`, in closed form (cheap
  enough to search over widths; `model_family.lstm_config_for_params` checks it exactly)."""
  cell = lambda inputs, units: 4 * (inputs * units + units * units + units)  # W_i, W_h, b
  d = d_model
  n = config.num_layers * (cell(d, d - d // 2) + cell(d, d // 2))  # encoder, both directions
  n += config.num_layers * (cell(d, d) + d * 2 * d + 2 * d)  # decoder layers and their bridges
  if _uses_attention(config):
    n += d * d + 2 * d * d  # W_a, W_c
  n += config.vocab_size * d * (1 if config.share_embeddings else 3)  # embeddings, output layer
  return n
