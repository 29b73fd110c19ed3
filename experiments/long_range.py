"""Long-range dependencies (part of experiments/claims.py): the recall task of experiments/tasks.py
learned by a Transformer and the LSTM baseline with the same number of parameters.

Settings: a ConfigDict of configs/long_range.py. For each distribution of the training
distances, both models train `steps` steps on the same batches of recall sequences with the
project's Trainer and train_step (Adam with the paper's schedule, no label smoothing), then
answer fresh examples at each evaluated distance d (teacher-forced; argmax at the answer
position; accuracy over `eval_examples`, chance 1 / `num_keys`). Both models answer the same
examples, and each answer is kept (`correct`), so the report tests the difference between them
with McNemar's exact test, per distance and over all distances (`significance.mcnemar`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from experiments import tasks
from measuring import measure, report
from transformer.nn.model_family import count_params


def model_configs(s: Any) -> list[tuple[Any, Any]]:
  """[(config, ModelConfig)] of the Transformer and its equal-size LSTM for settings `s`."""
  from configs import numbers
  from transformer.training.validate import model_config

  config = numbers.get_config()
  config.data.vocab_size = tasks.vocab_size(s.num_keys)
  config.label_smoothing = 0.0
  config.optimizer.warmup_steps = s.warmup
  config.mesh.data = 1
  config.model.update(vocab_size=tasks.vocab_size(s.num_keys), num_layers=s.layers,
                      d_model=s.d_model, d_ff=2 * s.d_model, num_heads=s.heads,
                      dropout_rate=0.0, max_len=s.max_distance + 2, dtype="float32")
  lstm = measure.equal_size_lstm(config)
  return [(config, model_config(config)), (lstm, model_config(lstm))]


def train_and_test(config: Any, mc: Any, s: Any, distribution: str,
                   log: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains on recall batches with the project's Trainer; accuracy at each evaluated distance."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from transformer import sharding as sharding_lib
  from transformer.nn.model_family import build_model
  from transformer.training.trainer import Trainer

  mesh = sharding_lib.make_mesh(config.mesh, devices=jax.devices()[:1])
  trainer = Trainer(config, mesh, mc)
  state = trainer.init_state(s.seed)
  rng = jax.random.key(s.seed)
  host = np.random.default_rng([s.seed, 1])  # the same batches for every model
  losses = []
  t0 = t1 = time.time()
  for step in range(s.steps):
    batch = tasks.training_batch(host, s.batch_size, 2, s.max_distance, s.num_keys,
                                 distribution)
    batch = sharding_lib.local_batch_to_global(
      {"inputs": batch["inputs"], "targets": batch["targets"]}, mesh)
    state, metrics = trainer.train_step(state, batch, rng)
    if step == 0:
      jax.block_until_ready(state)
      t1 = time.time()  # after the first step, which compiles
    if (step + 1) % 50 == 0 or step + 1 == s.steps:
      m = jax.device_get(metrics)
      losses.append((step + 1, float(m["loss"] / m["tokens"])))
      log(f"[long range] {mc.kind}, d {distribution}: step {step + 1}/{s.steps}  "
          f"loss {losses[-1][1]:.4f}  ({time.time() - t0:.0f} s)")
  jax.block_until_ready(state)
  train_s, step_s = time.time() - t0, (time.time() - t1) / max(s.steps - 1, 1)

  apply = jax.jit(lambda p, x, y: build_model(mc).apply({"params": p}, x, y))
  eval_rng = np.random.default_rng([s.seed, 2])
  accuracy, correct = {}, {}
  for d in (d for d in s.distances if d <= s.max_distance):
    batch = tasks.recall_batch(eval_rng, np.full(s.eval_examples, d), s.num_keys,
                               length=s.max_distance + 2)
    logits = apply(state.params, jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"]))
    pred = np.asarray(jnp.argmax(logits[np.arange(s.eval_examples), batch["distance"]], -1))
    right = pred == batch["answer"]
    accuracy[str(int(d))] = float(np.mean(right))
    correct[str(int(d))] = "".join("1" if r else "0" for r in right.tolist())
  log(f"[long range] {mc.kind}, d {distribution}: accuracy by distance {accuracy}")
  return {"kind": mc.kind, "d_model": mc.d_model, "params": count_params(state.params),
          "accuracy": accuracy, "correct": correct, "losses": losses, "train_s": train_s,
          "step_s": step_s, "steps": s.steps}


def run(s: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
  """Both models trained and tested once per distribution: {'settings', 'runs'}."""
  runs = [{"distribution": dist,
           "models": [train_and_test(config, mc, s, dist, log) for config, mc in
                      model_configs(s)]} for dist in s.distributions]
  return {"settings": s.to_dict(), "runs": runs}


def markdown(lr: dict[str, Any]) -> list[str]:
  """The report's section 2: the settings and a table of accuracy by distance."""
  s = lr["settings"]
  distances = sorted({int(d) for r in lr["runs"] for m in r["models"] for d in m["accuracy"]})
  rows = [[r["distribution"].replace("_", "-"), m["kind"], m["d_model"], f"{m['params']:,}",
           report.fmt(1e3 * m["step_s"] if m.get("step_s") else None, 1),
           f"{m['train_s']:.0f}", f"{m['losses'][-1][1]:.3f}"]
          + [report.fmt(m["accuracy"].get(str(d))) for d in distances]
          for r in lr["runs"] for m in r["models"]]
  return [
    "\n## 2. Long-range dependencies: recall after d positions\n",
    f"Task: experiments/tasks.py (the answer is the token exactly d positions back; blanks in "
    f"between; {s['num_keys']} keys, chance {1 / s['num_keys']:.3f}). For each distribution of "
    f"the training distances d in [2, {s['max_distance']}] (uniform: every d equally likely, "
    "so almost all are long; log-uniform: each factor of two equally likely, so short ones are "
    f"common), both models are trained {s['steps']} steps of {s['batch_size']} sequences (the "
    "same batches for both), Adam with the paper's schedule (warm-up "
    f"{s['warmup']}), no label smoothing; Transformer {s['layers']} + {s['layers']} layers, "
    f"{s['heads']} heads, d_model {s['d_model']}; the LSTM has {s['layers']} + {s['layers']} "
    "layers and the width that matches the parameter count. Accuracy of the answer token on "
    f"{s['eval_examples']} fresh examples per distance (teacher-forced; argmax at the answer "
    "position). step (ms): mean training-step time after the first (compiling) step; "
    "train (s): all steps, compilation included.\n",
    report.markdown_table(["training distances", "model", "d_model", "params", "step (ms)",
                           "train (s)", "final loss"] + [f"d={d}" for d in distances], rows),
    *significance_markdown(lr),
  ]


