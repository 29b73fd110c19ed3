"""Import of an OPUS-MT (Marian) model: a Hugging Face Marian directory becomes a workdir.

    python -m transformer.main --mode=import --source=opus-mt-en-de --workdir=runs/opus-mt-en-de

The source directory is what `MarianMTModel.save_pretrained` and
`MarianTokenizer.save_pretrained` write (and what the Hugging Face hub serves for
Helsinki-NLP/opus-mt-*): `config.json`, the weights in `model.safetensors` (read here without
torch; `safetensors_file.py`) or `pytorch_model.bin` (read only where torch is installed),
`source.spm`, `target.spm`, `vocab.json` and `tokenizer_config.json`. Everything is checked
before any work; what this model cannot run is refused with one line naming the file and field.

The workdir gets what training leaves: its config (`config.json`, the Marian architecture in
`model.*`, the other fields from the base config), the vocabulary in `vocab/marian/`
(data/marian_tokenizer.py) and a checkpoint at step 0 with a fresh optimizer state, so that
translate, score, export, average and further training (fine-tuning) treat it as a trained
workdir. An import only ever writes a new or empty workdir.

What Marian (transformers' modeling_marian.py, 5.x) does differently from the paper, and the
`model.*` field that does it here:
  - biases on W^Q, W^K, W^V and W^O: `attention_bias`;
  - a bias added to the output logits (`final_logits_bias`): `logits_bias`;
  - the FFN's activation (`activation_function`; swish in OPUS-MT): `activation`;
  - sinusoids as [sin of every frequency | cos of every frequency], not interleaved:
    `positional='sinusoidal_halves'`;
  - PyTorch's LayerNorm epsilon, 1e-5: `layer_norm_epsilon`;
  - embeddings scaled by sqrt(d_model) only with `scale_embedding`: `scale_embeddings`;
  - ids `</s>` 0, `<unk>` 1, `<pad>` V - 1, the decoder starting from `<pad>`: the ids are
    rotated, our_id = (marian_id + 1) % V (pad -> 0, EOS -> 1, unknown -> 2), and so are the
    embedding rows and the logits bias; the project's start token 0 is then Marian's `<pad>`.
    OPUS-MT never emits `<pad>` (`bad_words_ids`): `decode.suppress_padding`.
The embeddings of both sides and the output projection are one matrix, as in section 3.4.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from ml_collections import config_dict

from transformer import safetensors_file, storage
from transformer import sharding as sharding_lib
from transformer import workdir as workdir_lib
from transformer.data import marian_tokenizer
from transformer.data.marian_tokenizer import MarianTokenizer
from transformer.errors import ConfigError, UserError
from transformer.nn.model import ModelConfig, sinusoidal_positions
from transformer.training.checkpoint import Checkpointer
from transformer.training.run_meta import run_meta
from transformer.training.train_state import TrainState
from transformer.training.trainer import Trainer
from transformer.training.validate import validate

CONFIG, GENERATION_CONFIG = "config.json", "generation_config.json"
SAFETENSORS, TORCH_WEIGHTS = "model.safetensors", "pytorch_model.bin"
REQUIRED = (CONFIG, *marian_tokenizer.FILES)
# Hugging Face's activation names -> `model.activation` (ACT2FN: swish and silu are both SiLU).
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# MarianConfig's defaults (transformers 5.x): `save_pretrained` leaves out fields that have them.
MARIAN_DEFAULTS: dict[str, Any] = {
  "vocab_size": 58101, "decoder_vocab_size": None, "max_position_embeddings": 1024,
  "encoder_layers": 12, "encoder_ffn_dim": 4096, "encoder_attention_heads": 16,
  "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
  "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "activation_function": "gelu",
  "d_model": 1024, "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0,
  "decoder_start_token_id": 58100, "scale_embedding": False, "pad_token_id": 58100,
  "eos_token_id": 0, "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
  "is_encoder_decoder": True,
}
# Keys of older (BART-style) configs that OPUS-MT's config.json files still carry, with the
# only value Marian's architecture has; transformers ignores them, so another value means
# weights trained for a model it does not run.
LEGACY_KEYS = {"normalize_before": False, "normalize_embedding": False,
               "add_final_layer_norm": False, "add_bias_logits": False,
               "static_position_embeddings": True}
LANGUAGE = re.compile(r"[\w-]+")
# A stored sinusoid table may differ from the computed one by float32 rounding.
POSITIONS_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class MarianSource:
  """A checked Marian model directory: its settings, vocabulary and weights file."""

  directory: str
  config: dict[str, Any]  # config.json
  generation: dict[str, Any]  # generation_config.json ({} without one)
  tokenizer: MarianTokenizer
  weights: str  # model.safetensors, or pytorch_model.bin without it
  model_fields: dict[str, Any]  # the ModelConfig fields of its architecture
  source_lang: str
  target_lang: str


def _read_json(path: str) -> dict[str, Any]:
  try:
    value = json.loads(storage.as_path(path).read_text())
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{path}: not JSON ({e})") from None
  if not isinstance(value, dict):
    raise UserError(f"{path}: not a JSON object")
  return value


def read_source(directory: str) -> MarianSource:
  """Checks a Marian directory before any work.

  Raises:
    UserError: one line naming the missing file, or the file and field of a value this
      project does not run (another architecture, an activation it does not have, ...).
  """
  root = storage.as_path(directory)
  if not root.is_dir():
    raise UserError(f"--source={directory}: not a directory (a Hugging Face Marian model "
                    f"directory has {', '.join(REQUIRED)} and {SAFETENSORS})")
  for name in REQUIRED:
    if not (root / name).exists():
      raise UserError(f"{root / name} not found: a Marian model directory has "
                      f"{', '.join(REQUIRED)} and {SAFETENSORS} or {TORCH_WEIGHTS}")
  weights = next((root / n for n in (SAFETENSORS, TORCH_WEIGHTS) if (root / n).exists()), None)
  if weights is None:
    raise UserError(f"{root / SAFETENSORS} not found (nor {TORCH_WEIGHTS}): the directory has "
                    "no weights")
  config = _read_json(os.fspath(root / CONFIG))
  generation = ({} if not (root / GENERATION_CONFIG).exists()
                else _read_json(os.fspath(root / GENERATION_CONFIG)))
  settings = ({} if not (root / marian_tokenizer.TOKENIZER_CONFIG).exists()
              else _read_json(os.fspath(root / marian_tokenizer.TOKENIZER_CONFIG)))
  fields = model_fields(config, os.fspath(root / CONFIG))
  where = os.fspath(root / marian_tokenizer.TOKENIZER_CONFIG)
  if settings.get("separate_vocabs"):
    raise UserError(f"{where}: separate_vocabs=true (a vocabulary per side) is not supported: "
                    "the model's embeddings are one matrix here")
  if settings.get("sp_model_kwargs"):
    raise UserError(f"{where}: sp_model_kwargs={settings['sp_model_kwargs']!r} is not "
                    "supported (SentencePiece runs with its defaults here)")
  files = {name: (root / name).read_bytes() for name in marian_tokenizer.FILES}
  if (root / marian_tokenizer.TOKENIZER_CONFIG).exists():
    files[marian_tokenizer.TOKENIZER_CONFIG] = (root / marian_tokenizer.TOKENIZER_CONFIG
                                                ).read_bytes()
  tokenizer = MarianTokenizer(files, os.fspath(root))
  if tokenizer.vocab_size != fields["vocab_size"]:
    raise UserError(f"{root / marian_tokenizer.VOCAB} has {tokenizer.vocab_size} pieces but "
                    f"{root / CONFIG} has vocab_size={fields['vocab_size']}")
  source_lang, target_lang = (settings.get(k) for k in ("source_lang", "target_lang"))
  if not all(isinstance(x, str) and LANGUAGE.fullmatch(x) for x in (source_lang, target_lang)) \
      or source_lang == target_lang:
    # Only names for the corpus fields of fine-tuning (data.train_files.<lang>).
    source_lang, target_lang = "src", "tgt"
  return MarianSource(os.fspath(root), config, generation, tokenizer, os.fspath(weights),
                      fields, source_lang, target_lang)


def model_fields(hf: dict[str, Any], where: str) -> dict[str, Any]:
  """The ModelConfig fields of a Marian config.json (`hf`, read from `where`).

  Raises:
    UserError: one line naming `where` and the field, for a value this model does not run.
  """
  def get(key: str) -> Any:
    return hf.get(key, MARIAN_DEFAULTS.get(key))

  def refuse(key: str, why: str) -> UserError:
    return UserError(f"{where}: {key}={get(key)!r} is not supported: {why}")

  if hf.get("model_type", "marian") != "marian":
    raise refuse("model_type", "only Marian (OPUS-MT) models are imported")
  for key, value in LEGACY_KEYS.items():
    if key in hf and hf[key] != value:
      raise refuse(key, f"Marian's architecture has {value} (transformers would ignore it and "
                   "run the weights as another model)")
  if get("activation_function") not in ACTIVATIONS:
    raise refuse("activation_function", f"the activations here are {', '.join(ACTIVATIONS)}")
  for enc, dec in (("encoder_layers", "decoder_layers"),
                   ("encoder_attention_heads", "decoder_attention_heads"),
                   ("encoder_ffn_dim", "decoder_ffn_dim")):
    if get(enc) != get(dec):
      raise refuse(dec, f"it differs from {enc}={get(enc)!r}; the encoder and the decoder have "
                   "one size here")
  for key in ("vocab_size", "d_model", "encoder_layers", "encoder_ffn_dim",
              "encoder_attention_heads", "max_position_embeddings"):
    value = get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise refuse(key, "must be a positive integer")
  vocab = get("vocab_size")
  if get("d_model") % get("encoder_attention_heads"):
    raise refuse("encoder_attention_heads", f"it does not divide d_model={get('d_model')}")
  if get("decoder_vocab_size") not in (None, vocab):
    raise refuse("decoder_vocab_size", f"it differs from vocab_size={vocab}")
  for key in ("share_encoder_decoder_embeddings", "tie_word_embeddings", "is_encoder_decoder"):
    if get(key) is not True:
      raise refuse(key, "the embeddings of both sides and the output projection are one "
                   "matrix here, in an encoder-decoder")
  for key in ("activation_dropout", "encoder_layerdrop", "decoder_layerdrop"):
    if get(key) != 0:
      raise refuse(key, "there is no such dropout here (it only acts in training)")
  for key in ("dropout", "attention_dropout"):
    value = get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1:
      raise refuse(key, "must be a number in [0, 1)")
  if not isinstance(get("scale_embedding"), bool):
    raise refuse("scale_embedding", "must be true or false")
  eos = get("eos_token_id")
  if eos not in (0, [0]):
    raise refuse("eos_token_id", "Marian's </s> is id 0")
  for key in ("pad_token_id", "decoder_start_token_id"):
    if get(key) != vocab - 1:
      raise refuse(key, f"Marian's <pad> (the decoder's start) is the last id, {vocab - 1}")
  return {
    "vocab_size": vocab, "num_layers": get("encoder_layers"), "d_model": get("d_model"),
    "d_ff": get("encoder_ffn_dim"), "num_heads": get("encoder_attention_heads"), "d_kv": 0,
    "dropout_rate": float(get("dropout")),
    "attention_dropout_rate": float(get("attention_dropout")),
    "max_len": get("max_position_embeddings"), "positional": "sinusoidal_halves",
    "share_embeddings": True, "pre_layer_norm": False, "layer_norm_epsilon": 1e-5,
    "activation": ACTIVATIONS[get("activation_function")], "attention_bias": True,
    "logits_bias": True, "scale_embeddings": get("scale_embedding"), "kind": "transformer",
  }


def read_weights(path: str) -> dict[str, np.ndarray]:
  """The tensors of `model.safetensors`, or of `pytorch_model.bin` where torch is installed.

  Raises:
    UserError: a damaged file, or a `pytorch_model.bin` without torch.
  """
  if os.path.basename(path) == SAFETENSORS:
    return safetensors_file.read(path)
  try:
    import torch
  except ImportError:
    raise UserError(
      f"{path}: reading it needs torch, which is not installed; convert it to {SAFETENSORS} "
      "first (where transformers and torch are installed: MarianMTModel.from_pretrained(DIR)"
      ".save_pretrained(DIR) writes it)") from None
  state = torch.load(path, map_location="cpu", weights_only=True)
  return {name: t.float().numpy() for name, t in state.items()}


class _Tensors:
  """The source's tensors by their name in MarianMTModel (the `model.` prefix optional), each
  taken once and checked for its shape."""

  def __init__(self, tensors: dict[str, np.ndarray], where: str):
    self.tensors = {name.removeprefix("model."): t for name, t in tensors.items()}
    self.where = where
    self.taken: set[str] = set()

  def has(self, name: str) -> bool:
    return name in self.tensors

  def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in self.tensors:
      raise UserError(f"{self.where}: no tensor {name!r} (model.{name})")
    value = self.tensors[name]
    if value.shape != shape:
      raise UserError(f"{self.where}: {name} has shape {value.shape}, config.json makes it "
                      f"{shape}")
    self.taken.add(name)
    return np.asarray(value, np.float32)

  def left_over(self) -> list[str]:
    return sorted(set(self.tensors) - self.taken)


def _attention(t: _Tensors, prefix: str, mc: ModelConfig) -> dict[str, np.ndarray]:
  """MarianAttention's projections (torch Linear: weight [out, in], out = head * k + j) as
  MultiHeadAttention's W^Q, W^K, W^V [d, h, k], W^O [h, k, d] and their biases."""
  d, h, k = mc.d_model, mc.num_heads, mc.head_dim
  out = {}
  for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
    out[ours] = t.take(f"{prefix}.{theirs}.weight", (h * k, d)).T.reshape(d, h, k)
    out[f"{ours}_bias"] = t.take(f"{prefix}.{theirs}.bias", (h * k,)).reshape(h, k)
  out["out"] = t.take(f"{prefix}.out_proj.weight", (d, h * k)).T.reshape(h, k, d)
  out["out_bias"] = t.take(f"{prefix}.out_proj.bias", (d,))
  return out


