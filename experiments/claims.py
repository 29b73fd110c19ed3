"""Attention against recurrence: the three usual claims, each measured side by side.

    nice -n 19 python -m experiments.claims                   # CPU defaults, about 15 minutes
    python -m experiments.claims --config=configs/wmt.py:base --lengths=128,256,...,16384 \
        --batch_size=8 --long_range.d_model=256 --long_range.max_distance=2000 \
        --long_range.steps=2000                               # accelerators

The Transformer and the LSTM baseline (`model.kind='lstm'`, transformer/nn/rnn.py) always have
the same number of parameters (`model_family.lstm_config_for_params`) and get the same
training budget (the same batches, steps and optimiser recipe).

1. Parallelism. Training-step time against n, and the number of sequential steps: the while
   loops of the compiled train step and their trip counts (`measure.loop_iterations`), so a
   scan over time shows up as n iterations run one after another. Measured with
   `step_cost.cost_sweep` (random batches of `--batch_size` x n source and target tokens) for
   the Transformer of `--config` with `xla` and `chunked` attention and its equal-size LSTMs,
   or read from experiments.seq_len's records with `--cost_from`.
2. Long-range dependencies. The recall task of experiments/tasks.py, trained and tested by
   experiments/long_range.py with the settings of `--long_range` (configs/long_range.py;
   override any field with `--long_range.FIELD=VALUE`).
3. Memory. XLA's memory analysis of the same compiled steps against n, and the decoding cache
   a model keeps per sentence while generating (from `jax.eval_shape` of its cache), against
   the complexity table usually quoted (the paper's Table 1) and the folk claim.

Writes experiments/results/claims.md, claims.json and claims_parallelism.png,
claims_long_range.png, claims_memory.png, with the paper's Table 1 beside the measurements; a
part that does not run keeps its records from the last run.
"""

from __future__ import annotations

import os
from typing import Any

from experiments import long_range
from measuring import measure, report, step_cost
from transformer.errors import fail, flags_parser


def decode_caches(base: Any, lengths: list[int]) -> list[dict[str, Any]]:
  """Bytes of the decoding cache per sentence at each n: the Transformer of `base` (xla) and
  its equal-size LSTM."""
  caches = []
  for kind, family in (("xla", "transformer"), ("lstm", "lstm")):
    _, mc = step_cost.model_setup(base, kind, max(lengths))
    caches += [{"kind": family, "n": n, "bytes": measure.decode_cache_bytes(mc, n)}
               for n in lengths]
  return caches


FIGURES = ("_parallelism.png", "_long_range.png", "_memory.png")


def report_parts(cost: list[dict[str, Any]] | None, caches: list[dict[str, Any]] | None,
                 lr: dict[str, Any] | None, fit_from: int, path: str) -> dict[str, Any]:
  """The report from the parts there are (cost and caches, long range): `report.write`'s
  title, intro, body and record; draws the figures as `path` + FIGURES."""
  paths = {k: path + k for k in FIGURES}
  body = []
  if cost:
    tables = step_cost.cost_tables(cost, fit_from, memory_digits=2)
    lstm = [r for r in cost if r["model"] == "lstm"]
    per_n = ""
    if lstm:
      ratios = sorted({round(r["hlo_iterations"] / r["n"], 2) for r in lstm})
      per_n = (f" For the LSTM the count is {', '.join(str(x) for x in ratios)} x n at every "
               "n: one scan of n steps per encoder layer and direction and per decoder layer "
               "in the forward pass, and as many reversed scans in the backward pass.")
    body += ["## 1. Parallelism: step time and sequential steps against n\n",
             f"Batch {cost[0]['batch_size']} x n source and n target tokens, random ids; "
             f"{step_cost.models_line(cost)}. Sequential iterations = trip counts of the "
             "`while` loops in the compiled train step (forward and backward), nested loops "
             "multiplied; loops = number of `while` ops." + per_n + "\n",
             tables["time"] + step_cost.not_timed(cost),
             "\nSequential loop iterations:\n", tables["loops"],
             "\nFitted exponents (slope of log y on log n):\n", tables["exponents"]]
    _plot(paths["_parallelism.png"], cost, ("step_s", "hlo_iterations"))
    body.append(f"\n![parallelism]({os.path.basename(paths['_parallelism.png'])})\n")
  if lr:
    body += long_range.markdown(lr)
    long_range.plot(lr, paths["_long_range.png"])
    body.append(f"\n![long range]({os.path.basename(paths['_long_range.png'])})\n")
  if cost:
    body += ["\n## 3. Memory against n\n",
             "Training: XLA's memory analysis of the compiled train step (per device; temp "
             "excludes the parameters and optimiser state, which are constant in n).\n",
             tables["memory"]]
    if caches:
      _, families, rows = report.grid(caches, "n", "kind", lambda c: f"{c['bytes'] / 1024:,.1f}")
      ns = sorted({c["n"] for c in caches})
      body += ["\nDecoding: the cache one sentence keeps while generating n tokens from an "
               "n-token source (Transformer: self-attention keys and values of every layer and "
               "the cross-attention keys and values; LSTM: one (c, h) state per layer), bytes "
               "from `jax.eval_shape`. The LSTM still reads the n encoder states through its "
               "attention; they are not counted for either model.\n",
               report.markdown_table(["n"] + [f"{k} cache (KiB)" for k in families],
                                     [[n, *row] for n, row in zip(ns, rows, strict=True)])]
    _plot(paths["_memory.png"], cost, ("temp_memory_bytes",), caches)
    body.append(f"\n![memory]({os.path.basename(paths['_memory.png'])})\n")
  body += table1_markdown(cost, caches, lr, fit_from)
  return {"title": "Attention against recurrence: parallelism, long-range dependencies, memory",
          "intro": "Produced by `experiments/claims.py` (method in its docstring; every record "
                   "in `claims.json`). Transformer and LSTM always have equal parameter counts "
                   "(`model_family.lstm_config_for_params`) and equal training budgets.",
          "body": body, "record": {"cost": cost, "decode_cache": caches, "long_range": lr}}


