"""Evaluators named in the config: what the training loop and the final evaluation measure.

Each entry of `config.evals` is one evaluator (big_vision's `config.evals` is the model):

    config.evals.valid_loss = dict(type="loss", split="validation", prefix="eval",
                                   every_steps=500)
    config.evals.valid_translation = dict(type="translation", split="validation",
                                          prefix="eval", every_steps=0, sentences=200,
                                          metrics="bleu,chrf,ter", beam_size=None, alpha=None)

`type` picks the class in `TYPES`; `split` is `validation` or `test`; `prefix` names the
metrics (`eval/loss`, `test/bleu`); `every_steps` is how often the loop runs it (0: only in the
final evaluation, which runs every evaluator); `corpus` names the corpus of a mixture whose
split it reads ('' or 'main': the main corpus; transformer/data/mixture.py), so that a
multilingual run reports BLEU per direction. A new metric is a new class in `TYPES` and an
entry in a config, not an edit of the loop: the class has `FIELDS` (its fields and their
defaults), `names(spec)` (the metrics it reports) and `run(params, step, tag) -> Result`, and
is built as `cls(name, spec, context)`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from transformer import sharding as sharding_lib
from transformer import storage
from transformer import workdir as workdir_lib
from transformer.data import mixture
from transformer.decoding import bleu as bleu_lib
from transformer.errors import ConfigError, show
from transformer.metrics import summarize

SPLITS = ("validation", "test")
# What a translation evaluator can report: sacrebleu's BLEU, chrF and TER of detokenized
# text, and the paper's tokenized, compound-split BLEU (WMT English-German only).
TRANSLATION_METRICS = ("bleu", "chrf", "ter", "bleu_tokenized")
MAX_STEPS = 2**31 - 1


@dataclasses.dataclass
class Context:
  """What evaluators share: the model, the data and where to write.

  Attributes:
    layout: the model's `layout.ModelLayout` (its `eval_step` scores batches).
    make_translator: decode config -> a `translate.Translator` over the trainer's mesh.
    tokenizer: the run's vocabulary.
    batches: split -> fixed-shape evaluation batches of this process.
    references: split -> (source, target) text pairs.
    workdir: where translations are written (`translations/`).
    config: the run's config.
    tag_ids: corpus name -> its tag's id, put in front of its sources.
    restore_members: ensemble members (`WORKDIR[@CHECKPOINT]`s) and the field that names them
      -> their restored models (`parameters.restore_members` on this run's mesh); for the
      translation evaluators' `ensemble` field.
  """

  layout: Any
  make_translator: Callable[[Any], Any]
  tokenizer: Any
  batches: dict[str, list[dict[str, np.ndarray]]]
  references: dict[str, list[tuple[str, str]]]
  workdir: str
  config: Any
  restore_members: Callable[[list[str], str], list[Any]] | None = None
  # corpus name -> the id of its tag (a mixture's tagged corpora; input_pipeline.Pipeline).
  tag_ids: dict[str, int] = dataclasses.field(default_factory=dict)
  _translators: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

  def translator(self, decode: Any) -> Any:
    """The translator of the `decode` settings, one per distinct settings: evaluators that
    search alike (validation and test BLEU) share its compiled programs."""
    key = decode.to_json(sort_keys=True)
    if key not in self._translators:
      self._translators[key] = self.make_translator(decode)
    return self._translators[key]


@dataclasses.dataclass
class Result:
  """An evaluator's metrics, with the signatures and samples a report may print."""

  metrics: dict[str, float]
  signatures: dict[str, str] = dataclasses.field(default_factory=dict)
  samples: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)


def evaluate_loss(layout: Any, params: Any, batches: list[dict[str, np.ndarray]],
                  prefix: str) -> dict[str, float]:
  """Loss, nll, perplexity and token accuracy of `params` over fixed-shape batches (`layout`:
  a `ModelLayout`, or anything with its `eval_step` and `mesh`)."""
  totals: dict[str, float] = {}
  for batch in batches:
    rows = {k: batch[k] for k in ("inputs", "targets")}
    sums = layout.eval_step(params, sharding_lib.local_batch_to_global(rows, layout.mesh))
    for k, v in jax.device_get(sums).items():
      totals[k] = totals.get(k, 0.0) + float(v)
  return summarize(totals, prefix)


