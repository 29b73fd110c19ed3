"""Export to Hugging Face's Marian format: a workdir's parameters as a directory that
`MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load.

    python -m transformer.main --mode=export --format=marian --workdir=runs/numbers --output=DIR

Since transformers 5 dropped its Flax models, this is how a model trained here reaches the
Hugging Face hub, transformers pipelines and ONNX. The directory holds `config.json`,
`generation_config.json`, `model.safetensors` (written with NumPy, safetensors_file.py),
`source.spm`, `target.spm`, `vocab.json` and `tokenizer_config.json`, as `save_pretrained`
writes them for OPUS-MT models. It is the inverse of the import (interop/marian.py), whose
docstring lists how Marian differs from the paper:

  - ids: Marian's id m is the project's (m + 1) % V (`</s>` 0, `<unk>` 1, `<pad>` V - 1); the
    embedding rows and the logits bias rotate the other way, and vocab.json lists the
    vocabulary's pieces in Marian's order. A vocabulary trained here serves both sides, so it
    is both source.spm and target.spm; an imported model's own files are written back.
  - positions: Marian's sinusoids are [sin of every frequency | cos of every frequency];
    the paper's interleaved sinusoids (`model.positional='sinusoidal'`) are the same values
    with the model dimension permuted, so every weight is permuted along that dimension
    (embeddings, norms, projections): the same function, computed in another order.
  - biases: a model without attention or logits biases gets zeros, which are the same.
  - the rest maps one to one (layers, heads, d_ff, activation, embedding scaling).

What Marian cannot express is refused with one line naming the field, before anything is
written: pre-LN (`model.pre_layer_norm`), a LayerNorm epsilon other than PyTorch's 1e-5
(`model.layer_norm_epsilon`), learned positions, untied embeddings, a custom `model.d_kv`,
the LSTM baseline.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from transformer import safetensors_file, storage
from transformer.data import marian_tokenizer
from transformer.data.marian_tokenizer import MarianTokenizer
from transformer.errors import ConfigError
from transformer.nn.model import ModelConfig

# The import's `ACTIVATIONS` read backwards: model.activation -> Marian's activation_function.
ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu"}
LAYER_NORM_EPSILON = 1e-5  # PyTorch's LayerNorm default, which MarianMTModel always uses
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json",
         *marian_tokenizer.FILES)


def check_model(mc: ModelConfig) -> None:
  """ConfigError naming the first `model.*` field Hugging Face's Marian cannot express."""
  def refuse(field: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"model.{field}={value!r}: cannot be exported to Hugging Face's Marian: "
                       f"{why}")

  if mc.kind != "transformer":
    raise refuse("kind", mc.kind, "Marian is a Transformer")
  if mc.pre_layer_norm:
    raise refuse("pre_layer_norm", True, "MarianMTModel normalises after each sublayer (post-LN)")
  if mc.layer_norm_epsilon != LAYER_NORM_EPSILON:
    raise refuse("layer_norm_epsilon", mc.layer_norm_epsilon,
                 "MarianMTModel's LayerNorm epsilon is PyTorch's 1e-5, not a config field "
                 "(train with model.layer_norm_epsilon=1e-5 to export)")
  if mc.positional not in ("sinusoidal", "sinusoidal_halves"):
    raise refuse("positional", mc.positional, "Marian's positions are fixed sinusoids")
  if not mc.share_embeddings:
    raise refuse("share_embeddings", False, "Marian ties both embeddings and the output "
                 "projection")
  if mc.d_kv and mc.d_kv * mc.num_heads != mc.d_model:
    raise refuse("d_kv", mc.d_kv, "Marian's heads split d_model (d_kv = d_model / num_heads)")
  if mc.activation not in ACTIVATIONS:
    raise refuse("activation", mc.activation, f"Marian has {', '.join(ACTIVATIONS)}")
  if mc.d_model % 2:
    raise refuse("d_model", mc.d_model, "Marian's sinusoids need an even d_model")