def _plot(path: str, cost: list[dict[str, Any]], keys: tuple[str, ...],
          caches: list[dict[str, Any]] | None = None) -> None:
  fig, axes = report.figure(1, 2, figsize=(9.5, 3.8))
  step_cost.plot_cost(axes[:len(keys)], cost, keys)
  if caches is not None:
    report.plot_series(axes[1], caches, "n", lambda c: c["bytes"] / 1024)
    axes[1].set(ylabel="KiB per sentence", title="decoding cache")
    report.finish_axes([axes[1]], "n (tokens)", log2_x=True, log_y=True)
  report.save_figure(fig, path)


def table1_markdown(cost: list[dict[str, Any]] | None, caches: list[dict[str, Any]] | None,
                     lr: dict[str, Any] | None, fit_from: int) -> list[str]:
  """The paper's Table 1 and the folk memory claim beside what was measured."""
  if not cost:
    return []
  t_exp = measure.exponents(cost, "step_s", fit_from)
  m_exp = measure.exponents(cost, "temp_memory_bytes", fit_from)
  i_exp = measure.exponents(cost, "hlo_iterations", fit_from)
  c_exp = {}
  for family in dict.fromkeys(c["kind"] for c in caches or []):
    cs = [c for c in caches if c["kind"] == family]
    c_exp[family] = measure.fit_exponent([c["n"] for c in cs], [c["bytes"] for c in cs])
  by = {(r["kind"], r["n"]): r for r in cost}
  n_max = max(r["n"] for r in cost)

  def iters(kind):
    r = by.get((kind, n_max))
    return "-" if r is None else f"{r['hlo_iterations']:,} at n={n_max}"

  def acc(family):
    if not lr:
      return "not run"
    parts = []
    for run in lr["runs"]:
      m = next((m for m in run["models"] if m["kind"] == family), None)
      if m is not None:
        d = max(int(k) for k in m["accuracy"])
        parts.append(f"{m['accuracy'][str(d)]:.2f} at d={d} "
                     f"({run['distribution'].replace('_', '-')})")
    return "accuracy " + "; ".join(parts) if parts else "-"

  def power(v):
    return "-" if v is None else f"n^{max(v, 0.0):.2f}"

  # kind: (family, compute, sequential ops, path length, folk training memory)
  claims = {"xla": ("transformer", "O(n^2 d)", "O(1)", "O(1)", "O(1)"),
            "chunked": ("transformer", "O(n^2 d)", "O(1)", "O(1)", "O(1)"),
            "cudnn": ("transformer", "O(n^2 d)", "O(1)", "O(1)", "O(1)"),
            "lstm": ("lstm", "O(n d^2)", "O(n)", "O(n)", "O(n)"),
            "lstm_noattn": ("lstm", "O(n d^2)", "O(n)", "O(n)", "O(n)")}
  rows = []
  for kind in dict.fromkeys(r["kind"] for r in cost):
    family, compute, seq_ops, path, memory = claims[kind]
    rows.append([kind, compute, power(t_exp[kind][1]), seq_ops,
                 f"{power(i_exp[kind][1])} ({iters(kind)})", path, acc(family), memory,
                 power(m_exp[kind][1]), power(c_exp.get(family))])
  return [
    "\n## The complexity table against the measurements\n",
    "Claimed: the paper's Table 1 (per layer: complexity, sequential operations, maximum path "
    "length; self-attention O(n^2 d), O(1), O(1); recurrent O(n d^2), O(n), O(n)) and the folk "
    "memory claim \"RNN O(n) memory, Transformer O(1)\". Measured: growth exponents fitted over "
    f"n >= {fit_from} (step time, sequential loop iterations, training memory; the decoding "
    "cache over all n; n^0.00 = constant), and the long-range accuracy at the largest "
    "distance. The long-range task ran once per family (the Transformer with `xla` "
    "attention, the LSTM with its attention): its source is a single token, so that "
    "attention has nothing to read, and the rows of a family share the run.\n",
    report.markdown_table(
      ["model", "compute (claimed)", "step time (measured)", "sequential ops (claimed)",
       "sequential iterations (measured)", "path length (claimed)", "long range (measured)",
       "memory (folk claim)", "training memory (measured)", "decoding cache (measured)"],
      rows),
  ]


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

  _PART = flags.DEFINE_list("part", ["cost", "long_range"],
                            "cost (parallelism and memory), long_range, or both.")
  _CONFIG = config_flags.DEFINE_config_file("config", None,
                                            "Model of the cost part (configs/numbers.py).")
  _LONG_RANGE = config_flags.DEFINE_config_file(
    "long_range", None, "Settings of the long-range task (configs/long_range.py).")
  _LENGTHS = flags.DEFINE_list("lengths", [str(2**k) for k in range(5, 12)], "Lengths n.")
  _BATCH = flags.DEFINE_integer("batch_size", 2, "Rows per step in the cost part.")
  _STEPS = flags.DEFINE_integer("steps", 3, "Timed steps per length (best is kept).")
  _MAX_STEP_S = flags.DEFINE_float("max_step_s", 20.0, "Do not time steps predicted slower.")
  _FIT_FROM = flags.DEFINE_integer("fit_from", 256, "Exponents are fitted over n >= this too.")
  _COST_FROM = flags.DEFINE_string(
    "cost_from", "", "Read the cost records (parallelism, memory) from this seq_len.json (from "
    "`python -m experiments.seq_len --part=cost`) instead of measuring.")
  _OUT = flags.DEFINE_string("out", os.path.join("experiments", "results"), "Results directory.")

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}")
    parts = set(_PART.value)
    if not parts or parts - {"cost", "long_range"}:
      fail(f"--part={','.join(_PART.value)}: use cost, long_range or both")
    command = report.command_line()
    path = os.path.join(_OUT.value, "claims")
    previous = report.read_json(path + ".json")
    commands = dict(previous.get("command") or {})
    cost, caches, lr = (previous.get(k) for k in ("cost", "decode_cache", "long_range"))
    if "cost" in parts:
      if _COST_FROM.value:
        source = report.read_json(_COST_FROM.value)
        if not source:
          fail(f"--cost_from={_COST_FROM.value}: no such file")
        cost = source["cost"]
        commands["parallelism and memory"] = (
          f"{command}\n# cost records read from {_COST_FROM.value}, measured by:\n"
          f"{(source.get('command') or {}).get('cost', '?')}")
      else:
        cost = step_cost.cost_sweep(_CONFIG.value, ["xla", "chunked", *step_cost.LSTM_KINDS],
                                    [int(n) for n in _LENGTHS.value], _BATCH.value, _STEPS.value,
                                    _MAX_STEP_S.value)
        commands["parallelism and memory"] = command
      caches = decode_caches(_CONFIG.value, sorted({r["n"] for r in cost}))
    if "long_range" in parts:
      lr = long_range.run(_LONG_RANGE.value)
      commands["long-range dependencies"] = command
    paths = report.write(path, command=commands,
                         **report_parts(cost, caches, lr, _FIT_FROM.value, path))
    print(f"wrote {', '.join(paths + [path + f for f in FIGURES if os.path.exists(path + f)])}",
          flush=True)

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  app.run(main, flags_parser=flags_parser(config="configs/numbers.py",
                                           long_range="configs/long_range.py"))
