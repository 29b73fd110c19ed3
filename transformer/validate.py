"""Validation of a whole config before any work: every failure is a one-line ConfigError that
names the field and says what would be valid."""

from __future__ import annotations

from typing import Any

from transformer import profiling
from transformer import sharding as sharding_lib
from transformer.data.input_pipeline import BUCKET_MULTIPLE
from transformer.errors import ConfigError
from transformer.model import ModelConfig
from transformer.model_family import KINDS
from transformer.translate import METHODS

# Besides these, `dataset` may be any TFDS builder name (checked against TFDS when the data
# is opened, transformer/data/corpora.py).
DATASETS = ("numbers", "wmt14", "text")
NONFINITE = ("skip", "stop")


def _int(config: Any, field: str, minimum: int = 0) -> int:
  value = _get(config, field)
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ConfigError(f"{field}={value!r}: must be an integer >= {minimum}")
  return value


def _float(config: Any, field: str, lo: float, hi: float, hi_open: bool = False) -> float:
  value = _get(config, field)
  if isinstance(value, bool) or not isinstance(value, int | float):
    raise ConfigError(f"{field}={value!r}: must be a number")
  if value < lo or value > hi or (hi_open and value == hi):
    raise ConfigError(f"{field}={value!r}: must be in [{lo}, {hi}{')' if hi_open else ']'}")
  return float(value)


def _get(config: Any, field: str) -> Any:
  node = config
  for part in field.split("."):
    if part not in node:
      raise ConfigError(f"{field}: missing from the config")
    node = node[part]
  return node


def model_config(config: Any) -> ModelConfig:
  """ModelConfig(**config.model), with its ValueErrors as ConfigErrors."""
  try:
    return ModelConfig(**config.model)
  except TypeError as e:
    raise ConfigError(f"model: {e}") from None
  except ValueError as e:
    raise ConfigError(str(e)) from None


