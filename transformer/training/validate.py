"""Validation of a whole config before any work: every failure is a one-line ConfigError that
names the field and says what would be valid.

Every field has one row in the tables below (`FIELDS`, `MODEL_FIELDS`): its type, its range,
and for paths and names what they must be. `validate` checks each row, then what depends on
several fields: lengths against the model's positions, sizes against each other and against
what a run can allocate, the mesh against the devices.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from typing import Any

from ml_collections import config_dict

from transformer import profiling
from transformer import sharding as sharding_lib
from transformer import workdir as workdir_lib
from transformer.data import mixture, numbers
from transformer.data.bucketing import BUCKET_MULTIPLE
from transformer.data.plan_cache import AUTO
from transformer.decoding import mbr
from transformer.decoding.translate import METHODS
from transformer.errors import ConfigError, show
from transformer.nn import attention as attn_lib
from transformer.nn import dropout as dropout_lib
from transformer.nn.model import ACTIVATIONS, DTYPES, POSITIONAL, REMAT_POLICIES, ModelConfig
from transformer.nn.model_family import KINDS
from transformer.schedules import NEED_WARMUP, SCHEDULES
from transformer.training import best_checkpoint, evaluators

# Besides these, `dataset` may be any TFDS builder name (checked against TFDS when the data
# is opened, transformer/data/corpora.py).
DATASETS = ("numbers", "wmt14", "text")
NONFINITE = ("skip", "stop")

# Upper limits of sizes: far above any run this code is meant for, so that only a typo or a
# wrong unit meets them, and low enough that what they size can be allocated.
MAX_TOKENS = 2**24  # tokens of one batch: training (per side), evaluation, decoding
MAX_LEN = 2**16  # positions of a sequence: model.max_len and every length limit
MAX_VOCAB = 2**20
MAX_WIDTH = 2**16  # model.d_model, model.d_kv, model.num_heads
MAX_FF = 2**18  # model.d_ff
MAX_LAYERS = 2**10
MAX_STEPS = 2**31 - 1  # the train state's step counter is an int32
MAX_COUNT = 2**31 - 1  # sentences, pairs, checkpoints
MAX_SEED = 2**32 - 1  # SentencePiece takes a 32-bit seed
# Rates, scales and decays: finite in float32, the parameters' type.
MAX_FLOAT32 = 3e38
# float32 logits divided by the temperature stay finite, and sampling stays a distribution.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 1e6
# One device's share of the parameters, their gradients and Adam's two moments, and of one
# micro-batch's logits (`device_bytes`, an estimate): no accelerator holds 1 TiB.
MAX_DEVICE_BYTES = 2**40

# TFDS names: builder[/config][:version], e.g. 'wmt14_translate/fr-en', 'para_crawl/ende:1.2.0'.
TFDS_NAME = re.compile(r"[A-Za-z_]\w*(/[\w.+-]+)?(:(\d+|\*)\.(\d+|\*)\.(\d+|\*))?")
# TFDS split strings: 'train', 'train[:10%]', 'train[5000:]', 'train[:1shard]', joined by '+'.
_BOUND = r"-?\d+(\.\d+)?(%|shard)?"
_TERM = rf"[\w-]+(\[({_BOUND}:({_BOUND})?|:{_BOUND}|\d+shard)\])?"
SPLIT = re.compile(rf"\s*{_TERM}(\s*\+\s*{_TERM})*\s*")
LANGUAGE = re.compile(r"[\w-]+")

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Check:
  """What a field accepts: `problem(value)` is None for a value it accepts, else the rest of the
  error line (e.g. 'must be an integer from 1 to 8')."""

  problem: Callable[[Any], str | None]
  # The field may be missing from a config (one written before the field existed).
  optional: bool = False
  # For a field that may be a mapping (language -> path): the check of each of its entries.
  entries: Check | None = None


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  if isinstance(value, bool) or not isinstance(value, int | float):
    return False
  return isinstance(value, int) or math.isfinite(value)


def _accepting(ok: Callable[[Any], bool], accepts: str) -> Callable[[Any], str | None]:
  return lambda value: None if ok(value) else f"must be {accepts}"


def integer(lo: int, hi: int, note: str = "", optional: bool = False) -> Check:
  """An int (not a bool) in [lo, hi]."""
  return Check(_accepting(lambda v: _is_int(v) and lo <= v <= hi,
                          f"an integer from {lo:,} to {hi:,}{note}"), optional)


def number(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False,
           optional: bool = False) -> Check:
  """A finite int or float (not a bool) in the interval from lo to hi."""

  def ok(v: Any) -> bool:
    return (_is_number(v) and (lo < v if lo_open else lo <= v)
            and (v < hi if hi_open else v <= hi))

  interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
  return Check(_accepting(ok, f"a finite number in {interval}"), optional)


def flag(optional: bool = False) -> Check:
  return Check(_accepting(lambda v: isinstance(v, bool), "True or False"), optional)


def choice(options: tuple[Any, ...], optional: bool = False) -> Check:
  """One of `options`, of the same type (8.0 is not 8, True is not 1)."""
  ok = lambda v: any(type(v) is type(o) and v == o for o in options)  # noqa: E731
  return Check(_accepting(ok, f"one of {', '.join(repr(o) for o in options)}"), optional)


def text(pattern: re.Pattern[str] | None, accepts: str, optional: bool = False) -> Check:
  """A string (matching `pattern` if given; else any without a line break)."""

  def ok(v: Any) -> bool:
    if not isinstance(v, str):
      return False
    return bool(pattern.fullmatch(v)) if pattern else "\n" not in v

  return Check(_accepting(ok, accepts), optional)


def directory(what: str, optional: bool = True) -> Check:
  """None or '' (the default), a gs:// URL, or a local directory that exists or can be
  created."""

  def problem(v: Any) -> str | None:
    if v is None or v == "":
      return None
    why = directory_problem(v) if isinstance(v, str) else "not a path"
    if why is None:
      return None
    return f"must be {what} that exists or can be created, or unset ({why})"

  return Check(problem, optional)


def directory_problem(path: str) -> str | None:
  """Why the local `path` is not a directory that exists or can be created; None if it is.

  An object-store URL (`gs://...`) is left to the first access. A missing directory is tried by
  creating (and removing) a directory in its nearest existing parent: as root, permissions
  alone do not tell that /proc refuses one.
  """
  if "://" in path:
    return None
  try:
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
      return None
    if os.path.lexists(full):
      return "it exists and is not a directory"
    parent = os.path.dirname(full)
    while not os.path.lexists(parent):
      parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
      return f"{parent} is not a directory"
    os.rmdir(tempfile.mkdtemp(prefix=".config-check-", dir=parent))
  except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
    return f"cannot create it: {getattr(e, 'strerror', None) or e}"
  return None


def _buckets_problem(v: Any) -> str | None:
  if v == AUTO:
    return None
  if (not isinstance(v, list | tuple) or not v
      or not all(_is_int(b) and 2 <= b <= MAX_LEN for b in v) or list(v) != sorted(set(v))):
    return f"must be {AUTO!r} or increasing integers from 2 to {MAX_LEN:,}"
  return None


def _packed_target_problem(v: Any) -> str | None:
  if v == AUTO or (_is_int(v) and 2 <= v <= MAX_LEN):
    return None
  return f"must be {AUTO!r} or an integer from 2 to {MAX_LEN:,}"


def _profile_problem(v: Any) -> str | None:
  if not isinstance(v, str):
    return "must be 'FIRST:LAST', two step numbers, e.g. '200:205' ('' for none)"
  try:
    profiling.parse_steps(v)
  except ValueError as e:
    return str(e)
  return None


def _axis_rules_problem(v: Any) -> str | None:
  def mesh_axes(axes: Any) -> bool:
    if axes is None or axes in sharding_lib.MESH_AXES:
      return True
    return isinstance(axes, list | tuple) and all(a in sharding_lib.MESH_AXES for a in axes)

  if isinstance(v, list | tuple) and all(
      isinstance(r, list | tuple) and len(r) == 2 and isinstance(r[0], str) and mesh_axes(r[1])
      for r in v):
    return None
  return (f"must be a list of (logical axis, mesh axes) pairs, the mesh axes None, one of "
          f"{', '.join(sharding_lib.MESH_AXES)} or a tuple of them")


_MESH_AXIS = Check(_accepting(lambda v: _is_int(v) and (v == -1 or 1 <= v <= MAX_COUNT),
                              "-1 (the remaining devices) or a number of devices"))

# The split files of dataset='text': one TSV path, or a mapping language -> path.
_FILES = Check(
  _accepting(lambda v: v is None or (isinstance(v, str) and "\n" not in v),
             "a file path (a TSV file), a mapping language -> path, or unset"),
  optional=True,
  entries=Check(_accepting(lambda v: v is None or (isinstance(v, str) and "\n" not in v),
                           "a file path, or unset")),
)


# Every field of ModelConfig (transformer/nn/model.py); `model_config` checks these.
MODEL_FIELDS: dict[str, Check] = {
  "model.vocab_size": integer(1, MAX_VOCAB, optional=True),
  "model.num_layers": integer(1, MAX_LAYERS, optional=True),
  "model.d_model": integer(1, MAX_WIDTH, optional=True),
  "model.d_ff": integer(1, MAX_FF, optional=True),
  "model.num_heads": integer(1, MAX_WIDTH, optional=True),
  "model.d_kv": integer(0, MAX_WIDTH, " (0: d_model / num_heads)", optional=True),
  "model.dropout_rate": number(0, 1, hi_open=True, optional=True),
  "model.attention_dropout_rate": number(0, 1, hi_open=True, optional=True),
  "model.dropout_mask_bits": choice(dropout_lib.MASK_BITS, optional=True),
  "model.max_len": integer(1, MAX_LEN, optional=True),
  "model.positional": choice(POSITIONAL, optional=True),
  "model.share_embeddings": flag(optional=True),
  "model.pre_layer_norm": flag(optional=True),
  "model.layer_norm_epsilon": number(0, 1, lo_open=True, hi_open=True, optional=True),
  "model.activation": choice(ACTIVATIONS, optional=True),
  "model.attention_bias": flag(optional=True),
  "model.logits_bias": flag(optional=True),
  "model.scale_embeddings": flag(optional=True),
  "model.dtype": choice(DTYPES, optional=True),
  "model.attention": choice(attn_lib.IMPLEMENTATIONS, optional=True),
  "model.attention_chunk_size": integer(1, MAX_LEN, optional=True),
  "model.scan_layers": flag(optional=True),
  "model.remat": choice(REMAT_POLICIES, optional=True),
  "model.kind": choice(KINDS, optional=True),
  "model.lstm_attention": flag(optional=True),
}

# Every other field of configs/common.py (and of configs/text.py). Optional fields are those
# the code reads with a default.
FIELDS: dict[str, Check] = {
  # The run and its corpus.
  "name": text(None, "a string", optional=True),
  "dataset": text(
    TFDS_NAME, f"one of {', '.join(DATASETS)}, or a TFDS builder name NAME[/CONFIG][:VERSION] "
    "such as 'wmt14_translate/fr-en'"),
  "data_dir": directory("a TFDS data directory"),
  "seed": integer(0, MAX_SEED),
  "data.source_lang": text(LANGUAGE, "a language code such as 'en'"),
  "data.target_lang": text(LANGUAGE, "a language code such as 'de'"),
  "data.train_split": text(SPLIT, "a TFDS split such as 'train' or 'train[:10%]'", True),
  "data.eval_split": text(SPLIT, "a TFDS split such as 'validation' or 'train[:500]'", True),
  "data.test_split": text(SPLIT, "a TFDS split such as 'test' or 'train[500:1000]'", True),
  "data.train_files": _FILES,
  "data.eval_files": _FILES,
  "data.test_files": _FILES,
  "data.heldout_pairs": integer(1, MAX_COUNT, optional=True),
  "data.numbers_variant": choice(tuple(numbers.VARIANTS), optional=True),
  "data.download": flag(optional=True),
  "data.cache_dir": directory("a directory for the token cache"),
  # A mixture's main corpus (data.corpora.* is checked by mixture.corpora_of, entry by entry).
  "data.weight": number(0, MAX_FLOAT32, lo_open=True, optional=True),
  "data.tag": text(None, "a tag token such as '>>de<<', or '' for none", optional=True),
  # Vocabulary, lengths and batches.
  "data.vocab_size": integer(8, MAX_VOCAB),
  "data.spm_train_sentences": integer(1, MAX_COUNT),
  "data.max_source_len": integer(2, MAX_LEN),
  "data.max_target_len": integer(2, MAX_LEN),
  "data.tokens_per_batch": integer(1, MAX_TOKENS),
  "data.bucket_lengths": Check(_buckets_problem),
  "data.eval_batch_size": integer(1, MAX_TOKENS),
  "data.packing": flag(),
  "data.packed_source_len": integer(2, MAX_LEN),
  "data.packed_target_len": Check(_packed_target_problem),
  **MODEL_FIELDS,
  # Training.
  "label_smoothing": number(0, 1, hi_open=True),
  "grad_accum_steps": integer(1, MAX_TOKENS),
  "optimizer.b1": number(0, 1, hi_open=True),
  "optimizer.b2": number(0, 1, hi_open=True),
  "optimizer.eps": number(0, 1),
  "optimizer.schedule": choice(SCHEDULES, optional=True),
  "optimizer.warmup_steps": integer(0, MAX_STEPS),
  "optimizer.learning_rate_scale": number(0, MAX_FLOAT32),
  "optimizer.learning_rate": number(0, MAX_FLOAT32, lo_open=True, optional=True),
  "optimizer.warmup_init_lr": number(0, MAX_FLOAT32, optional=True),
  "optimizer.end_learning_rate": number(0, MAX_FLOAT32, optional=True),
  "optimizer.weight_decay": number(0, MAX_FLOAT32, optional=True),
  "optimizer.ema_decay": number(0, 1, hi_open=True, optional=True),
  "optimizer.grad_clip_norm": number(0, 1e12),
  "num_train_steps": integer(0, MAX_STEPS),
  "log_every_steps": integer(1, MAX_STEPS),
  # `evals.*` (a mapping of evaluators) is checked by evaluators.check.
  "checkpoint_every_steps": integer(1, MAX_STEPS),
  "keep_checkpoints": integer(1, MAX_COUNT),
  "average_last_checkpoints": integer(0, MAX_COUNT),
  "best_checkpoint.metric": text(None, "a metric of an evaluator that runs in the loop, e.g. "
                                 "'eval/bleu', or '' for none", optional=True),
  "best_checkpoint.mode": choice(best_checkpoint.MODES, optional=True),
  "early_stopping.patience": integer(0, MAX_COUNT, " (0: never stop early)", optional=True),
  "early_stopping.min_delta": number(0, 3e38, optional=True),
  "init_from": text(None, "a workdir to start from, or '' for none", optional=True),
  "init_from_optimizer": flag(optional=True),
  "num_samples_to_print": integer(0, MAX_COUNT),
  "nonfinite": choice(NONFINITE),
  "max_consecutive_nonfinite": integer(1, MAX_COUNT),
  # Decoding.
  "decode.method": choice(METHODS, optional=True),
  "decode.beam_size": integer(1, MAX_VOCAB),
  "decode.alpha": number(0, 100),
  "decode.max_extra_len": integer(0, MAX_LEN),
  "decode.batch_size": integer(1, MAX_TOKENS),
  "decode.tokens_per_batch": integer(1, MAX_TOKENS, optional=True),
  "decode.temperature": number(MIN_TEMPERATURE, MAX_TEMPERATURE, optional=True),
  "decode.top_k": integer(0, MAX_VOCAB, " (0: all)", optional=True),
  "decode.top_p": number(0, 1, lo_open=True, optional=True),
  "decode.seed": integer(0, MAX_SEED, optional=True),
  "decode.suppress_padding": flag(optional=True),
  "decode.tag": text(None, "one of the model's tags, or '' for none", optional=True),
  "decode.chunk_size": integer(1, MAX_TOKENS, optional=True),
  "decode.in_flight": flag(optional=True),
  "decode.mbr_candidates": integer(2, MAX_COUNT, " (the candidates of decode.method='mbr')",
                                   optional=True),
  "decode.mbr_sampler": choice(mbr.SAMPLERS, optional=True),
  "decode.mbr_utility": choice(mbr.UTILITIES, optional=True),
  # The system.
  "compilation_cache_dir": Check(_accepting(
    lambda v: v is None or (isinstance(v, str) and "\n" not in v),
    "a directory, or '' for none (unset: the default)")),
  "profile_steps": Check(_profile_problem),
  "mesh.data": _MESH_AXIS,
  "mesh.fsdp": _MESH_AXIS,
  "mesh.tensor": _MESH_AXIS,
  "logical_axis_rules": Check(_axis_rules_problem, optional=True),
}


def _lookup(config: Any, field: str) -> Any:
  node = config
  for part in field.split("."):
    if not hasattr(node, "keys") or part not in node:
      return _MISSING
    node = node[part]
  return node


def check_field(field: str, check: Check, value: Any) -> None:
  """Raises ConfigError naming `field` unless `check` accepts `value`."""
  if check.entries is not None and hasattr(value, "keys"):
    for key in value.keys():
      check_field(f"{field}.{key}", check.entries, value[key])
    return
  problem = check.problem(value)
  if problem is not None:
    raise ConfigError(f"{field}={show(value)}: {problem}")


def check_fields(config: Any, fields: dict[str, Check]) -> None:
  """Checks every field of `fields` that the config has; a missing one that is not optional is
  an error."""
  for field, check in fields.items():
    value = _lookup(config, field)
    if value is _MISSING:
      if not check.optional:
        raise ConfigError(f"{field}: missing from the config")
      continue
    check_field(field, check, value)


def model_config(config: Any) -> ModelConfig:
  """ModelConfig(**config.model) after checking its fields; every failure a ConfigError."""
  check_fields(config, MODEL_FIELDS)
  model = _lookup(config, "model")
  if model is _MISSING or not hasattr(model, "keys"):
    raise ConfigError("model: missing from the config")
  try:
    return ModelConfig(**model)
  except TypeError as e:
    raise ConfigError(f"model: {e}") from None
  except ValueError as e:
    raise ConfigError(str(e)) from None


def validate(config: Any, num_devices: int) -> ModelConfig:
  """Checks every field, then the fields against each other and the devices; returns the
  model config. Raises ConfigError (one line naming the field)."""
  check_fields(config, FIELDS)
  _check_corpora(config)
  mc = model_config(config)
  _check_evaluation(config)
  train_row, eval_row = _check_lengths(config, mc)
  _check_batches(config, train_row, eval_row)
  _check_schedule(config)
  _check_decoding(config, mc)
  dp, fsdp, tensor = _check_mesh(config, mc, num_devices)
  _check_memory(config, mc, train_row, eval_row, dp * fsdp, fsdp * tensor, tensor)
  return mc


def _check_corpora(config: Any) -> None:
  """A mixture's corpora (transformer/data/mixture.py): their own data fields as the main
  corpus's are checked, except that `heldout_pairs` may be 0 (no evaluation splits of its
  own, e.g. for synthetic pairs)."""
  for corpus in mixture.corpora_of(config)[1:]:
    for name in mixture.DATA_FIELDS:
      value = config.data.corpora[corpus.name].get(name)
      if value is None:
        continue
      check = integer(0, MAX_COUNT) if name == "heldout_pairs" else FIELDS[f"data.{name}"]
      check_field(f"{corpus.field}.{name}", check, value)


def _check_evaluation(config: Any) -> None:
  """The evaluators, and the best checkpoint's metric against what they report."""
  evals = evaluators.of_config(config)
  evaluators.check(evals)
  names = [c.name for c in mixture.corpora_of(config)]
  for name, spec in evals.items():
    corpus = spec.get("corpus", "") or ""
    if corpus and corpus not in names:
      raise ConfigError(f"evals.{name}.corpus={corpus!r}: the run has no such corpus; its "
                        f"corpora: {', '.join(names)}")
  metric = config.get("best_checkpoint", {}).get("metric", "")
  periodic = evaluators.metric_names(evals, periodic_only=True)
  if metric and metric not in periodic:
    raise ConfigError(
      f"best_checkpoint.metric={metric!r}: not reported by an evaluator that runs in the loop "
      f"(every_steps > 0): {', '.join(periodic) or 'none does'}")
  patience = config.get("early_stopping", {}).get("patience", 0)
  if patience and not metric:
    raise ConfigError(f"early_stopping.patience={patience}: needs best_checkpoint.metric, the "
                      "metric whose improvement it waits for")