class LossEvaluator:
  """Teacher-forced loss, nll, perplexity and accuracy on a split: `{prefix}/loss`, ..."""

  FIELDS = {"split": "validation", "prefix": "eval", "every_steps": 0, "corpus": ""}

  def __init__(self, name: str, spec: Any, context: Context):
    self.name, self.spec, self.context = name, spec, context

  @staticmethod
  def names(spec: Any) -> list[str]:
    """The metrics it reports, from its fields (with their defaults filled in)."""
    return [f"{spec['prefix']}/{m}" for m in ("loss", "nll", "perplexity", "accuracy")]

  def run(self, params: Any, step: int, tag: str = "") -> Result:
    del step
    return Result(evaluate_loss(self.context.layout, params,
                                self.context.batches[split_key(self.spec)],
                                f"{tag}{self.spec.prefix}"))


def split_key(spec: Any) -> str:
  """The key of an evaluator's split in the context's batches and references: its `split`,
  of its `corpus` ('': the main one; `mixture.split_key`)."""
  return mixture.split_key(spec.get("corpus") or "", spec.split)


def translations_path(workdir: str, split: str, step: int, tag: str = "") -> Any:
  """Where a translation evaluator writes a split's translations at `step`."""
  return workdir_lib.paths(workdir).translations / f"{tag}{split}_{step}.txt"


class TranslationEvaluator:
  """Decodes a split's first `sentences` sources (0: all) and scores them against the
  references: `{prefix}/bleu`, `{prefix}/chrf`, ... The translations go to
  `<workdir>/translations/{tag}{split}_{step}.txt`. `beam_size` and `alpha` override the
  config's `decode` fields for this evaluator (None: the config's). `ensemble`, a
  comma-separated list of other workdirs (`WORKDIR[@CHECKPOINT]`: seeds, runs, checkpoints),
  decodes the evaluated parameters together with theirs as one ensemble (log probabilities
  averaged at every step; `infer.restore_ensemble`), e.g. in the final evaluation."""

  FIELDS = {"split": "validation", "prefix": "eval", "every_steps": 0, "sentences": 0,
            "metrics": "bleu,chrf,ter", "beam_size": None, "alpha": None, "ensemble": "",
            "corpus": ""}

  def __init__(self, name: str, spec: Any, context: Context):
    self.name, self.spec, self.context = name, spec, context
    decode = context.config.decode.copy_and_resolve_references()
    for field in ("beam_size", "alpha"):
      if spec.get(field) is not None:
        decode[field] = spec[field]
    self.translator = context.translator(decode)
    self.member_params: tuple[Any, ...] = ()
    members = [m.strip() for m in (spec.get("ensemble") or "").split(",") if m.strip()]
    if members:
      if context.restore_members is None:
        raise ConfigError(f"evals.{name}.ensemble: this program cannot restore ensemble "
                          "members")
      models = context.restore_members(members, f"evals.{name}.ensemble")
      self.translator = self.translator.with_members(
        [m.layout.model_config for m in models], [m.layout.param_shardings for m in models])
      self.member_params = tuple(m.params for m in models)

  @staticmethod
  def names(spec: Any) -> list[str]:
    return [f"{spec['prefix']}/{m}" for m in _metric_list(spec["metrics"])]

  def run(self, params: Any, step: int, tag: str = "") -> Result:
    key = split_key(self.spec)
    pairs = self.context.references[key][: self.spec.sentences or None]
    tokenizer = self.context.tokenizer
    if self.member_params:
      params = (params, *self.member_params)
    source_tag = self.context.tag_ids.get(self.spec.corpus or mixture.MAIN)
    sources = [tokenizer.encode(s) for s, _ in pairs]
    if source_tag is not None:
      sources = [[source_tag, *ids] for ids in sources]
    hyps = [tokenizer.decode(ids) for ids in self.translator.translate_ids(params, sources)]
    if jax.process_index() == 0:
      path = translations_path(self.context.workdir, key.replace("/", "_"), step, tag)
      storage.write_atomic(path, "".join(h + "\n" for h in hyps))
    refs = [t for _, t in pairs]
    wanted = _metric_list(self.spec.metrics)
    scores = bleu_lib.corpus_scores(hyps, refs)
    result = Result({}, samples=[(s, h, t) for (s, t), h in zip(pairs, hyps, strict=True)][
      : self.context.config.num_samples_to_print])
    prefix = f"{tag}{self.spec.prefix}"
    for metric in wanted:
      if metric == "bleu_tokenized":
        result.metrics[f"{prefix}/{metric}"] = bleu_lib.tokenized_bleu(hyps, refs).score
      else:
        result.metrics[f"{prefix}/{metric}"] = scores[metric].score
        result.signatures[f"{prefix}/{metric}"] = scores[metric].signature
    return result


