"""The translate, average and export modes of the main program.

translate: one output line per input line, from the newest checkpoint (or the average of the
last N). Documented behaviour for awkward input:
  - an empty (or all-whitespace) line gives an empty line;
  - a line that is not valid UTF-8 is translated with the bad bytes replaced by U+FFFD, and a
    warning naming the line number goes to stderr;
  - a line longer than the model allows (model.max_len - decode.max_extra_len tokens) is
    truncated to that many tokens, with a warning naming the line number.

export: the newest checkpoint (or the average of the last N) as a CTranslate2 model, see
transformer/export.py.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax

from transformer import sharding as sharding_lib
from transformer.checkpoint import Checkpointer
from transformer.data.tokenizer import truncate
from transformer.errors import UserError
from transformer.infer import restore
from transformer.train import final_evaluation


def translate_stream(config: Any, workdir: str, input_path: str | None,
                     average: int | None) -> None:
  """Reads lines from `input_path` (or stdin), prints one translation per line."""
  if input_path is not None and not os.path.isfile(input_path):
    raise UserError(f"--input={input_path}: no such file")
  model = restore(config, workdir, average)
  tokenizer, translator, params, label = (model.tokenizer, model.translator, model.params,
                                          model.label)
  print(f"translating with the parameters of {label}", file=sys.stderr, flush=True)
  stream = open(input_path, "rb") if input_path else sys.stdin.buffer  # noqa: SIM115
  try:
    raw_lines = stream.read().splitlines()
  finally:
    if input_path:
      stream.close()
  limit = config.model.max_len - config.decode.max_extra_len
  sources: list[list[int]] = []
  rows: list[int] = []
  for number, raw in enumerate(raw_lines, start=1):
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError:
      text = raw.decode("utf-8", errors="replace")
      print(f"warning: line {number} is not valid UTF-8; invalid bytes replaced by U+FFFD",
            file=sys.stderr)
    if not text.strip():
      continue
    ids = tokenizer.encode(text.strip())
    if len(ids) > limit:
      print(f"warning: line {number} has {len(ids)} tokens; truncated to {limit}",
            file=sys.stderr)
      ids = truncate(ids, limit)
    sources.append(ids)
    rows.append(number - 1)
  outputs = [""] * len(raw_lines)
  for row, ids in zip(rows, translator.translate_ids(params, sources), strict=True):
    outputs[row] = tokenizer.decode(ids)
  if jax.process_index() == 0:
    sys.stdout.write("".join(line + "\n" for line in outputs))
    sys.stdout.flush()


def average_and_evaluate(config: Any, workdir: str, average: int | None) -> None:
  """Averages the last N checkpoints, then runs the final evaluation of training on them.

  Metrics go to `metrics.jsonl` at the newest step as `average_eval/...` and
  `average_test/bleu`, translations to `translations/average_{validation,test}_<step>.txt`.
  """
  from transformer.data import input_pipeline
  from transformer.metrics import MetricWriter

  n = average or config.average_last_checkpoints
  if n < 2:
    raise UserError("--mode=average needs --average=N with N >= 2")
  model = restore(config, workdir, n)
  evals, references = input_pipeline.evaluation_data(
    config, input_pipeline.open_reader(config), model.tokenizer,
    sharding_lib.data_parallel_size(model.trainer.mesh), process_index=jax.process_index(),
    process_count=jax.process_count())
  step = Checkpointer(os.path.join(workdir, "checkpoints"), None,
                      async_save=False).latest_step() or 0
  final = final_evaluation(config, model.trainer, model.translator, model.params,
                           model.tokenizer, evals, references, workdir, step, tag="average_")
  MetricWriter(workdir, tensorboard=False).write(
    step, {k: v for k, v in final.items() if isinstance(v, float)})
  print(f"{model.label}: validation perplexity {final['average_eval/perplexity']:.3f}, "
        f"validation BLEU {final['average_eval/bleu']:.2f}, test BLEU "
        f"{final['average_test/bleu']:.2f}   [{final['bleu_signature']}]")


def export_model(config: Any, workdir: str, fmt: str | None, output: str | None,
                 average: int | None, quantization: str | None = None) -> None:
  """Writes the checkpoint (or the average of the last N) to `output` in format `fmt`.

  The request is checked before anything is restored; an existing non-empty `output` is
  refused, so nothing is overwritten.
  """
  from transformer import export
  from transformer.validate import model_config

  export.check_request(fmt, output, quantization, model_config(config))
  model = restore(config, workdir, average)
  if jax.process_index() == 0:
    export.export_restored(model, output, quantization)
    print(f"exported the parameters of {model.label} to {output} ({fmt}"
          f"{', ' + quantization if quantization else ''})", flush=True)