def _norm(t: _Tensors, prefix: str, d: int) -> dict[str, np.ndarray]:
  return {"scale": t.take(f"{prefix}.weight", (d,)), "bias": t.take(f"{prefix}.bias", (d,))}


def _layer(t: _Tensors, side: str, i: int, mc: ModelConfig) -> dict[str, Any]:
  """One encoder or decoder layer in model.py's names (post-LN sublayers: the norm after each
  residual, as Marian's self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm)."""
  p, d, f = f"{side}.layers.{i}", mc.d_model, mc.d_ff
  layer = {
    "feed_forward": {
      "wi": {"kernel": t.take(f"{p}.fc1.weight", (f, d)).T, "bias": t.take(f"{p}.fc1.bias", (f,))},
      "wo": {"kernel": t.take(f"{p}.fc2.weight", (d, f)).T, "bias": t.take(f"{p}.fc2.bias", (d,))},
    },
    "feed_forward_block": {"norm": _norm(t, f"{p}.final_layer_norm", d)},
    "self_attention": _attention(t, f"{p}.self_attn", mc),
  }
  if side == "encoder":
    layer["attention_block"] = {"norm": _norm(t, f"{p}.self_attn_layer_norm", d)}
  else:
    layer["self_attention_block"] = {"norm": _norm(t, f"{p}.self_attn_layer_norm", d)}
    layer["cross_attention"] = _attention(t, f"{p}.encoder_attn", mc)
    layer["cross_attention_block"] = {"norm": _norm(t, f"{p}.encoder_attn_layer_norm", d)}
  return layer