TYPES: dict[str, type] = {"loss": LossEvaluator, "translation": TranslationEvaluator}


def default_evals() -> Any:
  """The evaluators of every config unless it says otherwise (configs/common.py), and of a
  workdir's config saved before configs listed them: validation loss every 500 steps,
  validation and test BLEU, chrF and TER in the final evaluation."""
  from ml_collections import config_dict

  translation = {"type": "translation", "every_steps": 0, "sentences": 0,
                 "metrics": "bleu,chrf,ter", "beam_size": config_dict.placeholder(int),
                 "alpha": config_dict.placeholder(float), "ensemble": ""}
  return config_dict.ConfigDict({
    "valid_loss": {"type": "loss", "split": "validation", "prefix": "eval",
                   "every_steps": 500},
    # sentences: how many of the split's first sentences are decoded (0: all); beam_size and
    # alpha: this evaluator's search (None: decode's); ensemble: other workdirs decoded with
    # the evaluated parameters as one model (WORKDIR[@CHECKPOINT],...; '' for none).
    "valid_translation": {**translation, "split": "validation", "prefix": "eval"},
    "test_translation": {**translation, "split": "test", "prefix": "test"},
  })


def of_config(config: Any) -> Any:
  """`config.evals`, or `default_evals()` for a config without the field."""
  evals = config.get("evals")
  return default_evals() if evals is None else evals


def _metric_list(metrics: str) -> list[str]:
  return [m.strip() for m in metrics.split(",") if m.strip()]


def check(evals: Any) -> None:
  """Raises ConfigError naming the first bad field of `config.evals` (`evals.NAME.FIELD`)."""
  if not hasattr(evals, "items"):
    raise ConfigError(f"evals: must be a mapping of evaluator names to their fields, got "
                      f"{show(evals)}")
  prefixes: dict[str, str] = {}
  for name, spec in evals.items():
    where = f"evals.{name}"
    if not hasattr(spec, "get") or not hasattr(spec, "keys"):
      raise ConfigError(f"{where}: must be a mapping with a 'type' ({', '.join(TYPES)})")
    kind = spec.get("type")
    if not isinstance(kind, str) or kind not in TYPES:
      raise ConfigError(f"{where}.type={show(kind)}: must be one of {', '.join(TYPES)}")
    fields = TYPES[kind].FIELDS
    unknown = sorted(set(spec.keys()) - set(fields) - {"type"})
    if unknown:
      raise ConfigError(f"{where}.{unknown[0]}: not a field of a {kind} evaluator (fields: "
                        f"{', '.join(fields)})")
    split = spec.get("split", fields["split"])
    if not isinstance(split, str) or split not in SPLITS:
      raise ConfigError(f"{where}.split={show(split)}: must be one of {', '.join(SPLITS)}")
    if not isinstance(spec.get("corpus", "") or "", str):
      raise ConfigError(f"{where}.corpus={show(spec.get('corpus'))}: must be the name of one "
                        "of the run's corpora ('' for the main one)")
    prefix = spec.get("prefix", fields["prefix"])
    if not isinstance(prefix, str) or not prefix or not all(
        c.isalnum() or c in "_-" for c in prefix):
      raise ConfigError(f"{where}.prefix={show(prefix)}: must be a name of letters, digits, "
                        "'_' or '-' (metrics are named PREFIX/METRIC)")
    _check_int(f"{where}.every_steps", spec.get("every_steps", 0), 0, MAX_STEPS,
               " (0: in the final evaluation only)")
    if kind == "translation":
      _check_int(f"{where}.sentences", spec.get("sentences", 0), 0, MAX_STEPS, " (0: all)")
      metrics = spec.get("metrics", fields["metrics"])
      if not isinstance(metrics, str) or not _metric_list(metrics) or any(
          m not in TRANSLATION_METRICS for m in _metric_list(metrics)):
        raise ConfigError(f"{where}.metrics={show(metrics)}: must be a comma-separated list "
                          f"of {', '.join(TRANSLATION_METRICS)}")
      if spec.get("beam_size") is not None:
        _check_int(f"{where}.beam_size", spec.get("beam_size"), 1, 2**20, " (None: decode's)")
      if not isinstance(spec.get("ensemble", "") or "", str):
        raise ConfigError(f"{where}.ensemble={show(spec.get('ensemble'))}: must be a "
                          "comma-separated list of WORKDIR[@CHECKPOINT] ('' for none)")
      alpha = spec.get("alpha")
      if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, int | float)
                                or not math.isfinite(alpha) or not 0 <= alpha <= 100):
        raise ConfigError(f"{where}.alpha={show(alpha)}: must be a number in [0, 100] "
                          "(None: decode's)")
    for metric in TYPES[kind].names(_filled(spec)):
      if metric in prefixes:
        raise ConfigError(f"{where}: its metric {metric} is also evals.{prefixes[metric]}'s; "
                          "give one of them another prefix")
      prefixes[metric] = name


