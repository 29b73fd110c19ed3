"""Steps of beam search's exact stop against a stop once the best hypothesis has ended.

Beam search (`search.beam_search`, `decode.method=beam`) stops a sentence once no live
hypothesis can still beat its best finished one: at best a live hypothesis reaches
live_log_prob / lp(longest output), so the search goes on until that bound falls below the best
finished score. A common early rule (CTranslate2's without a length penalty) stops once the
beam's best hypothesis by log probability has ended, which is sooner and may miss a longer
hypothesis of a better score.
This counts, over a file, the steps each rule searches each sentence and how often the early
rule's best hypothesis is the exact search's: the row-steps the exact stop costs in a
comparison of decoders' speed, and what it buys.

    python -m benchmarks.search_steps --workdir=runs/messages-en-fr/model \
        --input=runs/messages-en-fr/corpus/train.en --lines=2000
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.decoding import search as search_lib
from transformer.decoding import translate

EOS_ID = 1


def search_steps(restored: Any, sources: Sequence[Sequence[int]], batch_size: int = 64
                 ) -> dict[str, Any]:
  """Beam search (the translator's beam size and alpha, the best hypothesis asked for) of
  `sources` (token ids, EOS-terminated), step by step: per sentence, the step where the exact
  rule stops it and the first step where the beam's best hypothesis by log probability has
  ended: its best finished one scores at least the beam's first live one, or the step's top
  extension was EOS (the early rule); and whether the best finished hypothesis then is the
  exact search's. Returns the sums over the sentences and the fraction alike."""
  translator = restored.translator
  config, params = restored.layout.model_config, restored.params
  k, alpha = translator.search.beam_size, translator.search.alpha
  step_fn = translate.step_function((params,), (config,), None)
  exact = early = same = 0
  max_src = translator.max_len - translator.max_extra_len
  step = None  # one jitted step for every batch (traced once per batch shape)
  for idx, length in translator.batches([len(s) for s in sources]):
    for start in range(0, len(idx), batch_size):
      part = [sources[i] for i in idx[start:start + batch_size]]
      src_len = min(length, max_src)
      max_len = min(src_len + translator.max_extra_len, translator.max_len)
      inputs = np.zeros((len(part), src_len), np.int32)
      for row, ids in enumerate(part):
        inputs[row, :min(len(ids), src_len)] = ids[:src_len]
      inputs = jnp.asarray(inputs)
      cache, reorder, once = translate.search_cache((params,), (config,), inputs, max_len, k)
      if step is None:  # the masks follow the model's cache, the same for every batch
        step = _beam_step(step_fn, k, search_lib.beam_reorder(cache, reorder, once))
      stops = _stops(step, search_lib.tile_beams(cache, k, once),
                     translate.output_limits(inputs, translator.search, max_len), k, alpha,
                     max_len)
      exact += int(stops["exact"].sum())
      early += int(stops["early"].sum())
      same += int(stops["same"].sum())
  return {"sentences": len(sources), "beam_size": k, "alpha": alpha,
          "exact_steps": exact, "early_steps": early, "ratio": exact / max(early, 1),
          "same_best": same / max(len(sources), 1)}


def _beam_step(step_fn: Any, k: int, reorder: Any) -> Any:
  """A jitted step of beam search (the best hypothesis asked for): (state, step, length
  penalties) -> state."""

  @jax.jit
  def step(state, t, penalties):
    logits, new_cache = step_fn(search_lib.flatten_beams(state["live_last"])[:, None],
                                state["cache"])
    new = search_lib.extend_beams(state, logits, t, penalties, k=k, n=1, eos_id=EOS_ID)
    new["cache"] = search_lib.gather_beams(new_cache, new.pop("parent"), reorder)
    new.pop("step")
    return new

  return step


def _stops(step: Any, cache: Any, limits: jax.Array, k: int, alpha: float, max_len: int
           ) -> dict[str, np.ndarray]:
  """`search_steps`' per-sentence stops of one batch, given its tiled search `cache` and its
  longest outputs `limits` int32 [b]."""
  b = limits.shape[0]
  penalties = search_lib.length_penalties(max_len, alpha)
  state = {**search_lib.initial_hypotheses(b, k, max_len), "done": jnp.zeros((b,), bool),
           "cache": cache, "rows": {"max_lengths": limits, "best_possible_lp": penalties[limits]}}
  exact = np.zeros(b, np.int64)
  early = np.zeros(b, np.int64)
  early_best = np.zeros((b, max_len), np.int32)
  for t in range(max_len):
    state = step(state, jnp.int32(t), penalties)
    ended = np.asarray((state["fin_log_probs"][:, 0] > search_lib.NEG_INF)
                       & (state["fin_log_probs"][:, 0] >= state["live_log_probs"][:, 0]))
    first = ended & (early == 0)
    early[first] = t + 1
    early_best[first] = np.asarray(state["fin_seqs"][:, 0])[first]
    done = np.asarray(state["done"])
    exact[done & (exact == 0)] = t + 1
    if done.all():
      break
  exact[exact == 0] = max_len
  never = early == 0
  early[never] = exact[never]
  best = np.asarray(state["fin_seqs"][:, 0])
  same = ~never & np.all(early_best == best, axis=1)
  return {"exact": exact, "early": early, "same": same}


def report_lines(record: dict[str, Any]) -> list[str]:
  from measuring import report

  return [
    f"{record['sentences']:,} sentences of {record['input']}, workdir {record['workdir']}, "
    f"beam {record['beam_size']}, alpha {record['alpha']}, the best hypothesis asked for.\n",
    report.markdown_table(
      ["stop", "row-steps (sentence-steps x beam)", "against the early stop"],
      [["exact (ours)", f"{record['exact_steps'] * record['beam_size']:,}",
        f"**{record['ratio']:.2f}x**"],
       ["once the best hypothesis has ended", f"{record['early_steps'] * record['beam_size']:,}",
        "1.00x"]]),
    f"\nThe early stop's best hypothesis is the exact search's for {record['same_best']:.1%} "
    "of the sentences.",
  ]


if __name__ == "__main__":
  from absl import app, flags

  from measuring import report
  from transformer.errors import UserError, fail, flags_parser

  _WORKDIR = flags.DEFINE_string("workdir", "runs/numbers", "A trained workdir.")
  _INPUT = flags.DEFINE_string("input", None, "The text file whose lines are searched.",
                               required=True)
  _LINES = flags.DEFINE_integer("lines", 2000, "Its first lines to search.", lower_bound=1)
  _OUT = flags.DEFINE_string("out", "benchmarks/results/search_steps",
                             "Report path without extension (.md and .json are written).")
  _SECTION = flags.DEFINE_string("section", None, "The report's section this run writes.")

  def main(argv: list[str]) -> None:
    del argv
    from transformer import infer
    from transformer import workdir as workdir_lib

    try:
      config = workdir_lib.load(_WORKDIR.value)
      if config is None:
        raise UserError(f"--workdir={_WORKDIR.value}: no {workdir_lib.CONFIG}; train it first")
      try:
        with open(_INPUT.value, encoding="utf-8") as f:
          lines = [line.strip() for _, line in zip(range(_LINES.value), f, strict=False)]
      except OSError as e:
        raise UserError(f"--input={_INPUT.value}: {e.strerror}") from None
      with config.unlocked():
        config.decode.method = "beam"
      restored = infer.restore(config, _WORKDIR.value)
      sources = [restored.tokenizer.encode(line) for line in lines]
      record = search_steps(restored, sources)
    except UserError as e:
      fail(str(e))
    record.update(input=report.public_path(_INPUT.value),
                  workdir=report.public_path(_WORKDIR.value))
    report.write(_OUT.value, "Steps of the exact stop of beam search", __doc__.split("\n\n")[1],
                 report.public_command(report.command_line()), report_lines(record), record,
                 section=_SECTION.value)
    print("\n".join(report_lines(record)))

  app.run(main, flags_parser=flags_parser())