def convert_params(tensors: dict[str, np.ndarray], mc: ModelConfig, where: str) -> dict[str, Any]:
  """MarianMTModel's tensors -> model.Transformer's float32 parameters for `mc` (unrolled or
  scanned layers), the vocabulary axis rotated to the project's ids.

  Raises:
    UserError: naming `where` and the tensor, for one that is missing, of the wrong shape,
      untied where the model ties it, or not part of the model (nothing is dropped silently).
  """
  t = _Tensors(tensors, where)
  v, d = mc.vocab_size, mc.d_model
  names = ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
           "lm_head.weight"]
  present = [n for n in names if t.has(n)]
  if not present:
    raise UserError(f"{where}: no embedding matrix (model.shared.weight)")
  embedding = t.take(present[0], (v, d))
  for name in present[1:]:
    if not np.array_equal(t.take(name, (v, d)), embedding):
      raise UserError(f"{where}: {name} differs from {present[0]}: untied embeddings are not "
                      "supported (one matrix serves both sides and the output here)")
  bias = (t.take("final_logits_bias", (1, v))[0] if t.has("final_logits_bias")
          else np.zeros(v, np.float32))  # transformers' default when the file has none
  table = sinusoidal_positions(mc.max_len, d, halves=True)
  for side in ("encoder", "decoder"):
    name = f"{side}.embed_positions.weight"
    if t.has(name):  # older files store the (fixed) sinusoids; they must be Marian's
      stored = t.take(name, (mc.max_len, d))
      if not np.allclose(stored, table, atol=POSITIONS_TOLERANCE):
        raise UserError(f"{where}: {name} is not Marian's sinusoid table, which is computed "
                        "here")
  # Marian id m is the project's id (m + 1) % V: row m moves to row m + 1, <pad> to row 0.
  params: dict[str, Any] = {
    "embed": {"embedding": np.roll(embedding, 1, axis=0)},
    "decoder": {"logits_bias": np.roll(bias, 1)},
    "encoder": {},
  }
  for side in ("encoder", "decoder"):
    layers = [_layer(t, side, i, mc) for i in range(mc.num_layers)]
    if mc.scan_layers:  # nn.scan stacks every layer's parameters on a leading axis
      params[side]["layers"] = jax.tree.map(lambda *xs: np.stack(xs), *layers)
    else:
      params[side].update({f"layer_{i}": layer for i, layer in enumerate(layers)})
  if t.left_over():
    raise UserError(f"{where}: tensors that are no part of a Marian model here: "
                    f"{', '.join(t.left_over()[:5])}")
  return params