def _filled(spec: Any) -> _Spec:
  """An entry's fields with its type's defaults for those it leaves out."""
  return _Spec({**TYPES[spec["type"]].FIELDS, **{k: v for k, v in spec.items() if k != "type"}})


def metric_names(evals: Any, periodic_only: bool = False) -> list[str]:
  """Every metric the evaluators of `evals` report (those that run in the loop, with
  `periodic_only`), in config order."""
  out = []
  for spec in evals.values():
    if periodic_only and not spec.get("every_steps", 0):
      continue
    out.extend(TYPES[spec["type"]].names(_filled(spec)))
  return out


def _check_int(field: str, value: Any, lo: int, hi: int, note: str = "") -> None:
  if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
    raise ConfigError(f"{field}={show(value)}: must be an integer in [{lo}, {hi}]{note}")


def build(evals: Any, context: Context) -> list[Any]:
  """The evaluators of `evals` (checked by `check`), each with its defaults filled in."""
  return [TYPES[spec["type"]](name, _filled(spec), context) for name, spec in evals.items()]


class _Spec(dict):
  """An evaluator's fields, read as attributes."""

  __getattr__ = dict.__getitem__


def run_all(evaluators: list[Any], params: Any, step: int, tag: str = "") -> Result:
  """Every evaluator's metrics, signatures and samples (the last translation's), merged."""
  merged = Result({})
  for evaluator in evaluators:
    result = evaluator.run(params, step, tag)
    merged.metrics.update(result.metrics)
    merged.signatures.update(result.signatures)
    merged.samples = result.samples or merged.samples
  return merged


def due(evaluators: list[Any], step: int, last: int) -> list[Any]:
  """The evaluators that run after `step` of a run of `last` steps (the final evaluation runs
  every one at `last`)."""
  return [e for e in evaluators
          if e.spec.every_steps and step % e.spec.every_steps == 0 and step < last]


# How `format_result` names metrics: PREFIX/NAME -> 'Validation loss', 'Test BLEU', ...
_PREFIX_NAMES = {"eval": "Validation", "test": "Test"}
_METRIC_NAMES = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER",
                 "bleu_tokenized": "BLEU (tokenized, compound-split)"}


def format_result(result: Result) -> str:
  """One line per metric, e.g. 'Test BLEU: 27.31   [nrefs:1|case:mixed|...]'."""
  lines = []
  rank = {name: i for i, name in enumerate(_PREFIX_NAMES)}
  ordered = sorted(result.metrics.items(),  # validation before test, else as reported
                   key=lambda kv: rank.get(kv[0].rpartition("/")[0].split("_")[-1], len(rank)))
  for key, value in ordered:
    prefix, _, name = key.rpartition("/")
    tag = ""
    for known in _PREFIX_NAMES:
      if prefix.endswith(known):
        tag, prefix = prefix[: -len(known)], _PREFIX_NAMES[known]
    label = f"{tag.replace('_', ' ').strip().capitalize() + ' ' if tag else ''}{prefix} " \
            f"{_METRIC_NAMES.get(name, name)}"
    digits = 2 if name in _METRIC_NAMES else 4
    signature = result.signatures.get(key)
    lines.append(f"{label}: {value:.{digits}f}" + (f"   [{signature}]" if signature else ""))
  return "\n".join(lines)