def significance_markdown(lr: dict[str, Any]) -> list[str]:
  """The paired test of the two models' answers, a table per training distribution."""
  tables = []
  for run_ in lr["runs"]:
    rows = significance(run_)
    if rows is None:
      continue
    tables += [f"\nTraining distances {run_['distribution'].replace('_', '-')}:\n",
               report.markdown_table(
                 ["d", "only the Transformer right", "only the LSTM right", "p (McNemar)"],
                 [[r["d"], r["transformer_only"], r["lstm_only"], f"{r['p']:.3g}"]
                  for r in rows])]
  if not tables:
    return []
  n = lr["settings"]["eval_examples"]
  return ["\nSignificance: both models answer the same examples, so their difference is "
          "tested pairwise with McNemar's exact test (two-sided; Dietterich 1998): of the "
          f"{n} examples at a distance (or all of them, d = all), those only one model gets "
          "right are fair coin flips under the null hypothesis. One training seed per model: "
          "the test covers the examples, not the variation between training runs.\n",
          *tables]


def significance(run_: dict[str, Any]) -> list[dict[str, Any]] | None:
  """McNemar's exact test of the Transformer against the LSTM on the examples both answered,
  per distance and over all of them: [{'d' ('all' for the pool), 'transformer_only',
  'lstm_only', 'p'}], or None when the run kept no answers."""
  from transformer.decoding.significance import mcnemar

  by_kind = {m["kind"]: m.get("correct") for m in run_["models"]}
  t, lstm = by_kind.get("transformer"), by_kind.get("lstm")
  if not t or not lstm:
    return None

  def bits(s: str) -> list[bool]:
    return [c == "1" for c in s]

  rows = []
  for d in sorted(set(t) & set(lstm), key=int):
    rows.append({"d": d, **_named(mcnemar(bits(t[d]), bits(lstm[d])))})
  pooled = sorted(set(t) & set(lstm), key=int)
  rows.append({"d": "all", **_named(mcnemar(bits("".join(t[d] for d in pooled)),
                                            bits("".join(lstm[d] for d in pooled))))})
  return rows


def _named(test: dict[str, Any]) -> dict[str, Any]:
  return {"transformer_only": test["a_only"], "lstm_only": test["b_only"], "p": test["p"]}


def plot(lr: dict[str, Any], path: str) -> None:
  """Accuracy against d and the training loss, a line per model and distribution."""
  fig, axes = report.figure(1, 2, figsize=(10, 3.8))
  for j, run_ in enumerate(lr["runs"]):
    style = ("-", "--", ":")[j % 3]
    dist = run_["distribution"].replace("_", "-")

    def label(r: dict[str, Any], dist: str = dist) -> str:
      return f"{r['kind']}, d {dist}"

    acc = [{"kind": m["kind"], "d": int(d), "acc": a} for m in run_["models"]
           for d, a in sorted(m["accuracy"].items(), key=lambda x: int(x[0]))]
    loss = [{"kind": m["kind"], "step": t, "loss": v} for m in run_["models"]
            for t, v in m["losses"]]
    report.plot_series(axes[0], acc, "d", "acc", group=label, style="o" + style)
    report.plot_series(axes[1], loss, "step", "loss", group=label, style=style)
  axes[0].axhline(1 / lr["settings"]["num_keys"], color="gray", ls=":", label="chance")
  axes[0].set(xscale="log", xlabel="distance d", ylabel="accuracy", title="recall after d",
              ylim=(0, 1.05))
  axes[1].set(xlabel="step", ylabel="training loss per token", title="training", yscale="log")
  report.finish_axes(axes, legend_size=7)
  report.save_figure(fig, path)
