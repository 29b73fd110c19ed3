"""The translate and average modes of the main program.

translate: one output line per input line, from the newest checkpoint (or the average of the
last N). Documented behaviour for awkward input:
  - an empty (or all-whitespace) line gives an empty line;
  - a line that is not valid UTF-8 is translated with the bad bytes replaced by U+FFFD, and a
    warning naming the line number goes to stderr;
  - a line longer than the model allows (model.max_len - decode.max_extra_len tokens) is
    truncated to that many tokens, with a warning naming the line number.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax

from transformer import sharding as sharding_lib
from transformer.checkpoint import Checkpointer
from transformer.errors import CheckpointError, UserError
from transformer.infer import restore
from transformer.train import bleu_on, evaluate


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
      ids = ids[: limit - 1] + [1]
    sources.append(ids)
    rows.append(number - 1)
  outputs = [""] * len(raw_lines)
  for row, ids in zip(rows, translator.translate_ids(params, sources), strict=True):
    outputs[row] = tokenizer.decode(ids)
  if jax.process_index() == 0:
    sys.stdout.write("".join(line + "\n" for line in outputs))
    sys.stdout.flush()


def average_and_evaluate(config: Any, workdir: str, average: int | None) -> None:
  """Averages the last N checkpoints, then reports validation loss and test BLEU."""
  from transformer.data import input_pipeline
  from transformer.metrics import MetricWriter

  n = average or config.average_last_checkpoints
  if n < 2:
    raise CheckpointError("--mode=average needs --average=N with N >= 2")
  model = restore(config, workdir, n)
  tokenizer, trainer, translator, params = (model.tokenizer, model.trainer, model.translator,
                                            model.params)
  label = model.label
  reader = input_pipeline.open_reader(config)
  valid, test = reader.read_pairs("validation"), reader.read_pairs("test")
  dp = sharding_lib.data_parallel_size(trainer.mesh)
  valid_ids = list(zip(*input_pipeline.tokenize_pairs(tokenizer, valid), strict=True))
  batches = input_pipeline.eval_batches(valid_ids, config, dp, process_index=jax.process_index(),
                                        process_count=jax.process_count())
  record = evaluate(trainer, params, batches, "average_eval")
  result, _ = bleu_on(translator, params, tokenizer, test,
                      os.path.join(workdir, "translations", f"test_average_{n}.txt"))
  record["average_test/bleu"] = result.score
  step = Checkpointer(os.path.join(workdir, "checkpoints"), None,
                      async_save=False).latest_step() or 0
  MetricWriter(workdir, tensorboard=False).write(step, record)
  print(f"{label}: validation perplexity {record['average_eval/perplexity']:.3f}, "
        f"test BLEU {result.score:.2f}   [{result.signature}]")
