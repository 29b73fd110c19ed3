"""The modes of the main program, one function each, in one table (`MODES`, as t5x's main.py).

Every mode is `mode(config, workdir, request)`: `request` holds the command line's flags that
modes read. The heavy imports happen inside each mode, so the table costs nothing to import.

  train      train, evaluate, checkpoint; resume the workdir (transformer/training/train.py)
  translate  a corpus, read in chunks, with n-best lists, sampling, jsonl; resumable output
             (transformer/decoding/files.py)
  score      log p(target | source) of every `source<TAB>target` line
  average    the mean of the newest N checkpoints, evaluated by the config's evaluators
  export     the chosen parameters as a CTranslate2 model (transformer/interop/export.py)
  import     an OPUS-MT (Marian) model directory as a new workdir (transformer/interop/marian.py)
  compare    systems on a test set: BLEU, chrF, TER, paired bootstrap resampling and
             approximate randomization (transformer/decoding/significance.py)

translate, score and export use the parameters that `--checkpoint` and `--average` choose
(`workdir.choose`: the newest checkpoint, the best, a step, or an average).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from transformer import workdir as workdir_lib
from transformer.errors import UserError


@dataclasses.dataclass(frozen=True)
class Request:
  """The flags of the main program that modes read (see transformer/main.py for each)."""

  input: str | None = None
  output: str | None = None
  nbest: int = 1
  output_format: str = "text"
  checkpoint: str = workdir_lib.LATEST
  average: int | None = None
  format: str | None = None
  quantization: str | None = None
  source: str | None = None
  ensemble: tuple[str, ...] = ()
  ensemble_weights: tuple[float, ...] = ()
  target_prefix: bool = False
  references: str | None = None
  systems: tuple[str, ...] = ()
  bootstrap_samples: int = 1000
  randomization_trials: int = 10000


def check_workdir_config(config: Any, workdir: str) -> None:
  """Before an inference mode: the config's model and data fields are the workdir's, and every
  field is valid."""
  import jax

  from transformer.training.validate import check_same, validate

  saved = workdir_lib.load(workdir)
  if saved is not None:
    check_same(saved, config)
  validate(config, jax.device_count())


def restore(config: Any, workdir: str, request: Request) -> Any:
  """The parameters translate and score use: `--checkpoint`/`--average` of `--workdir`, and
  with `--ensemble` its members too (`infer.restore_ensemble`)."""
  from transformer import infer

  if request.ensemble:
    return infer.restore_ensemble(config, workdir, request.ensemble,
                                  request.ensemble_weights or None, request.average,
                                  request.checkpoint)
  if request.ensemble_weights:
    raise UserError("--ensemble_weights needs --ensemble (the other members)")
  return infer.restore(config, workdir, request.average, request.checkpoint)


def check_no_ensemble(request: Request, mode: str) -> None:
  if request.ensemble or request.ensemble_weights:
    raise UserError(f"--ensemble: --mode={mode} takes one model; ensembles translate and score")


def train(config: Any, workdir: str, request: Request) -> None:
  """`--mode=train`: trains (or resumes), then prints the final evaluation and samples."""
  import jax

  from transformer.training.evaluators import Result, format_result
  from transformer.training.train import train_and_evaluate

  result = train_and_evaluate(config, workdir)
  if result.get("interrupted"):
    print(f"Interrupted by {result['interrupted']} at step {result['step']}; checkpoint saved. "
          "Run the same command again to continue.", flush=True)
    return
  if jax.process_index() != 0:
    return
  if result.get("stopped_early"):
    print(f"\nStopped early at step {result['step']}: {result['stopped_early']}")
  print(f"\nStep {result['step']}, evaluating the parameters: {result['evaluated']}")
  metrics = {k: v for k, v in result.items() if isinstance(v, float) and "/" in k}
  print(format_result(Result(metrics, result["signatures"])))
  for src, hyp, ref in result["samples"]:
    print(f"  source:      {src}\n  translation: {hyp}\n  reference:   {ref}\n")
  print(f"Metrics: {workdir_lib.paths(workdir).metrics}", flush=True)


def translate(config: Any, workdir: str, request: Request) -> None:
  """`--mode=translate`: `--input` (or stdin) to `--output` (or stdout), in chunks;
  transformer/decoding/files.py documents the formats and the resume."""
  from transformer.data import mixture
  from transformer.decoding import files
  from transformer.decoding.translate import Search

  check_workdir_config(config, workdir)
  search = Search.from_config(config.decode)
  files.check_request("translate", request.nbest, request.output_format, search, request.input,
                      request.output)
  mixture.check_known_tag(config.decode.get("tag", ""), mixture.tags(config))
  model = restore(config, workdir, request)
  settings = {"mode": "translate", "nbest": request.nbest, "format": request.output_format,
              "parameters": model.label, "search": dataclasses.asdict(search),
              "target_prefix": request.target_prefix, "tag": config.decode.get("tag", ""),
              **_input_identity(request.input)}
  files.translate_corpus(files.CorpusRun(model, request.input, request.output, settings), config,
                         request.nbest, request.output_format, request.target_prefix)


def score(config: Any, workdir: str, request: Request) -> None:
  """`--mode=score`: log p(target | source) of every `source<TAB>target` line of `--input`."""
  from transformer.data import mixture
  from transformer.decoding import files
  from transformer.decoding.translate import Search

  check_workdir_config(config, workdir)
  files.check_request("score", 1, "jsonl", Search.from_config(config.decode), request.input,
                      request.output)
  mixture.check_known_tag(config.decode.get("tag", ""), mixture.tags(config))
  total = files.check_score_input(request.input)
  model = restore(config, workdir, request)
  settings = {"mode": "score", "parameters": model.label, "tag": config.decode.get("tag", ""),
              **_input_identity(request.input)}
  files.score_corpus(files.CorpusRun(model, request.input, request.output, settings), config,
                     total)


def _input_identity(input_path: str | None) -> dict[str, Any]:
  """What tells a resumed run that its input is unchanged."""
  if input_path is None:
    return {"input": None}
  stat = os.stat(input_path)
  return {"input": os.path.abspath(input_path), "input_bytes": stat.st_size,
          "input_mtime_ns": stat.st_mtime_ns}


def average(config: Any, workdir: str, request: Request) -> None:
  """`--mode=average`: averages the newest N checkpoints, then runs the config's evaluators.

  Metrics go to `metrics.jsonl` at the newest step with the prefix `average_` (e.g.
  `average_eval/loss`, `average_test/bleu`), translations to
  `translations/average_{validation,test}_<step>.txt`.
  """
  import jax

  from transformer import infer
  from transformer import sharding as sharding_lib
  from transformer.data import bucketing, input_pipeline, mixture
  from transformer.decoding.translate import Translator
  from transformer.metrics import MetricWriter
  from transformer.training import evaluators, parameters

  check_workdir_config(config, workdir)
  check_no_ensemble(request, "average")
  if workdir_lib.parse_checkpoint(request.checkpoint) != workdir_lib.LATEST:
    raise UserError(f"--checkpoint={request.checkpoint}: --mode=average evaluates the mean of "
                    "the newest --average=N checkpoints; --checkpoint is for translate, score "
                    "and export")
  n = request.average or config.average_last_checkpoints
  if n < 2:
    raise UserError("--mode=average needs --average=N with N >= 2")
  model = infer.restore(config, workdir, n)
  buckets = bucketing.workdir_buckets(config, workdir)
  layout = model.layout
  batches, references = input_pipeline.evaluation_data(
    config, input_pipeline.open_reader(config), model.tokenizer,
    sharding_lib.data_parallel_size(layout.mesh), process_index=jax.process_index(),
    process_count=jax.process_count(), buckets=buckets)
  context = evaluators.Context(
    layout, lambda decode: Translator(layout.model_config, decode, layout.mesh,
                                      layout.param_shardings, buckets,
                                      detokenize=model.tokenizer.decode),
    model.tokenizer, batches, references, workdir, config,
    restore_members=lambda specs, what: parameters.restore_members(
      config, model.tokenizer, specs, layout.mesh, what),
    tag_ids=mixture.tag_ids(model.tokenizer, mixture.corpora_of(config))
    if mixture.is_mixture(config) else {})
  evals = evaluators.build(evaluators.of_config(config), context)
  result = evaluators.run_all(evals, model.params, model.step, tag="average_")
  MetricWriter(workdir, tensorboard=False).write(model.step, result.metrics)
  print(f"{model.label}:\n{evaluators.format_result(result)}", flush=True)


EXPORT_FORMATS = ("ctranslate2", "marian")


def export(config: Any, workdir: str, request: Request) -> None:
  """`--mode=export`: the chosen parameters written to `--output` in `--format`: a
  CTranslate2 model (transformer/interop/export.py) or a Hugging Face Marian directory
  (transformer/interop/marian_export.py).

  The request is checked before anything is restored; an existing non-empty `--output` is
  refused, so nothing is overwritten.
  """
  import jax

  from transformer import infer
  from transformer.interop import export as export_lib
  from transformer.interop import marian_export
  from transformer.training.validate import model_config

  check_workdir_config(config, workdir)
  check_no_ensemble(request, "export")
  if request.format is None:
    raise UserError(f"--mode=export needs --format, one of {', '.join(EXPORT_FORMATS)}")
  if request.format == "marian":
    if request.quantization is not None:
      raise UserError(f"--quantization={request.quantization}: the Marian export is float32 "
                      "(quantization is CTranslate2's)")
    export_lib.check_output(request.output)
    marian_export.check_model(model_config(config))
  else:
    if request.format not in EXPORT_FORMATS:
      raise UserError(f"--format={request.format}: must be one of {', '.join(EXPORT_FORMATS)}")
    export_lib.check_request(request.format, request.output, request.quantization,
                             model_config(config))
  model = infer.restore(config, workdir, request.average, request.checkpoint)
  if jax.process_index() == 0:
    if request.format == "marian":
      marian_export.export_marian(model.params, model.layout.model_config, model.tokenizer,
                                  config, request.output)
    else:
      export_lib.export_restored(model, request.output, request.quantization)
    print(f"exported the parameters of {model.label} to {request.output} ({request.format}"
          f"{', ' + request.quantization if request.quantization else ''})", flush=True)


def import_model(config: Any, workdir: str, request: Request) -> None:
  """`--mode=import --source=DIR`: the Marian (OPUS-MT) model of DIR as a new workdir, its
  training and decoding fields from `config` (transformer/interop/marian.py)."""
  import jax

  from transformer.interop import marian

  if not request.source:
    raise UserError("--mode=import needs --source=DIR, a Hugging Face Marian model directory "
                    "(config.json, model.safetensors, source.spm, target.spm, vocab.json)")
  summary = marian.import_model(config, request.source, workdir)
  if jax.process_index() == 0:
    print(summary, flush=True)


def _read_lines(path: str, what: str) -> list[str]:
  if not os.path.isfile(path):
    raise UserError(f"{what}={path}: no such file")
  with open(path, encoding="utf-8", errors="replace") as f:
    return [line.rstrip("\n") for line in f]


def _parse_system(spec: str) -> tuple[str, str, str]:
  """`[NAME=]PATH[@CHECKPOINT]` -> (name, path, checkpoint or '')."""
  name, _, path = spec.partition("=") if "=" in spec else (spec, "", spec)
  where, _, checkpoint = path.partition("@")
  return name or path, where, checkpoint


def system_hypotheses(spec: str, input_path: str | None) -> tuple[str, list[str]]:
  """One system of `--systems`: `[NAME=]PATH`, PATH a file of hypotheses (one line per
  reference) or a workdir, optionally `WORKDIR@CHECKPOINT` (latest, best or a step), which
  translates `--input` with its own config. Returns (name, hypotheses)."""
  name, where, checkpoint = _parse_system(spec)
  if os.path.isfile(where) and not checkpoint:
    return name, _read_lines(where, f"--systems {name}")
  if not os.path.isdir(where):
    raise UserError(f"--systems: {name}: {where} is neither a file of hypotheses nor a workdir")
  from transformer import infer

  config = workdir_lib.load(where)
  if config is None:
    raise UserError(f"--systems: {name}: {where} has no {workdir_lib.CONFIG}: not a workdir")
  if input_path is None:
    raise UserError(f"--systems: {name} is a workdir: --input=FILE (the source sentences) is "
                    "needed to translate")
  check_workdir_config(config, where)
  model = infer.restore(config, where, checkpoint=checkpoint or None)
  sources = _read_lines(input_path, "--input")
  ids = model.translator.translate_ids(model.params, [model.tokenizer.encode(s) for s in sources])
  print(f"{name}: translated {len(sources)} sentences with {model.label}", flush=True)
  return name, [model.tokenizer.decode(x) for x in ids]


def compare(config: Any, workdir: str | None, request: Request) -> None:
  """`--mode=compare`: the systems of `--systems` (the first the baseline) on the references
  of `--references`: a table on stdout, and with `--output=FILE` the whole comparison as
  JSON (transformer/decoding/significance.py)."""
  import json

  from transformer import storage
  from transformer.decoding import significance

  if not request.references:
    raise UserError("--mode=compare needs --references=FILE, one reference per line")
  if request.output is not None and os.path.exists(request.output):
    raise UserError(f"--output={request.output} exists: remove it or choose another file "
                    "(it is never overwritten)")
  if request.bootstrap_samples < 1 or request.randomization_trials < 1:
    raise UserError("--bootstrap_samples and --randomization_trials must be >= 1")
  references = _read_lines(request.references, "--references")
  specs = [s for s in request.systems if s]
  if len(specs) < 2:
    raise UserError("--mode=compare needs --systems=A,B[,...]: two or more files of "
                    "hypotheses or workdirs, the first the baseline")
  # Files are checked before any workdir translates.
  for spec in specs:
    name, where, checkpoint = _parse_system(spec)
    if os.path.isfile(where) and not checkpoint:
      count = len(_read_lines(where, f"--systems {name}"))
      if count != len(references):
        raise UserError(f"--systems: {name}: {count} lines but --references={request.references}"
                        f" has {len(references)}; a system needs one hypothesis per reference")
  systems = [system_hypotheses(spec, request.input) for spec in specs]
  seed = int(config.seed) if config is not None else 12345
  result = significance.compare(systems, references,
                                bootstrap_samples=request.bootstrap_samples,
                                randomization_trials=request.randomization_trials, seed=seed)
  print(f"{result.sentences} sentences; {result.bootstrap_samples} bootstrap samples, "
        f"{result.randomization_trials} randomization trials, seed {seed}; p-values against "
        f"{result.systems[0]}\n{significance.table(result)}", flush=True)
  if request.output is not None:
    storage.write_atomic(request.output, json.dumps(result.to_json(), indent=1))
    print(f"wrote {request.output}", flush=True)


MODES: dict[str, Callable[[Any, str, Request], None]] = {
  "train": train,
  "translate": translate,
  "score": score,
  "average": average,
  "export": export,
  "import": import_model,
  "compare": compare,
}
# Modes that need no config of their own (a workdir among their inputs brings its own).
WITHOUT_CONFIG = ("compare",)