def halves_permutation(d_model: int) -> np.ndarray:
  """perm with x_halves = x_interleaved[..., perm]: the sines (even dimensions) first, then
  the cosines (odd ones), as Marian lays out the paper's sinusoids."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def _unstacked(params: dict[str, Any], mc: ModelConfig) -> dict[str, Any]:
  """Layers as `layer_i` entries, whether or not they were scanned (`model.scan_layers`)."""
  out = {k: v for k, v in params.items() if k not in ("encoder", "decoder")}
  for side in ("encoder", "decoder"):
    tree = dict(params[side])
    if "layers" in tree:
      stacked = tree.pop("layers")
      for i in range(mc.num_layers):
        tree[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
    out[side] = tree
  return out


def marian_tensors(params: Any, mc: ModelConfig) -> dict[str, np.ndarray]:
  """The project's parameters -> MarianMTModel's state dict (float32, `model.` names)."""
  p = _unstacked(jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(params)), mc)
  d, h, k, v = mc.d_model, mc.num_heads, mc.d_model // mc.num_heads, mc.vocab_size
  perm = halves_permutation(d) if mc.positional == "sinusoidal" else np.arange(d)

  def norm(tree: dict[str, Any], name: str) -> dict[str, np.ndarray]:
    return {f"{name}.weight": tree["scale"][perm], f"{name}.bias": tree["bias"][perm]}

  def attention(tree: dict[str, Any], name: str) -> dict[str, np.ndarray]:
    out = {}
    for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
      out[f"{name}.{theirs}.weight"] = tree[ours][perm].reshape(d, h * k).T  # [out, in]
      out[f"{name}.{theirs}.bias"] = tree.get(f"{ours}_bias", np.zeros((h, k), np.float32)
                                              ).reshape(h * k)
    out[f"{name}.out_proj.weight"] = tree["out"].reshape(h * k, d)[:, perm].T
    out[f"{name}.out_proj.bias"] = tree.get("out_bias", np.zeros(d, np.float32))[perm]
    return out

  tensors = {"model.shared.weight": np.roll(p["embed"]["embedding"], -1, axis=0)[:, perm]}
  bias = p["decoder"].get("logits_bias", np.zeros(v, np.float32))
  tensors["final_logits_bias"] = np.roll(bias, -1)[None, :]
  for side in ("encoder", "decoder"):
    for i in range(mc.num_layers):
      layer, prefix = p[side][f"layer_{i}"], f"model.{side}.layers.{i}"
      ff = layer["feed_forward"]
      tensors.update({
        f"{prefix}.fc1.weight": ff["wi"]["kernel"][perm].T,
        f"{prefix}.fc1.bias": ff["wi"].get("bias", np.zeros(mc.d_ff, np.float32)),
        f"{prefix}.fc2.weight": ff["wo"]["kernel"][:, perm].T,
        f"{prefix}.fc2.bias": ff["wo"].get("bias", np.zeros(d, np.float32))[perm],
      })
      tensors.update(norm(layer["feed_forward_block"]["norm"], f"{prefix}.final_layer_norm"))
      tensors.update(attention(layer["self_attention"], f"{prefix}.self_attn"))
      block = "attention_block" if side == "encoder" else "self_attention_block"
      tensors.update(norm(layer[block]["norm"], f"{prefix}.self_attn_layer_norm"))
      if side == "decoder":
        tensors.update(attention(layer["cross_attention"], f"{prefix}.encoder_attn"))
        tensors.update(norm(layer["cross_attention_block"]["norm"],
                            f"{prefix}.encoder_attn_layer_norm"))
  flat = traverse_util.flatten_dict(p)
  unknown = [k for k in flat if k[-1] not in ("embedding", "logits_bias", "kernel", "bias",
                                                "scale", "query", "key", "value", "out",
                                                "query_bias", "key_bias", "value_bias",
                                                "out_bias")]
  if unknown:  # a parameter this mapping does not know would be dropped: this module's bug
    raise ValueError(f"parameters the Marian mapping does not cover: {unknown[:4]}")
  return {name: np.ascontiguousarray(t, np.float32) for name, t in tensors.items()}


def hf_config(mc: ModelConfig) -> dict[str, Any]:
  """config.json of MarianMTModel for `mc`."""
  v = mc.vocab_size
  return {
    "architectures": ["MarianMTModel"], "model_type": "marian", "vocab_size": v,
    "decoder_vocab_size": v, "d_model": mc.d_model,
    "encoder_layers": mc.num_layers, "decoder_layers": mc.num_layers,
    "encoder_attention_heads": mc.num_heads, "decoder_attention_heads": mc.num_heads,
    "encoder_ffn_dim": mc.d_ff, "decoder_ffn_dim": mc.d_ff,
    "activation_function": ACTIVATIONS[mc.activation], "max_position_embeddings": mc.max_len,
    "scale_embedding": bool(mc.scale_embeddings), "dropout": float(mc.dropout_rate),
    "attention_dropout": float(mc.attention_dropout_rate), "activation_dropout": 0.0,
    "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "init_std": 0.02,
    "pad_token_id": v - 1, "decoder_start_token_id": v - 1, "eos_token_id": 0,
    "forced_eos_token_id": 0, "bos_token_id": None, "is_encoder_decoder": True, "is_decoder": False,
    "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "use_cache": True,
    "dtype": "float32",
  }


def generation_config(mc: ModelConfig, config: Any) -> dict[str, Any]:
  """generation_config.json: the search of the config's `decode` fields, pad never emitted."""
  v = mc.vocab_size
  return {"bad_words_ids": [[v - 1]], "decoder_start_token_id": v - 1, "eos_token_id": 0,
          "forced_eos_token_id": 0, "pad_token_id": v - 1, "max_length": mc.max_len,
          "num_beams": int(config.decode.beam_size)}