def workdir_config_of(base: config_dict.ConfigDict, source: MarianSource
                      ) -> config_dict.ConfigDict:
  """The imported workdir's config: the Marian architecture in `model`, the vocabulary's size,
  corpus fields for fine-tuning on your own files in the model's languages (dataset 'text',
  data.train_files.<lang> unset), pad never decoded; every other field as in `base`."""
  config = workdir_lib.from_json(workdir_lib.to_json(base))  # a plain, typed copy
  src, tgt = source.source_lang, source.target_lang
  config.name = f"opus-mt-{src}-{tgt}"
  config.dataset = "text"
  config.data.source_lang, config.data.target_lang = src, tgt
  for field in ("train_files", "eval_files", "test_files"):
    if field in config.data:
      del config.data[field]
    config.data[field] = config_dict.ConfigDict(
      {src: config_dict.placeholder(str), tgt: config_dict.placeholder(str)})
  config.data.vocab_size = source.model_fields["vocab_size"]
  for key, value in source.model_fields.items():
    if key in config.model:
      del config.model[key]
    config.model[key] = value
  if "suppress_padding" in config.decode:
    del config.decode.suppress_padding
  config.decode.suppress_padding = True
  beams = source.generation.get("num_beams", source.config.get("num_beams"))
  if isinstance(beams, int) and not isinstance(beams, bool) and beams >= 1:
    config.decode.beam_size = beams
  return config


