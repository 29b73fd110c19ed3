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


def check_workdir_config(config: Any, workdir: str) -> None:
  """Before an inference mode: the config's model and data fields are the workdir's, and every
  field is valid."""
  import jax

  from transformer.training.validate import check_same, validate

  saved = workdir_lib.load(workdir)
  if saved is not None:
    check_same(saved, config)
  validate(config, jax.device_count())


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
  from transformer import infer
  from transformer.decoding import files
  from transformer.decoding.translate import Search

  check_workdir_config(config, workdir)
  search = Search.from_config(config.decode)
  files.check_request("translate", request.nbest, request.output_format, search, request.input,
                      request.output)
  model = infer.restore(config, workdir, request.average, request.checkpoint)
  settings = {"mode": "translate", "nbest": request.nbest, "format": request.output_format,
              "parameters": model.label, "search": dataclasses.asdict(search),
              **_input_identity(request.input)}
  files.translate_corpus(files.CorpusRun(model, request.input, request.output, settings), config,
                         request.nbest, request.output_format)


def score(config: Any, workdir: str, request: Request) -> None:
  """`--mode=score`: log p(target | source) of every `source<TAB>target` line of `--input`."""
  from transformer import infer
  from transformer.decoding import files
  from transformer.decoding.translate import Search

  check_workdir_config(config, workdir)
  files.check_request("score", 1, "jsonl", Search.from_config(config.decode), request.input,
                      request.output)
  total = files.check_score_input(request.input)
  model = infer.restore(config, workdir, request.average, request.checkpoint)
  settings = {"mode": "score", "parameters": model.label, **_input_identity(request.input)}
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
  from transformer.data import bucketing, input_pipeline
  from transformer.decoding.translate import Translator
  from transformer.metrics import MetricWriter
  from transformer.training import evaluators

  check_workdir_config(config, workdir)
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
                                      layout.param_shardings, buckets),
    model.tokenizer, batches, references, workdir, config)
  evals = evaluators.build(evaluators.of_config(config), context)
  result = evaluators.run_all(evals, model.params, model.step, tag="average_")
  MetricWriter(workdir, tensorboard=False).write(model.step, result.metrics)
  print(f"{model.label}:\n{evaluators.format_result(result)}", flush=True)


def export(config: Any, workdir: str, request: Request) -> None:
  """`--mode=export`: the chosen parameters written to `--output` in `--format`.

  The request is checked before anything is restored; an existing non-empty `--output` is
  refused, so nothing is overwritten.
  """
  import jax

  from transformer import infer
  from transformer.interop import export as export_lib
  from transformer.training.validate import model_config

  check_workdir_config(config, workdir)
  export_lib.check_request(request.format, request.output, request.quantization,
                           model_config(config))
  model = infer.restore(config, workdir, request.average, request.checkpoint)
  if jax.process_index() == 0:
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


MODES: dict[str, Callable[[Any, str, Request], None]] = {
  "train": train,
  "translate": translate,
  "score": score,
  "average": average,
  "export": export,
  "import": import_model,
}