def tokenizer_files(tokenizer: Any, config: Any) -> dict[str, bytes]:
  """source.spm, target.spm, vocab.json and tokenizer_config.json of the vocabulary: an
  imported model's own files, or the project's one SentencePiece model on both sides."""
  if isinstance(tokenizer, MarianTokenizer):
    files = dict(tokenizer.files)
  else:
    model = storage.as_path(tokenizer.path).read_bytes()
    size = tokenizer.vocab_size
    # Marian id m holds the project's piece (m + 1) % V: </s> 0, <unk> 1, ..., <pad> V - 1.
    table = {tokenizer.id_to_piece((m + 1) % size): m for m in range(size)}
    marian_tokenizer.check_vocabulary(table, "vocab.json")
    files = {marian_tokenizer.SOURCE_SPM: model, marian_tokenizer.TARGET_SPM: model,
             marian_tokenizer.VOCAB: json.dumps(table, ensure_ascii=False, indent=2).encode()}
  settings = json.loads(files.get(marian_tokenizer.TOKENIZER_CONFIG, b"{}") or b"{}")
  settings.update({
    "source_lang": config.data.get("source_lang") or "src",
    "target_lang": config.data.get("target_lang") or "tgt",
    "tokenizer_class": "MarianTokenizer", "eos_token": marian_tokenizer.EOS,
    "unk_token": marian_tokenizer.UNK, "pad_token": marian_tokenizer.PAD,
    "model_max_length": int(config.model.max_len), "separate_vocabs": False})
  files[marian_tokenizer.TOKENIZER_CONFIG] = json.dumps(settings, indent=2).encode()
  return files


def export_marian(params: Any, mc: ModelConfig, tokenizer: Any, config: Any,
                  output_dir: str) -> str:
  """Writes the Marian directory of `params` into `output_dir` (new or empty: check it first
  with `export.check_output`, and the model with `check_model`). Returns `output_dir`."""
  check_model(mc)
  tensors = marian_tensors(params, mc)
  files = tokenizer_files(tokenizer, config)
  os.makedirs(output_dir, exist_ok=True)
  for name, data in files.items():
    storage.write_atomic(os.path.join(output_dir, name), data)
  for name, record in (("config.json", hf_config(mc)),
                       ("generation_config.json", generation_config(mc, config))):
    storage.write_atomic(os.path.join(output_dir, name), json.dumps(record, indent=2) + "\n")
  # Written last: a directory with model.safetensors is complete.
  safetensors_file.write(os.path.join(output_dir, "model.safetensors"), tensors,
                         {"format": "pt"})
  return output_dir