def check_new_workdir(workdir: str) -> None:
  """Raises UserError unless `workdir` is new or empty: an import never overwrites a workdir
  (its checkpoints, config or vocabulary)."""
  path = storage.as_path(workdir)
  if not path.exists():
    return
  if not path.is_dir():
    raise UserError(f"--workdir={workdir} is a file: give a new or empty directory")
  entries = sorted(p.name for p in path.iterdir())
  if entries:
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    raise UserError(f"--workdir={workdir} is not empty ({shown}): an import writes a new "
                    "workdir and never overwrites one; give a new or empty directory")


def _fresh_state(trainer: Trainer, params: dict[str, Any]) -> TrainState:
  """Step 0: `params` placed as training shards them, with a fresh optimizer state."""
  def shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    return {"/".join(k): tuple(v.shape) for k, v in traverse_util.flatten_dict(tree).items()}

  expected, got = shapes(trainer.abstract_state.params), shapes(params)
  if got != expected:  # a mapping that does not build model.py's tree is this module's bug
    wrong = sorted(set(got.items()) ^ set(expected.items()))[:4]
    raise ValueError(f"converted parameters differ from the model's: {wrong}")

  def fresh(params: Any) -> TrainState:
    zero = jnp.zeros((), jnp.int32)
    return TrainState(step=zero, params=params, opt_state=trainer.tx.init(params),
                      nonfinite_in_a_row=zero, nonfinite_total=zero)

  with trainer.context():
    return jax.jit(fresh, out_shardings=trainer.state_shardings)(params)