def validate(config: Any, num_devices: int) -> ModelConfig:
  """Checks every field; returns the model config. Raises ConfigError (one line)."""
  dataset = _get(config, "dataset")
  if not isinstance(dataset, str) or not dataset.strip():
    raise ConfigError(f"dataset={dataset!r}: must be one of {', '.join(DATASETS)} or a TFDS "
                      "builder name such as 'wmt14_translate/fr-en'")
  for field in ("data.source_lang", "data.target_lang", "data.train_split", "data.eval_split",
                "data.test_split"):
    value = config.data.get(field[len("data."):], "-")
    if not isinstance(value, str) or not value.strip():
      raise ConfigError(f"{field}={value!r}: must be a non-empty string")
  if dataset == "text":
    files = config.data.get("train_files")
    if not (files if isinstance(files, str | None) else any(dict(files).values())):
      raise ConfigError("data.train_files: not set; dataset='text' trains on your own files "
                        "(configs/text.py documents the fields)")
    _int(config, "data.heldout_pairs", 1)
  mc = model_config(config)
  if mc.kind not in KINDS:
    raise ConfigError(f"model.kind={mc.kind!r}: must be one of {', '.join(KINDS)}")

  _int(config, "seed")
  vocab = _int(config, "data.vocab_size", 8)
  if vocab != mc.vocab_size:
    raise ConfigError(
      f"model.vocab_size={mc.vocab_size} differs from data.vocab_size={vocab}: set both"
    )
  _int(config, "data.spm_train_sentences", 1)
  max_src = _int(config, "data.max_source_len", 2)
  max_tgt = _int(config, "data.max_target_len", 2)
  buckets = _get(config, "data.bucket_lengths")
  if buckets == "auto":
    # Derived from the training split (input_pipeline.derive_buckets): at most the length
    # limit rounded up to a multiple of BUCKET_MULTIPLE.
    buckets = [-(-max(max_src, max_tgt) // BUCKET_MULTIPLE) * BUCKET_MULTIPLE]
  elif (isinstance(buckets, str | bool | int | float) or not buckets
        or any(isinstance(b, bool) or not isinstance(b, int) or b < 2 for b in buckets)
        or list(buckets) != sorted(set(buckets))):
    raise ConfigError(
      f"data.bucket_lengths={buckets!r}: must be 'auto' or increasing integers >= 2"
    )
  elif buckets[-1] < max(max_src, max_tgt):
    raise ConfigError(
      f"data.bucket_lengths: the largest ({buckets[-1]}) must be >= max(data.max_source_len, "
      f"data.max_target_len) = {max(max_src, max_tgt)}"
    )
  extra = _int(config, "decode.max_extra_len")
  if mc.max_len < buckets[-1] or mc.max_len < max_src + extra:
    raise ConfigError(
      f"model.max_len={mc.max_len}: must be >= the largest bucket ({buckets[-1]}) and >= "
      f"data.max_source_len + decode.max_extra_len ({max_src + extra})"
    )
  _int(config, "data.eval_batch_size", 1)
  packing = _get(config, "data.packing")
  if not isinstance(packing, bool):
    raise ConfigError(f"data.packing={packing!r}: must be True or False")
  for field in ("data.packed_source_len", "data.packed_target_len"):
    if field == "data.packed_target_len" and _get(config, field) == "auto":
      continue  # the source rows' length scaled by the corpus (packing.packed_target_len)
    length = _int(config, field, 2)
    # Positions restart in every segment, so a row needs only a table as long as itself.
    if packing and length > mc.max_len:
      raise ConfigError(f"{field}={length}: must be <= model.max_len={mc.max_len} when packing")
  if packing and mc.kind != "transformer":
    raise ConfigError(f"data.packing=True: model.kind={mc.kind!r} does not take packed rows; "
                      "use model.kind='transformer' or data.packing=False")

  _float(config, "label_smoothing", 0.0, 1.0, hi_open=True)
  _float(config, "optimizer.b1", 0.0, 1.0, hi_open=True)
  _float(config, "optimizer.b2", 0.0, 1.0, hi_open=True)
  _float(config, "optimizer.eps", 0.0, 1.0)
  _int(config, "optimizer.warmup_steps", 1)
  _float(config, "optimizer.learning_rate_scale", 0.0, 3e38)
  _float(config, "optimizer.grad_clip_norm", 0.0, 1e12)

  _int(config, "num_train_steps", 0)
  for field in ("log_every_steps", "eval_every_steps", "checkpoint_every_steps"):
    _int(config, field, 1)
  _int(config, "bleu_every_steps", 0)
  _int(config, "keep_checkpoints", 1)
  avg = _int(config, "average_last_checkpoints", 0)
  if avg > config.keep_checkpoints:
    raise ConfigError(
      f"average_last_checkpoints={avg}: must be <= keep_checkpoints={config.keep_checkpoints}"
    )
  _int(config, "eval_bleu_sentences", 0)
  _int(config, "num_samples_to_print", 0)
  _int(config, "decode.beam_size", 1)
  _float(config, "decode.alpha", 0.0, 100.0)
  _int(config, "decode.batch_size", 1)
  method = _get(config, "decode.method")
  if method not in METHODS:
    raise ConfigError(f"decode.method={method!r}: must be one of {', '.join(METHODS)}")
  temperature = _float(config, "decode.temperature", 0.0, 1e6)
  if not temperature > 0:
    raise ConfigError(f"decode.temperature={temperature!r}: must be > 0")
  _int(config, "decode.top_k", 0)
  top_p = _float(config, "decode.top_p", 0.0, 1.0)
  if not top_p > 0:
    raise ConfigError(f"decode.top_p={top_p!r}: must be in (0, 1]")
  _int(config, "decode.seed", 0)
  _int(config, "decode.tokens_per_batch", 1)
  _int(config, "decode.chunk_size", 1)
  if _get(config, "nonfinite") not in NONFINITE:
    raise ConfigError(f"nonfinite={config.nonfinite!r}: must be one of {', '.join(NONFINITE)}")
  _int(config, "max_consecutive_nonfinite", 1)
  cache_dir = _get(config, "compilation_cache_dir")
  if cache_dir is not None and not isinstance(cache_dir, str):
    raise ConfigError(f"compilation_cache_dir={cache_dir!r}: must be a directory, or '' for none")
  steps = _get(config, "profile_steps")
  try:
    profiling.parse_steps(steps if isinstance(steps, str) else repr(steps))
  except ValueError as e:
    raise ConfigError(f"profile_steps={steps!r}: {e}") from None

  # The mesh against the devices, and dimensions against the axes that split them.
  data, fsdp, tensor = sharding_lib.mesh_shape(config.mesh, num_devices)
  for field, size, axis, n in (
    ("model.num_heads", mc.num_heads, "tensor", tensor),
    ("model.d_ff", mc.d_ff, "tensor", tensor),
    ("model.vocab_size", mc.vocab_size, "tensor", tensor),
    ("model.d_model", mc.d_model, "fsdp", fsdp),
  ):
    if size % n:
      raise ConfigError(f"{field}={size} is not divisible by mesh.{axis}={n}: change one of them")
  # A batch with fewer examples than data-parallel devices is padded with all-zero rows
  # (input_pipeline.TrainBatches), so the batches never depend on the mesh.
  _int(config, "data.tokens_per_batch", 1)
  _int(config, "grad_accum_steps", 1)

  return mc
