"""Bucketed against packed training batches: real-token fraction and real tokens per second.

    python -m benchmarks.packing --config=configs/numbers.py --workdir=/tmp/pack_num
    python -m benchmarks.packing --config=configs/wmt.py \\
        --config.data_dir=/tmp/synth_wmt --workdir=/tmp/pack_wmt \\
        --config.model.num_layers=1 --config.model.d_model=64 --config.model.d_ff=256 \\
        --config.model.num_heads=4 --timed_steps=24 --timed_tokens_per_batch=4096

For each of the two batch layouts of the same corpus and config (`data.packing` False, then
True), over the first `--batches` training batches (steps 0, 1, ...) of the run's plan:

  real tokens   the fraction of the batches' positions (source and target) that are not padding
  host          the time to the first batch (filtering, the first epoch's plan) and the batch
                rate of `batch(step)` on this host
  step          real (non-padding) source + target tokens per second of the training step on
                this CPU, over `--timed_steps` steps after one untimed step of every shape
                (bucketed batches have one shape per bucket, each compiled once); the two
                layouts take turns in 4 slices (fewer if there are fewer steps), so that
                the load of a shared machine falls on both alike

The vocabulary and token cache come from (or go into) `--workdir`, as for a training run. The
model is the config's (override it on the command line, as in the WMT command above, where the
base model would take minutes per step on a CPU, and the logits of 25,000 tokens over 37,000
pieces some 14 GiB). Writes the `--section` of `--out`.md and .json.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

from measuring import measure, report
from transformer.errors import UserError, fail, flags_parser

LAYOUTS = ("bucketed", "packed")


def layout_config(config: Any, layout: str) -> Any:
  """A copy of `config` with `data.packing` set for `layout`."""
  out = copy.deepcopy(config)
  out.data.packing = layout == "packed"
  return out


def count_batches(batches: Any, steps: int) -> dict[str, float]:
  """Real tokens and positions (both sides) of batches 0..steps-1, and the host's rate."""
  import numpy as np

  real = positions = examples = 0
  t0 = time.time()
  for step in range(steps):
    b = batches.batch(step)
    for side in ("inputs", "targets"):
      real += int(np.count_nonzero(b[side]))
      positions += b[side].size
    examples += int(np.count_nonzero(b["targets"] == 1))  # one EOS per example
  return {"real_tokens": real, "positions": positions, "real_fraction": real / positions,
          "examples_per_batch": examples / steps,
          "host_batches_per_second": steps / (time.time() - t0)}


class _Stepper:
  """A Trainer, its state, and the device batches of steps 0..steps-1 of one layout."""

  def __init__(self, config: Any, batches: Any, steps: int):
    import jax
    import numpy as np

    from transformer import sharding as sharding_lib
    from transformer.training.trainer import Trainer
    from transformer.training.validate import validate

    mesh = sharding_lib.make_mesh(config.mesh)
    self.trainer = Trainer(config, mesh, validate(config, jax.device_count()))
    self.state, self.rng = self.trainer.init_state(config.seed), jax.random.key(config.seed)
    host = [batches.batch(s) for s in range(steps)]
    self.real = [int(np.count_nonzero(b["inputs"])) + int(np.count_nonzero(b["targets"]))
                 for b in host]
    self.device = [sharding_lib.local_batch_to_global(b, mesh) for b in host]

  def compile(self) -> tuple[int, float]:
    """One untimed step per shape (compiles it; the state moves on a few steps)."""
    import jax

    t0 = time.time()
    shapes = {}
    for b in self.device:
      shapes.setdefault(tuple(v.shape for v in b.values()), b)
    for b in shapes.values():
      self.state, metrics = self.trainer.train_step(self.state, b, self.rng)
    jax.block_until_ready(metrics)
    return len(shapes), time.time() - t0

  def run(self, lo: int, hi: int) -> None:
    """Runs steps lo..hi-1 and waits for them."""
    import jax

    for b in self.device[lo:hi]:
      self.state, metrics = self.trainer.train_step(self.state, b, self.rng)
    jax.block_until_ready(metrics)


