"""The beam step's top K: `lax.top_k` against `search.top_k_by_blocks`.

At every step beam search ranks the K x V extensions of each sentence's beam (log-softmax of
the logits plus the beam's log probabilities) and keeps the top K (`search.extend_beams`).
`search.top_k_by_blocks` takes the top K of blocks' maxima and searches those K blocks only;
this times it against `lax.top_k` on the same scores, as one jitted step of each (log-softmax
included), alternated in every round, and checks that both give the same values and indices,
bitwise.
Vocabularies: the numbers model's (256), configs/text.py's (8,000) and the paper's WMT
English-German (37,000).

    python -m benchmarks.top_k
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.decoding import search as search_lib


def beam_scores(logits: jax.Array, live_log_probs: jax.Array) -> jax.Array:
  """The extensions' scores as `search.extend_beams` ranks them: logits [b K, V], the beams'
  log probabilities [b, K] -> [b, K V]."""
  b, k = live_log_probs.shape
  log_probs = jax.nn.log_softmax(logits, axis=-1).reshape(b, k, -1)
  return (live_log_probs[:, :, None] + log_probs).reshape(b, -1)


def time_top_k(vocab_sizes: Sequence[int], sentences: int = 64, beam_size: int = 4,
               rounds: int = 5, steps: int = 20) -> list[dict[str, Any]]:
  """Per vocabulary: the milliseconds of one step of each (the best of `rounds` rounds of
  `steps` calls), their ratio and whether their outputs are the same bits."""
  from measuring import measure

  rng = np.random.default_rng(0)
  records = []
  for vocab in vocab_sizes:
    logits = jnp.asarray(rng.normal(size=(sentences * beam_size, vocab)), jnp.float32)
    live = jnp.asarray(-rng.exponential(size=(sentences, beam_size)), jnp.float32)
    fns = {
      "lax.top_k": jax.jit(lambda x, lp: jax.lax.top_k(beam_scores(x, lp), beam_size)),
      "blocks": jax.jit(
        lambda x, lp: search_lib.top_k_by_blocks(beam_scores(x, lp), beam_size)),
    }
    outputs = {name: jax.device_get(fn(logits, live)) for name, fn in fns.items()}
    same = all(np.array_equal(a, b) for a, b in zip(*outputs.values(), strict=True))

    def timed(fn, args=(logits, live)):
      def run(_):
        for _ in range(steps):
          out = fn(*args)
        return jax.block_until_ready(out)
      return run

    times, _ = measure.time_interleaved({n: timed(f) for n, f in fns.items()}, rounds)
    ms = {name: 1e3 * min(t) / steps for name, t in times.items()}
    records.append({"vocab_size": vocab, "scores": beam_size * vocab,
                    "block": search_lib.top_k_block(beam_size * vocab), "sentences": sentences,
                    "beam_size": beam_size, "lax_ms": ms["lax.top_k"],
                    "blocks_ms": ms["blocks"],
                    "speedup": ms["lax.top_k"] / ms["blocks"], "same_bits": same})
  return records


def report_lines(records: list[dict[str, Any]]) -> list[str]:
  from measuring import report

  first = records[0]
  return [
    f"{first['sentences']} sentences x beam {first['beam_size']}, float32; milliseconds per "
    "step, log-softmax included.\n",
    report.markdown_table(
      ["vocabulary", "scores per sentence", "block", "lax.top_k (ms)",
       "search.top_k_by_blocks (ms)", "speed-up", "same bits"],
      [[f"{r['vocab_size']:,}", f"{r['scores']:,}", r["block"], f"{r['lax_ms']:.3f}",
        f"{r['blocks_ms']:.3f}", f"**{r['speedup']:.2f}x**", "yes" if r["same_bits"] else "NO"]
       for r in records]),
  ]


if __name__ == "__main__":
  from absl import app, flags

  from measuring import report
  from transformer.errors import flags_parser

  _VOCABS = flags.DEFINE_list("vocab_sizes", ["256", "8000", "37000"], "Vocabularies.")
  _ROUNDS = flags.DEFINE_integer("rounds", 5, "Alternated rounds (the best is kept).",
                                 lower_bound=1)
  _OUT = flags.DEFINE_string("out", "benchmarks/results/top_k",
                             "Report path without extension (.md and .json are written).")
  _SECTION = flags.DEFINE_string("section", None, "The report's section this run writes.")

  def main(argv: list[str]) -> None:
    del argv
    records = time_top_k([int(v) for v in _VOCABS.value], rounds=_ROUNDS.value)
    report.write(_OUT.value, "The beam step's top K", __doc__.split("\n\n")[1],
                 report.public_command(report.command_line()), report_lines(records),
                 {"records": records}, section=_SECTION.value)
    print("\n".join(report_lines(records)))

  app.run(main, flags_parser=flags_parser())
