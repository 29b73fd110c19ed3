"""The translate, score, average, export and import modes of the main program.

translate and score: a corpus, read in chunks, from the newest checkpoint (or a given step,
or the average of the last N); formats, awkward input and resume in transformer/corpus.py.

export: the newest checkpoint (or the average of the last N) as a CTranslate2 model, see
transformer/export.py.

import: an OPUS-MT (Marian) model directory as a new workdir, see transformer/marian.py.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from transformer import corpus
from transformer import sharding as sharding_lib
from transformer.checkpoint import Checkpointer
from transformer.errors import UserError
from transformer.infer import restore
from transformer.translate import Search


def translate_corpus(config: Any, workdir: str, input_path: str | None,
                     output_path: str | None, *, nbest: int = 1, output_format: str = "text",
                     average: int | None = None, checkpoint: str | None = None) -> None:
  """`--mode=translate`: `input_path` (or stdin) to `output_path` (or stdout), in chunks;
  transformer/corpus.py documents the formats and the resume."""
  search = Search.from_config(config.decode)
  corpus.check_request("translate", nbest, output_format, search, input_path, output_path)
  model = restore(config, workdir, average, checkpoint)
  settings = {"mode": "translate", "nbest": nbest, "format": output_format,
              "parameters": model.label, "search": dataclasses.asdict(search),
              **_input_identity(input_path)}
  corpus.translate_corpus(corpus.CorpusRun(model, input_path, output_path, settings), config,
                          nbest, output_format)


def score_corpus(config: Any, workdir: str, input_path: str | None, output_path: str | None,
                 *, average: int | None = None, checkpoint: str | None = None) -> None:
  """`--mode=score`: log p(target | source) of every `source<TAB>target` line of `input_path`."""
  corpus.check_request("score", 1, "jsonl", Search.from_config(config.decode), input_path,
                       output_path)
  total = corpus.check_score_input(input_path)
  model = restore(config, workdir, average, checkpoint)
  settings = {"mode": "score", "parameters": model.label, **_input_identity(input_path)}
  corpus.score_corpus(corpus.CorpusRun(model, input_path, output_path, settings), config,
                      total)


def _input_identity(input_path: str | None) -> dict[str, Any]:
  """What tells a resumed run that its input is unchanged."""
  if input_path is None:
    return {"input": None}
  stat = os.stat(input_path)
  return {"input": os.path.abspath(input_path), "input_bytes": stat.st_size,
          "input_mtime_ns": stat.st_mtime_ns}


def average_and_evaluate(config: Any, workdir: str, average: int | None) -> None:
  """Averages the last N checkpoints, then runs the config's evaluators on them.

  Metrics go to `metrics.jsonl` at the newest step with the prefix `average_` (e.g.
  `average_eval/loss`, `average_test/bleu`), translations to
  `translations/average_{validation,test}_<step>.txt`.
  """
  from transformer import evaluators
  from transformer.data import input_pipeline
  from transformer.metrics import MetricWriter
  from transformer.translate import Translator

  n = average or config.average_last_checkpoints
  if n < 2:
    raise UserError("--mode=average needs --average=N with N >= 2")
  model = restore(config, workdir, n)
  buckets = input_pipeline.workdir_buckets(config, workdir)
  batches, references = input_pipeline.evaluation_data(
    config, input_pipeline.open_reader(config), model.tokenizer,
    sharding_lib.data_parallel_size(model.trainer.mesh), process_index=jax.process_index(),
    process_count=jax.process_count(), buckets=buckets)
  step = Checkpointer(os.path.join(workdir, "checkpoints"), None,
                      async_save=False).latest_step() or 0
  trainer = model.trainer
  context = evaluators.Context(
    trainer, lambda decode: Translator(trainer.model_config, decode, trainer.mesh,
                                       trainer.state_shardings.params, buckets),
    model.tokenizer, batches, references, workdir, config)
  evals = evaluators.build(evaluators.of_config(config), context)
  result = evaluators.run_all(evals, model.params, step, tag="average_")
  MetricWriter(workdir, tensorboard=False).write(step, result.metrics)
  print(f"{model.label}:\n{evaluators.format_result(result)}", flush=True)


def export_model(config: Any, workdir: str, fmt: str | None, output: str | None,
                 average: int | None, quantization: str | None = None,
                 checkpoint: str | None = None) -> None:
  """Writes the checkpoint (or the average of the last N) to `output` in format `fmt`.

  The request is checked before anything is restored; an existing non-empty `output` is
  refused, so nothing is overwritten.
  """
  from transformer import export
  from transformer.validate import model_config

  export.check_request(fmt, output, quantization, model_config(config))
  model = restore(config, workdir, average, checkpoint)
  if jax.process_index() == 0:
    export.export_restored(model, output, quantization)
    print(f"exported the parameters of {model.label} to {output} ({fmt}"
          f"{', ' + quantization if quantization else ''})", flush=True)


def import_model(config: Any, workdir: str, source: str | None) -> None:
  """`--mode=import --source=DIR`: the Marian (OPUS-MT) model of DIR as a new workdir, its
  training and decoding fields from `config` (transformer/marian.py)."""
  from transformer import marian

  if not source:
    raise UserError("--mode=import needs --source=DIR, a Hugging Face Marian model directory "
                    "(config.json, model.safetensors, source.spm, target.spm, vocab.json)")
  summary = marian.import_model(config, source, workdir)
  if jax.process_index() == 0:
    print(summary, flush=True)
