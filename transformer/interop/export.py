"""Export of a trained Transformer to CTranslate2 (an optional extra: `pip install .[export]`).

    from transformer.interop import export
    from transformer import infer
    export.export_restored(infer.restore(config, "runs/numbers"), "exported/numbers")

or `python -m transformer.main --config=... --workdir=... --mode=export --format=ctranslate2
--output=DIR`. The directory gets CTranslate2's `model.bin`, `config.json` and
`shared_vocabulary.json` (the SentencePiece pieces in id order, so CTranslate2's token ids are
the project's ids), and the SentencePiece model as `spm.model` beside them:

    import ctranslate2, sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file="DIR/spm.model")
    translator = ctranslate2.Translator("DIR")
    source = sp.encode("seven", out_type=str)  # the pieces alone: CTranslate2 adds the EOS
    out = translator.translate_batch([source], beam_size=4, min_decoding_length=0)
    print(sp.decode(out[0].hypotheses[0]))

What maps, and how:
  - every model family member with kind 'transformer' and d_k = d_model / h: post-LN (the
    paper) or pre-LN (with the final norms), sinusoidal (either layout) or learned positions
    (the table is written out, so CTranslate2 uses exactly the project's positions), tied or
    separate embeddings (tied ones are written once and aliased), unrolled or scanned layers,
    the ReLU, swish or GELU activation, biases on the attention projections and on the
    output logits (an imported OPUS-MT model has them: transformer/interop/marian.py);
  - embeddings are scaled by sqrt(d_model) on both sides (unless `model.scale_embeddings` is
    off); LayerNorm epsilon is `model.layer_norm_epsilon` (Flax's 1e-6 by default);
  - the decoder starts from id 0 (the padding id, as `shift_right` does): the exported config
    names piece 0 as CTranslate2's decoder start token and piece 1 as its end token;
  - the project's sources end in EOS (`Tokenizer.encode`): the config sets `add_source_eos`,
    so CTranslate2 appends it and callers pass the SentencePiece pieces alone, as for Marian
    (OPUS-MT) or M2M-100 exports. CTranslate2's `min_decoding_length` defaults to 1 (no
    empty output); pass 0 to decode as the project does;
  - an imported OPUS-MT workdir exports its own vocabulary (the pieces in the project's id
    order, `<pad>` first) and writes `source.spm` and `target.spm` beside the model: encode
    sources with source.spm, and pass `suppress_sequences=[["<pad>"]]` to decode as
    `decode.suppress_padding` does.
Refused with a `ConfigError`: the LSTM baseline and a custom d_kv.

Beam search differs in two ways from `transformer.decoding.search.beam_search`: CTranslate2
keeps K live hypotheses by taking the top 2K extensions (the project's beam shrinks when an EOS
enters its top K), and its length penalty is length ** alpha over the tokens without the EOS (the
project's is the GNMT ((5 + length) / 6) ** alpha with the EOS counted). Greedy decoding is
the same; beam search gives the same best hypothesis when the model is confident, and is
compared with the length penalty off in tests/test_export.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import flax
import jax
import numpy as np

from transformer import storage
from transformer.data import marian_tokenizer
from transformer.data.marian_tokenizer import MarianTokenizer
from transformer.errors import ConfigError, UserError
from transformer.nn.model import ModelConfig, sinusoidal_positions

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
FORMATS = ("ctranslate2",)
SPM_NAME = "spm.model"


def _ct2():
  try:
    import ctranslate2
  except ImportError:
    raise UserError(
      "--format=ctranslate2 needs the ctranslate2 package: pip install '.[export]' "
      "(or pip install ctranslate2==4.8.5)"
    ) from None
  return ctranslate2


def check_exportable(mc: ModelConfig) -> None:
  """Raises ConfigError naming the field when CTranslate2 cannot run this model."""
  if mc.kind != "transformer":
    raise ConfigError(f"model.kind={mc.kind!r}: only the Transformer exports to CTranslate2")
  if mc.head_dim * mc.num_heads != mc.d_model:
    raise ConfigError(
      f"model.d_kv={mc.d_kv}: CTranslate2 export needs d_k = d_model / num_heads "
      f"({mc.d_model} / {mc.num_heads}); set model.d_kv=0"
    )


def synthetic_vocabulary(size: int) -> list[str]:
  """Token names for a model without a SentencePiece model (random weights): id i -> name."""
  special = ["<pad>", "</s>", "<unk>"]
  return special[:size] + [f"id{i}" for i in range(len(special), size)]


def sentencepiece_pieces(model_bytes: bytes) -> list[str]:
  """The pieces of a serialized SentencePiece model, in id order."""
  from sentencepiece import sentencepiece_model_pb2 as sp_model

  proto = sp_model.ModelProto()
  proto.ParseFromString(model_bytes)
  return [p.piece for p in proto.pieces]


def _numpy_params(params: Any) -> dict[str, np.ndarray]:
  """Flattened float32 NumPy parameters, 'a/b/c' keys, logical-axis boxes removed."""
  params = flax.core.meta.unbox(params)
  flat = flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")
  return {k: np.asarray(v, np.float32) for k, v in flat.items()}


class _Layers:
  """Per-layer parameters of one side (encoder or decoder), unrolled or scanned."""

  def __init__(self, flat: dict[str, np.ndarray], side: str, scanned: bool):
    self.flat, self.side, self.scanned = flat, side, scanned

  def get(self, layer: int, name: str) -> np.ndarray:
    if self.scanned:
      return self.flat[f"{self.side}/layers/{name}"][layer]
    return self.flat[f"{self.side}/layer_{layer}/{name}"]


def _linear(spec, weight: np.ndarray, bias: np.ndarray | None = None) -> None:
  # CTranslate2 (like PyTorch) stores [out, in].
  spec.weight = np.ascontiguousarray(weight)
  if bias is not None:
    spec.bias = np.ascontiguousarray(bias)


def _in_proj(w: np.ndarray) -> np.ndarray:
  """W^Q, W^K or W^V [d, h, k] -> [h * k, d] (head-major outputs, as CTranslate2 splits)."""
  return w.reshape(w.shape[0], -1).T


def _out_proj(w: np.ndarray) -> np.ndarray:
  """W^O [h, k, d] -> [d, h * k]."""
  return w.reshape(-1, w.shape[-1]).T


def _norm(spec, layers: _Layers, layer: int, block: str) -> None:
  spec.gamma = layers.get(layer, f"{block}/norm/scale")
  spec.beta = layers.get(layer, f"{block}/norm/bias")


def _ffn(spec, layers: _Layers, layer: int) -> None:
  _norm(spec.layer_norm, layers, layer, "feed_forward_block")
  _linear(spec.linear_0, layers.get(layer, "feed_forward/wi/kernel").T,
          layers.get(layer, "feed_forward/wi/bias"))
  _linear(spec.linear_1, layers.get(layer, "feed_forward/wo/kernel").T,
          layers.get(layer, "feed_forward/wo/bias"))


def _biases(layers: _Layers, layer: int, module: str, names: Sequence[str],
            bias: bool) -> np.ndarray | None:
  """The biases of the projections `names` of `module`, [h, k] each flattened to [h * k] (W^O's
  is [d]) and concatenated like their weights; None for a model without them."""
  if not bias:
    return None
  return np.concatenate([layers.get(layer, f"{module}/{n}_bias").reshape(-1) for n in names])


def _self_attention(spec, layers: _Layers, layer: int, block: str, bias: bool) -> None:
  get = lambda name: layers.get(layer, f"self_attention/{name}")
  _norm(spec.layer_norm, layers, layer, block)
  qkv = [_in_proj(get(name)) for name in ("query", "key", "value")]
  _linear(spec.linear[0], np.concatenate(qkv, axis=0),
          _biases(layers, layer, "self_attention", ("query", "key", "value"), bias))
  _linear(spec.linear[1], _out_proj(get("out")),
          _biases(layers, layer, "self_attention", ("out",), bias))


def _cross_attention(spec, layers: _Layers, layer: int, bias: bool) -> None:
  get = lambda name: layers.get(layer, f"cross_attention/{name}")
  _norm(spec.layer_norm, layers, layer, "cross_attention_block")
  _linear(spec.linear[0], _in_proj(get("query")),
          _biases(layers, layer, "cross_attention", ("query",), bias))
  _linear(spec.linear[1], np.concatenate([_in_proj(get("key")), _in_proj(get("value"))], 0),
          _biases(layers, layer, "cross_attention", ("key", "value"), bias))
  _linear(spec.linear[2], _out_proj(get("out")),
          _biases(layers, layer, "cross_attention", ("out",), bias))


def build_spec(params: Any, mc: ModelConfig, vocabulary: Sequence[str]):
  """The `ctranslate2.specs.TransformerSpec` of `params`, weights set, vocabularies registered.

  Args:
    params: the model's parameters (jax or NumPy arrays, boxed or not).
    mc: its model config (`check_exportable` must pass).
    vocabulary: the token of each id, len == mc.vocab_size, ids 0 and 1 = padding and EOS.
  """
  check_exportable(mc)
  if len(vocabulary) != mc.vocab_size:
    raise ConfigError(f"model.vocab_size={mc.vocab_size} but the vocabulary has "
                      f"{len(vocabulary)} pieces")
  _ct2()
  from ctranslate2.specs import common_spec, transformer_spec

  flat = _numpy_params(params)
  activation = {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH,
                "gelu": common_spec.Activation.GELU}[mc.activation]  # GELU: the erf form
  encoder = transformer_spec.TransformerEncoderSpec(mc.num_layers, mc.num_heads,
                                                    pre_norm=mc.pre_layer_norm,
                                                    activation=activation)
  decoder = transformer_spec.TransformerDecoderSpec(mc.num_layers, mc.num_heads,
                                                    pre_norm=mc.pre_layer_norm,
                                                    activation=activation)
  spec = transformer_spec.TransformerSpec(encoder, decoder)

  def embed(side: str) -> str:
    return "embed" if mc.share_embeddings else f"{side}/embed"

  for side, side_spec in (("encoder", encoder), ("decoder", decoder)):
    embeddings = side_spec.embeddings[0] if side == "encoder" else side_spec.embeddings
    embeddings.weight = flat[f"{embed(side)}/embedding"]
    side_spec.scale_embeddings = mc.scale_embeddings  # x * sqrt(d_model), section 3.4
    if mc.positional == "learned":
      side_spec.position_encodings.encodings = flat[f"{embed(side)}/positions"]
    else:
      # Written out: CTranslate2's own sinusoids are laid out differently.
      side_spec.position_encodings.encodings = sinusoidal_positions(
        mc.max_len, mc.d_model, halves=mc.positional == "sinusoidal_halves")
    if mc.pre_layer_norm:
      side_spec.layer_norm.gamma = flat[f"{side}/final_norm/scale"]
      side_spec.layer_norm.beta = flat[f"{side}/final_norm/bias"]

  enc_layers = _Layers(flat, "encoder", mc.scan_layers)
  for i, layer in enumerate(encoder.layer):
    _self_attention(layer.self_attention, enc_layers, i, "attention_block", mc.attention_bias)
    _ffn(layer.ffn, enc_layers, i)
  dec_layers = _Layers(flat, "decoder", mc.scan_layers)
  for i, layer in enumerate(decoder.layer):
    _self_attention(layer.self_attention, dec_layers, i, "self_attention_block",
                    mc.attention_bias)
    _cross_attention(layer.attention, dec_layers, i, mc.attention_bias)
    _ffn(layer.ffn, dec_layers, i)
  if mc.share_embeddings:
    decoder.projection.weight = flat["embed/embedding"]
  else:
    decoder.projection.weight = np.ascontiguousarray(flat["decoder/logits/kernel"].T)
  if mc.logits_bias:
    decoder.projection.bias = flat["decoder/logits_bias"]

  tokens = list(vocabulary)
  spec.register_source_vocabulary(tokens)
  spec.register_target_vocabulary(tokens)
  spec.config.layer_norm_epsilon = mc.layer_norm_epsilon
  # The project's decoder input starts with id 0 and its sentences end with id 1; CTranslate2
  # appends that EOS to each source, so callers pass the pieces alone.
  spec.config.decoder_start_token = tokens[PAD_ID]
  spec.config.bos_token = tokens[PAD_ID]
  spec.config.eos_token = tokens[EOS_ID]
  spec.config.add_source_eos = True
  spec.config.unk_token = tokens[UNK_ID]
  return spec


def check_request(fmt: str | None, output_dir: str | None, quantization: str | None,
                  mc: ModelConfig) -> None:
  """Everything about an export request that can be checked before restoring a checkpoint.

  Raises UserError / ConfigError (one line naming the flag or field).
  """
  if fmt is None:
    raise UserError(f"--mode=export needs --format, one of {', '.join(FORMATS)}")
  if fmt not in FORMATS:
    raise UserError(f"--format={fmt}: unsupported, must be one of {', '.join(FORMATS)}")
  check_output(output_dir)
  check_exportable(mc)
  _ct2()
  from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

  if quantization is not None and quantization not in ACCEPTED_MODEL_TYPES:
    raise UserError(f"--quantization={quantization}: must be one of "
                    f"{', '.join(ACCEPTED_MODEL_TYPES)}")


def check_output(output_dir: str | None) -> None:
  """UserError unless `output_dir` is a new or empty local directory (of any export format):
  an export never overwrites anything."""
  if not output_dir:
    raise UserError("--mode=export needs --output=DIR (a new or empty local directory)")
  if "://" in output_dir:
    raise UserError(f"--output={output_dir}: must be a local directory")
  if os.path.isfile(output_dir):
    raise UserError(f"--output={output_dir} is a file: give a new or empty directory")
  if os.path.isdir(output_dir) and os.listdir(output_dir):
    raise UserError(f"--output={output_dir} is not empty: give a new or empty directory")


def export_ctranslate2(params: Any, model_config: ModelConfig, output_dir: str, *,
                       sentencepiece_model: bytes | None = None,
                       vocabulary: Sequence[str] | None = None,
                       quantization: str | None = None,
                       files: dict[str, bytes] | None = None) -> str:
  """Writes a CTranslate2 model of `params` to `output_dir` (new or empty); returns it.

  Args:
    params: the model's parameters.
    model_config: its config.
    output_dir: a local directory that does not exist or is empty (nothing is overwritten).
    sentencepiece_model: the serialized SentencePiece model; its pieces are the vocabulary
      and it is written beside the model as spm.model.
    vocabulary: the tokens by id, when there is no SentencePiece model (default:
      `synthetic_vocabulary`).
    quantization: CTranslate2's weight type, e.g. 'int8' (default: float32 as trained).
    files: more files to write beside the model, by name (an imported OPUS-MT model's
      source.spm and target.spm).

  Raises:
    ConfigError: a model variant CTranslate2 cannot run. UserError: a bad output directory,
      or ctranslate2 not installed.
  """
  output_dir = os.fspath(output_dir)
  check_output(output_dir)
  if sentencepiece_model is not None:
    vocabulary = sentencepiece_pieces(sentencepiece_model)
  elif vocabulary is None:
    vocabulary = synthetic_vocabulary(model_config.vocab_size)
  spec = build_spec(params, model_config, vocabulary)
  spec.validate()
  spec.optimize(quantization=quantization)
  os.makedirs(output_dir, exist_ok=True)
  spec.save(output_dir)
  if sentencepiece_model is not None:
    files = {SPM_NAME: sentencepiece_model, **(files or {})}
  for name, data in (files or {}).items():
    with open(os.path.join(output_dir, name), "wb") as f:
      f.write(data)
  return output_dir


def export_restored(restored: Any, output_dir: str, quantization: str | None = None) -> str:
  """`export_ctranslate2` of an `infer.Restored` (its parameters and vocabulary)."""
  model_config = restored.translator.model_config
  tokenizer = restored.tokenizer
  if isinstance(tokenizer, MarianTokenizer):  # the pieces in the project's id order
    names = (marian_tokenizer.SOURCE_SPM, marian_tokenizer.TARGET_SPM)
    return export_ctranslate2(restored.params, model_config, output_dir,
                              vocabulary=tokenizer.pieces(), quantization=quantization,
                              files={n: tokenizer.files[n] for n in names})
  sp_bytes = storage.as_path(tokenizer.path).read_bytes()
  return export_ctranslate2(restored.params, model_config, output_dir,
                            sentencepiece_model=sp_bytes, quantization=quantization)