def import_model(base: config_dict.ConfigDict, source_dir: str, workdir: str) -> str:
  """Writes the Marian model of `source_dir` as a new workdir; returns a one-line summary.

  Args:
    base: the config whose training, decoding and system fields the workdir takes
      (`configs/text.py` by default in the main program).
    source_dir: a Hugging Face Marian model directory (module docstring).
    workdir: a new or empty directory, local or gs://.

  Raises:
    UserError (ConfigError): one line, before anything is written.
  """
  source = read_source(source_dir)
  check_new_workdir(workdir)
  config = workdir_config_of(base, source)
  try:
    mc = validate(config, jax.device_count())
  except ConfigError as e:
    raise ConfigError(f"{e} (the imported model's config; pass another base with --config)"
                      ) from None
  params = convert_params(read_weights(source.weights), mc, source.weights)
  trainer = Trainer(config, sharding_lib.make_mesh(config.mesh), mc)
  state = _fresh_state(trainer, params)
  storage.check_writable(workdir)
  if jax.process_index() == 0:
    for name, data in source.tokenizer.files.items():
      storage.write_atomic(workdir_lib.paths(workdir).marian_vocab / name, data)
    workdir_lib.save(config, workdir)
  checkpointer = Checkpointer(workdir_lib.paths(workdir).checkpoints, config.keep_checkpoints,
                              async_save=False)
  try:
    # Written last: a workdir with a checkpoint is a complete one.
    checkpointer.save(0, state, run_meta(config, mc, source.tokenizer.sha256))
  finally:
    checkpointer.close()
  return (f"imported {source.directory} ({mc.num_layers} + {mc.num_layers} layers, d_model "
          f"{mc.d_model}, {mc.vocab_size:,} pieces, {mc.activation}) into {workdir} as step 0")