def time_training(configs: dict[str, Any], batches: dict[str, Any], steps: int,
                  rounds: int = 4) -> dict[str, dict[str, float]]:
  """Real tokens per second of steps 0..steps-1 of each layout on this host's devices.

  The layouts take turns, `rounds` slices of the steps each, so that a change in the load of
  a shared machine falls on both alike.
  """
  steppers = {k: _Stepper(configs[k], batches[k], steps) for k in configs}
  compiled = {k: s.compile() for k, s in steppers.items()}
  rounds = min(rounds, steps)  # no empty slice
  cuts = [steps * r // rounds for r in range(rounds + 1)]
  times, _ = measure.time_interleaved(
    {k: lambda i, s=s: s.run(cuts[i], cuts[i + 1]) for k, s in steppers.items()}, rounds)
  return {k: {"timed_steps": steps, "timed_turns": rounds,
              "timed_tokens_per_batch": configs[k].data.tokens_per_batch,
              "compiled_shapes": compiled[k][0], "compile_seconds": compiled[k][1],
              "step_seconds": sum(times[k]) / steps,
              "real_tokens_per_second": sum(s.real) / sum(times[k])}
          for k, s in steppers.items()}


def compare_layouts(config: Any, workdir: str, batches: int, timed_steps: int,
                    timed_tokens_per_batch: int = 0) -> dict[str, Any]:
  """Both layouts of `config`'s corpus; see the module doc. The timed steps use batches of
  `timed_tokens_per_batch` tokens per side if it is not 0. Raises UserError (a bad argument
  or config, missing data) before any work."""
  import jax

  from transformer.training.validate import validate

  measure.check_at_least((("--batches", batches, 1), ("--timed_steps", timed_steps, 0),
                          ("--timed_tokens_per_batch", timed_tokens_per_batch, 0)))
  configs = {k: layout_config(config, k) for k in LAYOUTS}
  for cfg in configs.values():  # both layouts, before any work
    validate(cfg, jax.device_count())
  from transformer.data import input_pipeline, token_cache, vocabulary

  reader = input_pipeline.open_reader(config)
  tok = vocabulary.get_tokenizer(config, workdir, reader)
  split = token_cache.load_or_build(reader, "train", tok, token_cache.cache_root(config, workdir))
  out: dict[str, Any] = {"train_examples": len(split)}
  trains = {}
  for layout in LAYOUTS:
    t0 = time.time()
    trains[layout] = train = input_pipeline.train_batches(split, configs[layout])
    train.batch(0)  # the first epoch's plan, if not built yet
    out[layout] = {"plan_seconds": time.time() - t0,
                   "kept_examples": train.num_examples, "steps_per_epoch": train.steps_per_epoch,
                   "shapes": [list(s) for s in train.shapes()],
                   "epoch_real_fraction": train.real_token_fraction(),
                   **count_batches(train, batches)}
    print(f"{layout}: real tokens {out[layout]['real_fraction']:.3f}", flush=True)
  if timed_steps:
    if timed_tokens_per_batch:
      for cfg in configs.values():
        cfg.data.tokens_per_batch = timed_tokens_per_batch
      trains = {k: input_pipeline.train_batches(split, configs[k]) for k in LAYOUTS}
    for layout, rec in time_training(configs, trains, timed_steps).items():
      out[layout].update(rec)
      print(f"{layout}: {rec['real_tokens_per_second']:,.0f} real tokens/s", flush=True)
  return out


def report_parts(config: Any, result: dict[str, Any], batches: int) -> dict[str, Any]:
  """`report.write`'s title, intro, body (the corpus, the model, a table of both layouts) and
  record of one `compare_layouts` result."""
  b, p = result["bucketed"], result["packed"]
  timed = "real_tokens_per_second" in b
  m = config.model
  rows = [
    ["batch shapes (rows, length[, target length])",
     ", ".join(str(tuple(s)) for s in b["shapes"]), str(tuple(p["shapes"][0]))],
    ["training pairs kept (of {:,})".format(result["train_examples"]),
     f"{b['kept_examples']:,}", f"{p['kept_examples']:,}"],
    ["steps per epoch", f"{b['steps_per_epoch']:,}", f"{p['steps_per_epoch']:,}"],
    ["examples per batch (mean)", f"{b['examples_per_batch']:.1f}",
     f"{p['examples_per_batch']:.1f}"],
    [f"**real-token fraction, {batches:,} batches**", f"**{b['real_fraction']:.3f}**",
     f"**{p['real_fraction']:.3f}**"],
    ["real-token fraction, epoch 0 (whole plan)", f"{b['epoch_real_fraction']:.3f}",
     f"{p['epoch_real_fraction']:.3f}"],
    ["filter and plan the first epoch (s)", f"{b['plan_seconds']:.2f}", f"{p['plan_seconds']:.2f}"],
    ["host batch rate (batches/s)", f"{b['host_batches_per_second']:.0f}",
     f"{p['host_batches_per_second']:.0f}"],
  ]
  if timed:
    rows += [
      ["step time (s, mean)", f"{b['step_seconds']:.3f}", f"{p['step_seconds']:.3f}"],
      ["**real tokens per second**", f"**{b['real_tokens_per_second']:,.0f}**",
       f"**{p['real_tokens_per_second']:,.0f}**"],
      ["compile (s, all shapes)", f"{b['compile_seconds']:.1f}", f"{p['compile_seconds']:.1f}"],
    ]
  notes = ["- Real tokens: non-padding source and target tokens over all positions of the "
           f"batches of steps 0 to {batches - 1} (both sides)."]
  if timed:
    notes.append(
      f"- Real tokens per second: non-padding source + target tokens of steps 0 to "
      f"{b['timed_steps'] - 1} (batches of {b['timed_tokens_per_batch']} tokens per side) "
      "over the wall time of those training steps (batches built beforehand, every shape "
      f"compiled before, the layouts taking turns in {b['timed_turns']} slices); packed / "
      f"bucketed = **{p['real_tokens_per_second'] / b['real_tokens_per_second']:.2f}x**.\n")
  setting = (
    f"Dataset `{config.dataset}`, {config.data.tokens_per_batch} tokens per batch and side, "
    f"buckets {config.data.bucket_lengths}; packed rows of {config.data.packed_source_len} "
    f"source and {config.data.packed_target_len} target positions. Model for the step: "
    f"{m.num_layers} + {m.num_layers} layers, d_model {m.d_model}, d_ff {m.d_ff}, "
    f"{m.num_heads} heads, vocabulary {m.vocab_size}, attention `{m.attention}`.\n")
  return {"title": "Packed against bucketed training batches",
          "intro": "Made by `benchmarks/packing.py` (method in its docstring), a section per "
                   "corpus and model (`--section`, by default the config's name).",
          "body": ["## Results\n", setting,
                   report.markdown_table(["", "bucketed", "packed"], rows), *notes],
          "record": {"result": result}}


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags

  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/numbers.py.",
                                            lock_config=False)
  _WORKDIR = flags.DEFINE_string("workdir", None, "Workdir holding (or given) the vocabulary and "
                                 "the token cache.")
  _BATCHES = flags.DEFINE_integer("batches", 3000, "Training batches counted for the fraction.")
  _TIMED = flags.DEFINE_integer("timed_steps", 20, "Training steps timed per layout (0: none).")
  _TIMED_TOKENS = flags.DEFINE_integer(
    "timed_tokens_per_batch", 0, "data.tokens_per_batch of the timed steps only (0: the "
    "config's); smaller batches keep the step's memory in bounds on a CPU.")
  _OUT = flags.DEFINE_string("out", os.path.join("benchmarks", "results", "packing"),
                             "Report path without extension (.md and .json).")
  _SECTION = flags.DEFINE_string("section", None, "The report's section this run writes (the "
                                 "others are kept); default: the config's name.")

  def main(argv: list[str]) -> None:
    del argv
    config = _CONFIG.value
    if config is None or _WORKDIR.value is None:
      fail("--config and --workdir are required, e.g. --config=configs/numbers.py "
           "--workdir=/tmp/pack_num")
    try:
      result = compare_layouts(config, _WORKDIR.value, _BATCHES.value, _TIMED.value,
                               _TIMED_TOKENS.value)
    except UserError as e:
      fail(str(e))
    report.write(_OUT.value, command=report.command_line(),
                 section=_SECTION.value or config.name,
                 **report_parts(config, result, _BATCHES.value))
    print(f"wrote {_OUT.value}.md", flush=True)

  app.run(main, flags_parser=flags_parser())