def _check_lengths(config: Any, mc: ModelConfig) -> tuple[int, int]:
  """Lengths against each other and the model's positions; returns the longest row of a
  training batch and of an evaluation batch (which is never packed)."""
  data = config.data
  if data.vocab_size != mc.vocab_size:
    raise ConfigError(
      f"model.vocab_size={mc.vocab_size} differs from data.vocab_size={data.vocab_size}: set both"
    )
  max_src, max_tgt = data.max_source_len, data.max_target_len
  buckets = data.bucket_lengths
  if buckets == AUTO:
    # Derived from the training split (bucketing.derive_buckets): at most the length
    # limit rounded up to a multiple of BUCKET_MULTIPLE.
    buckets = [-(-max(max_src, max_tgt) // BUCKET_MULTIPLE) * BUCKET_MULTIPLE]
  elif buckets[-1] < max(max_src, max_tgt):
    raise ConfigError(
      f"data.bucket_lengths: the largest ({buckets[-1]}) must be >= max(data.max_source_len, "
      f"data.max_target_len) = {max(max_src, max_tgt)}"
    )
  extra = config.decode.max_extra_len
  if mc.max_len < buckets[-1] or mc.max_len < max_src + extra:
    raise ConfigError(
      f"model.max_len={mc.max_len}: must be >= the largest bucket ({buckets[-1]}) and >= "
      f"data.max_source_len + decode.max_extra_len ({max_src + extra})"
    )
  if not data.packing:
    return buckets[-1], buckets[-1]
  if mc.kind != "transformer":
    raise ConfigError(f"data.packing=True: model.kind={mc.kind!r} does not take packed rows; "
                      "use model.kind='transformer' or data.packing=False")
  lengths = {"data.packed_source_len": data.packed_source_len}
  if data.packed_target_len != AUTO:
    lengths["data.packed_target_len"] = data.packed_target_len
  for field, length in lengths.items():
    # Positions restart in every segment, so a row needs only a table as long as itself.
    if length > mc.max_len:
      raise ConfigError(f"{field}={length}: must be <= model.max_len={mc.max_len} when packing")
  return max(lengths.values()), buckets[-1]


def _check_batches(config: Any, train_row: int, eval_row: int) -> None:
  if config.average_last_checkpoints > config.keep_checkpoints:
    raise ConfigError(
      f"average_last_checkpoints={config.average_last_checkpoints}: must be <= "
      f"keep_checkpoints={config.keep_checkpoints}"
    )
  # Each micro-batch gets rows of its own, also in a batch of the longest rows (a packed
  # target length 'auto' is not known yet: the source length stands in for it).
  rows = max(1, config.data.tokens_per_batch // train_row)
  if config.grad_accum_steps > rows:
    raise ConfigError(
      f"grad_accum_steps={config.grad_accum_steps}: must be <= {rows}, the rows of a batch of "
      f"{train_row} tokens a row (data.tokens_per_batch={config.data.tokens_per_batch}), so "
      "that every micro-batch has a row"
    )
  tokens = config.data.eval_batch_size * eval_row
  if tokens > MAX_TOKENS:
    raise ConfigError(
      f"data.eval_batch_size={config.data.eval_batch_size}: rows of up to {eval_row} tokens "
      f"make {tokens:,} tokens a batch; must be at most {MAX_TOKENS:,}"
    )


def _check_schedule(config: Any) -> None:
  """The fields `optimizer.schedule` needs (transformer/schedules.py)."""
  opt = config.optimizer
  name = opt.get("schedule", "paper")
  if name in NEED_WARMUP and opt.warmup_steps < 1:
    raise ConfigError(f"optimizer.warmup_steps={opt.warmup_steps}: must be at least 1 for "
                      f"optimizer.schedule={name!r} (0 means no warm-up only for 'cosine' and "
                      "'constant')")
  if name == "paper":
    return
  if "learning_rate" not in opt:
    raise ConfigError(f"optimizer.learning_rate: missing from the config; "
                      f"optimizer.schedule={name!r} needs its peak rate")
  if name != "cosine":
    return
  if opt.warmup_steps >= config.num_train_steps:
    raise ConfigError(
      f"optimizer.warmup_steps={opt.warmup_steps}: must be less than num_train_steps="
      f"{config.num_train_steps} for optimizer.schedule='cosine', which decays from the end of "
      "the warm-up to num_train_steps")
  end = opt.get("end_learning_rate", 0.0)
  if end > opt.learning_rate:
    raise ConfigError(f"optimizer.end_learning_rate={end}: must be at most "
                      f"optimizer.learning_rate={opt.learning_rate}, the rate the cosine "
                      "decays from")


def _check_decoding(config: Any, mc: ModelConfig) -> None:
  decode = config.decode
  for field in ("beam_size", "top_k"):
    if decode.get(field, 0) > mc.vocab_size:
      raise ConfigError(f"decode.{field}={decode[field]}: must be at most "
                        f"model.vocab_size={mc.vocab_size}")
  tokens = decode.batch_size * decode.beam_size * mc.max_len
  if tokens > MAX_TOKENS:
    raise ConfigError(
      f"decode.batch_size={decode.batch_size} x decode.beam_size={decode.beam_size} x "
      f"model.max_len={mc.max_len} = {tokens:,} tokens of decoder state; must be at most "
      f"{MAX_TOKENS:,}"
    )
  if decode.get("method") == "mbr":
    candidates = decode.get("mbr_candidates", 16)
    if decode.get("mbr_sampler", "sample") == "beam" and candidates > decode.beam_size:
      raise ConfigError(f"decode.mbr_candidates={candidates}: with decode.mbr_sampler='beam' "
                        f"the candidates are the beam's n-best list, at most "
                        f"decode.beam_size={decode.beam_size}")
    tokens = decode.batch_size * candidates * mc.max_len
    if tokens > MAX_TOKENS:
      raise ConfigError(
        f"decode.batch_size={decode.batch_size} x decode.mbr_candidates={candidates} x "
        f"model.max_len={mc.max_len} = {tokens:,} tokens of decoder state; must be at most "
        f"{MAX_TOKENS:,}")


def _check_mesh(config: Any, mc: ModelConfig, num_devices: int) -> tuple[int, int, int]:
  """The mesh against the devices, and dimensions against the axes that split them; returns
  the mesh's shape (data, fsdp, tensor)."""
  sizes = {f"mesh.{name}": config.mesh[name] for name in sharding_lib.MESH_AXES}
  for field, size in sizes.items():
    if size > num_devices:
      raise ConfigError(f"{field}={size}: must be -1 (the remaining devices) or a number of "
                        f"devices from 1 to {num_devices}")
  try:
    data, fsdp, tensor = sharding_lib.mesh_shape(config.mesh, num_devices)
  except ConfigError as e:  # its message names the mesh; name each axis too
    shown = ", ".join(f"{field}={size}" for field, size in sizes.items())
    raise ConfigError(f"{shown}: {str(e).removeprefix('mesh: ')}") from None
  for field, size, axis, n in (
    ("model.num_heads", mc.num_heads, "tensor", tensor),
    ("model.d_ff", mc.d_ff, "tensor", tensor),
    ("model.vocab_size", mc.vocab_size, "tensor", tensor),
    ("model.d_model", mc.d_model, "fsdp", fsdp),
  ):
    if size % n:
      raise ConfigError(f"{field}={size} is not divisible by mesh.{axis}={n}: change one of them")
  return data, fsdp, tensor


def device_bytes(mc: ModelConfig, tokens: int, batch_devices: int, param_devices: int,
                 tensor: int) -> int:
  """An upper estimate of one device's training memory: float32 parameters with gradients and
  Adam's two moments (16 bytes each, split over `param_devices`), and the float32 logits of
  `tokens` target tokens (split over `batch_devices`, the vocabulary over `tensor`)."""
  d, k, f = mc.d_model, mc.num_heads * mc.head_dim, mc.d_ff
  # An encoder and a decoder layer: three attentions, two feed-forward blocks, and as much
  # again as an LSTM layer's gates would take.
  layer = 3 * 4 * d * k + 2 * 2 * d * f + 16 * d * d
  embeddings = (1 if mc.share_embeddings else 3) * mc.vocab_size * d + mc.max_len * d
  params = embeddings + mc.num_layers * layer
  logits = 4 * -(-tokens // batch_devices) * -(-mc.vocab_size // tensor)
  return 16 * params // param_devices + logits


def _check_memory(config: Any, mc: ModelConfig, train_row: int, eval_row: int,
                  batch_devices: int, param_devices: int, tensor: int) -> None:
  # A micro-batch holds whole rows: at least one.
  micro = max(config.data.tokens_per_batch // config.grad_accum_steps, train_row)
  tokens = max(micro, config.data.eval_batch_size * eval_row)
  need = device_bytes(mc, tokens, batch_devices, param_devices, tensor)
  if need > MAX_DEVICE_BYTES:
    raise ConfigError(
      f"model.vocab_size={mc.vocab_size}, model.d_model={mc.d_model}, model.d_ff={mc.d_ff}, "
      f"model.num_layers={mc.num_layers} with data.tokens_per_batch="
      f"{config.data.tokens_per_batch}: about {need / 2**30:,.0f} GiB a device (parameters, "
      f"optimizer state, logits), more than {MAX_DEVICE_BYTES // 2**30:,} GiB; make the model "
      "or the batches smaller, or split them over more devices (mesh.fsdp, mesh.tensor)"
    )


# What defines the model and the vocabulary it was trained with: fields a workdir's saved config
# and the config of a later mode must agree on.
FIXED = ("dataset", "model", "data")
# Fields under FIXED that only say how evaluation data is batched or where caches live.
FREE = ("data.eval_batch_size", "data.cache_dir", "data.download")


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(node, config_dict.ConfigDict | dict):
    out = {}
    for key in node.keys():
      out.update(_flat(node[key], f"{prefix}{key}."))
    return out
  return {prefix[:-1]: json.loads(workdir_lib.to_json_value(node))}


def _model_defaults() -> dict[str, Any]:
  """ModelConfig's defaults, as `_flat` gives them."""
  return {k: json.loads(workdir_lib.to_json_value(v)) for k, v in
          dataclasses.asdict(ModelConfig()).items()}


def check_same(saved: config_dict.ConfigDict, config: config_dict.ConfigDict) -> None:
  """Raises ConfigError naming the first model or data field where `config` differs from the
  `saved` one (decoding, evaluation and program fields may differ)."""

  def fixed(c: config_dict.ConfigDict) -> dict[str, Any]:
    out = {}
    for name in FIXED:
      if name in c:
        out.update(_flat(c[name], f"{name}.") if isinstance(c[name], config_dict.ConfigDict)
                   else {name: c[name]})
    return {k: v for k, v in out.items() if k not in FREE}

  want, got = fixed(saved), fixed(config)
  # A model field absent from one of them is newer than that config: it had the default.
  default = {f"model.{k}": v for k, v in _model_defaults().items()}
  want, got = {**default, **want}, {**default, **got}
  for field in sorted(set(want) | set(got)):
    if want.get(field, "<absent>") != got.get(field, "<absent>"):
      raise ConfigError(
        f"{field}={got.get(field, '<absent>')!r} differs from {want.get(field, '<absent>')!r} "
        f"in the workdir's {workdir_lib.CONFIG}: the model and its data are the training "
        "run's; drop --config (the workdir's config is the default) or that override")
