"""Training: the sharded Trainer and `train_and_evaluate(config, workdir)`.

Set-up follows the usual jit-with-shardings recipe: abstract init with `jax.eval_shape`,
shardings from the parameters' logical axis names and the config's rules, then a jitted init
with those output shardings, so parameters and optimiser state are created already sharded.
`train_step` is jitted once with input/output shardings and a donated state, and compiled ahead
of time for every batch shape the run will see (`Trainer.precompile`), so that the loop never
stops to compile.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import jax
from absl import logging

from transformer import compilation, hardware, storage
from transformer import sharding as sharding_lib
from transformer import workdir as workdir_lib
from transformer.data import bucketing, input_pipeline, mixture, vocabulary
from transformer.data.prefetch import Prefetcher
from transformer.decoding.translate import Translator
from transformer.errors import ConfigError
from transformer.metrics import MetricWriter, format_duration, summarize
from transformer.nn.model import ModelConfig
from transformer.nn.model_family import count_params
from transformer.profiling import Profiler
from transformer.training import evaluators, finetune, parameters
from transformer.training.best_checkpoint import BestCheckpoint, Tracker, log_improvement
from transformer.training.checkpoint import Checkpointer
from transformer.training.run_meta import check_meta, run_meta
from transformer.training.train_state import TrainState, optimizer_value
from transformer.training.trainer import Trainer, eval_shapes
from transformer.training.validate import validate


class _StopSignal:
  """Turns SIGTERM / SIGINT into a flag the loop checks after each step."""

  def __init__(self):
    self.received: int | None = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: leave signals alone
        pass
    return self

  def _handle(self, signum, frame):
    self.received = signum

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def process_start_time() -> float:
  """When this process started, in seconds since the epoch (psutil comes with Orbax)."""
  import psutil

  return psutil.Process().create_time()


def every(step: int, period: int, last: int) -> bool:
  """Whether something done every `period` steps (0: never) is due after `step`, before `last`."""
  return bool(period) and step % period == 0 and step < last


class Meter:
  """Throughput and host-time bookkeeping between two log lines.

  A step's metrics are fetched from the device one step late (`step`), so that the host never
  waits for the step it has just dispatched.

  Args:
    step: the step the window starts after.
    params: the model's parameters, for model FLOPs (`hardware.model_flops_per_step`).
    peak_flops: the dense bf16 peak FLOP/s of all the devices; None (e.g. a CPU): no MFU.
  """

  def __init__(self, step: int, params: int = 0, peak_flops: float | None = None):
    self._pending = None
    self.params = params
    self.peak_flops = peak_flops
    self.reset(step)

  def reset(self, step: int) -> None:
    self.start_time, self.start_step, self.host_time = time.time(), step, 0.0
    self.sums: dict[str, float] = {}
    self.positions = 0

  def step(self, metrics: dict[str, jax.Array], positions: int = 0) -> None:
    """Counts a dispatched step; `positions`: its batch's source + target positions."""
    if self._pending is not None:
      self._add(self._pending)
    self._pending = metrics
    self.positions += positions

  def _add(self, metrics: dict[str, jax.Array]) -> None:
    for k, v in jax.device_get(metrics).items():
      self.sums[k] = self.sums.get(k, 0.0) + float(v)

  def record(self, step: int, learning_rate: float) -> dict[str, float]:
    if self._pending is not None:
      self._add(self._pending)
      self._pending = None
    elapsed = max(time.time() - self.start_time, 1e-9)
    steps = max(step - self.start_step, 1)
    record = summarize(self.sums, "train")
    # Real (non-padding) source and target tokens.
    real = self.sums["tokens"] + self.sums["source_tokens"]
    record.update({
      "train/learning_rate": learning_rate,
      "train/grad_norm": self.sums["grad_norm"] / steps,
      "train/param_norm": self.sums["param_norm"] / steps,
      "train/nonfinite_steps": self.sums["nonfinite"],
      "train/steps_per_s": steps / elapsed,
      "train/tokens_per_s": real / elapsed,
      # The share of the batches' positions that hold real tokens (not padding).
      "train/real_token_fraction": real / max(self.positions, 1),
      # The share of wall time the loop waited for a batch (built ahead in a thread).
      "train/host_fraction": self.host_time / elapsed,
    })
    if self.peak_flops:
      # Model FLOPs of the real tokens only: padding is work the model did not need.
      flops = hardware.model_flops_per_step(self.params, self.sums["source_tokens"],
                                            self.sums["tokens"])
      record["train/mfu"] = flops / elapsed / self.peak_flops
    return record


def log_progress(record: dict[str, float], step: int, total: int) -> None:
  eta = (total - step) / max(record["train/steps_per_s"], 1e-9)
  mfu = f"  MFU {100 * record['train/mfu']:.1f}%" if "train/mfu" in record else ""
  logging.info("step %d/%d  loss %.4f  acc %.3f  lr %.2e  %.0f tokens/s (%.0f%% of positions)%s"
               "  host %.1f%%  ETA %s", step, total, record["train/loss"],
               record["train/accuracy"], record["train/learning_rate"],
               record["train/tokens_per_s"], 100 * record["train/real_token_fraction"], mfu,
               100 * record["train/host_fraction"], format_duration(eta))


def restore_or_init(trainer: Trainer, checkpointer: Checkpointer, meta: dict[str, Any],
                    config: Any, workdir: str, tracker: Tracker | None,
                    source: finetune.Source | None) -> TrainState:
  """The newest usable checkpoint's state (and the tracker's state saved with it); else the
  parameters of `source`, the checked `config.init_from` (fine-tuning); else a fresh state."""
  restored = checkpointer.restore_latest(trainer.abstract_state, check_meta(meta))
  if restored is not None:
    state, step = restored
    logging.info("Resumed from the checkpoint of step %d in %s", step, workdir)
    if tracker is not None:
      tracker.restore_state(checkpointer.read_meta(step).get("best_checkpoint"))
    return state
  if source is not None:
    return finetune.initial_state(trainer, config, meta, source)
  logging.info("Starting from scratch in %s", workdir)
  return trainer.init_state(config.seed)


def evaluation_params(config: Any, trainer: Trainer, workdir: str, params: Any,
                      meta: dict[str, Any], keeps_best: bool) -> tuple[Any, str]:
  """The parameters the final evaluation uses and what they are: the mean of the last
  `average_last_checkpoints` checkpoints (section 6.1) when that is 2 or more; else the best
  checkpoint's, when the run keeps one; else `params` (the final step's)."""
  if config.average_last_checkpoints > 1:
    choice = workdir_lib.choose(average=config.average_last_checkpoints)
  elif keeps_best and parameters.has_best(workdir):
    choice = workdir_lib.choose(workdir_lib.BEST)
  else:
    return params, "final"
  selected = parameters.select(workdir, choice)
  logging.info("Evaluating the %s", selected.label)
  ema = optimizer_value(config, "ema_decay") > 0
  return parameters.restore(trainer.layout, selected, meta, ema=ema), selected.label


def train_and_evaluate(config: Any, workdir: str) -> dict[str, Any]:
  """Trains with evaluation and checkpoints; resumes from the newest checkpoint in `workdir`.

  `workdir` may be local or in an object store (`gs://...`). Process 0 holds the workdir's
  lock for the whole run. Returns the final metrics (with `interrupted` set if a signal
  stopped the run, and `stopped_early` the reason if early stopping did).
  """
  model_config = validate(config, jax.device_count())
  reader = input_pipeline.open_reader(config)  # Checks the data before writing anything.
  source = finetune.check_source(config, model_config) if config.get("init_from") else None
  if source is not None and mixture.is_mixture(config):
    # The tags must be pieces of the vocabulary fine-tuning keeps: checked before any write.
    mixture.tag_ids(vocabulary.stored_tokenizer(source.workdir), mixture.corpora_of(config))
  workdir = os.fspath(storage.check_writable(workdir))
  if jax.process_index() == 0:
    # The run's config, for every other mode (transformer/workdir.py).
    workdir_lib.save(config, workdir)
    if source is not None:
      finetune.copy_vocabulary(source, workdir)
  if config.data.get("cache_dir"):
    storage.check_writable(config.data.cache_dir, "--config.data.cache_dir")
  compilation.use_persistent_cache(config.compilation_cache_dir)  # before the first compile
  lock = (storage.WorkdirLock(workdir_lib.paths(workdir).lock) if jax.process_index() == 0
          else contextlib.nullcontext())
  # From here on SIGTERM / SIGINT (a preemption) stop the run at the next step, with a save.
  with lock, _StopSignal() as stop:
    return _train_and_evaluate(config, workdir, model_config, reader, stop, source)


def _train_and_evaluate(config: Any, workdir: str, model_config: ModelConfig,
                        reader: Any, stop: _StopSignal,
                        source: finetune.Source | None) -> dict[str, Any]:
  mesh = sharding_lib.make_mesh(config.mesh)
  data = input_pipeline.build_pipeline(
    config, workdir, batch_multiple=sharding_lib.data_parallel_size(mesh), reader=reader,
    process_index=jax.process_index(), process_count=jax.process_count())
  del reader
  if data.tokenizer.vocab_size != model_config.vocab_size:
    raise ConfigError(f"data.vocab_size={model_config.vocab_size} but {data.tokenizer.path} has "
                      f"{data.tokenizer.vocab_size} pieces; use a new --workdir")
  if jax.process_index() == 0:
    bucketing.save_buckets(workdir, data.buckets)
  meta = run_meta(config, model_config, data.tokenizer.sha256)
  trainer = Trainer(config, mesh, model_config)
  checkpointer = Checkpointer(workdir_lib.paths(workdir).checkpoints, config.keep_checkpoints)
  tracker = Tracker.from_config(config)
  best = BestCheckpoint(workdir) if tracker is not None else None
  writer = None
  ahead = None
  profiler = None
  try:
    state = restore_or_init(trainer, checkpointer, meta, config, workdir, tracker, source)
    step = int(jax.device_get(state.step))
    # A run that stopped early and is started again goes straight to its final evaluation.
    stopped_early = stop_reason(tracker) if tracker is not None and tracker.should_stop() else None
    writer = MetricWriter(workdir)
    writer.truncate_after(step)
    context = evaluators.Context(
      trainer.layout, lambda decode: Translator(model_config, decode, mesh,
                                                trainer.layout.param_shardings, data.buckets,
                                                detokenize=data.tokenizer.decode),
      data.tokenizer, data.eval, data.references, workdir, config,
      restore_members=lambda specs, what: parameters.restore_members(
        config, data.tokenizer, specs, mesh, what), tag_ids=data.tag_ids)
    evals = evaluators.build(evaluators.of_config(config), context)
    logging.info("Model: %s parameters; mesh %s; batch shapes %s",
                 f"{count_params(trainer.abstract_state.params):,}",
                 dict(mesh.shape), data.train.shapes())

    def save(step: int, state: TrainState) -> None:
      check_nonfinite(config, state)  # Never checkpoint a run that has diverged.
      extra = {"best_checkpoint": tracker.state()} if tracker is not None else {}
      checkpointer.save(step, state, {**meta, **extra})

    # Batch i is a pure function of (seed, i), built ahead in a thread; resuming is exact.
    ahead = Prefetcher(lambda i: sharding_lib.local_batch_to_global(data.train.batch(i), mesh),
                       step, config.num_train_steps)
    # Every batch shape of training and evaluation, compiled now rather than when it first
    # comes up in the loop; and the learning rate's few eager operations.
    compile_start = time.time()
    if step < config.num_train_steps and not stopped_early:
      trainer.precompile(data.train.shapes(),
                         eval_shapes(data.eval["validation"] + data.eval["test"]))
      trainer.learning_rate(step)
    # With the first log window's record: how long this start took (read by benchmarks).
    startup = {"startup/seconds": time.time() - process_start_time(),
               "startup/compile_s": time.time() - compile_start,
               "startup/batch_shapes": str(data.train.shapes())}
    kind = jax.devices()[0].device_kind
    peak = hardware.peak_of(kind)  # None on a CPU: no MFU
    if peak is not None:
      logging.info("MFU against the dense bf16 peak of %d x %s: %.0f TFLOP/s each",
                   jax.device_count(), kind, peak / 1e12)
    rng = jax.random.key(config.seed)
    meter = Meter(step, count_params(trainer.abstract_state.params),
                  None if peak is None else peak * jax.device_count())
    profiler = Profiler(config.profile_steps, workdir)
    profiler.step(step)
    while step < config.num_train_steps and not stopped_early:
      t0 = time.time()
      batch = ahead.next()
      meter.host_time += time.time() - t0
      state, metrics = trainer.train_step(state, batch, rng)
      meter.step(metrics, batch["inputs"].size + batch["targets"].size)
      step += 1
      if step % config.log_every_steps == 0 or step == config.num_train_steps:
        record = {**meter.record(step, trainer.learning_rate(step - 1)), **startup}
        startup = {}
        writer.write(step, record)
        log_progress(record, step, config.num_train_steps)
        check_nonfinite(config, state)
        meter.reset(step)
      # The last step too when a best checkpoint is kept: it may be the best.
      due = evaluators.due(evals, step, config.num_train_steps + (tracker is not None))
      if due:
        result = evaluators.run_all(due, state.eval_params, step)
        writer.write(step, result.metrics)
        logging.info("evaluation at step %d: %s", step, _fmt(result.metrics))
        if tracker is not None and tracker.metric in result.metrics:
          stopped_early = track_best(tracker, best, step, state, meta,
                                     result.metrics[tracker.metric], writer)
      if every(step, config.checkpoint_every_steps, config.num_train_steps) or stopped_early:
        save(step, state)
      if stopped_early:
        logging.warning("stopping early at step %d: %s", step, stopped_early)
        break
      if stop.received is not None:
        save(step, state)
        checkpointer.wait()
        name = signal.Signals(stop.received).name
        logging.warning("%s received: saved the checkpoint of step %d in %s; rerun the same "
                        "command to continue", name, step, checkpointer.directory)
        return {"interrupted": name, "step": step}
      profiler.step(step, state)
    profiler.close(state)
    ahead.close()
    save(step, state)
    checkpointer.wait()
    params, label = evaluation_params(config, trainer, workdir, state.eval_params, meta,
                                      keeps_best=best is not None)
    final = evaluators.run_all(evals, params, step)
    writer.write(step, final.metrics)
    return {"interrupted": None, "step": step, "stopped_early": stopped_early,
            "evaluated": label, **final.metrics, "signatures": final.signatures,
            "samples": final.samples}
  finally:
    # Also on errors: wait for an async save in flight, so it finishes or is cleanly dropped.
    if profiler is not None:
      profiler.close()
    if ahead is not None:
      ahead.close()
    checkpointer.close()
    if best is not None:
      best.close()
    if writer is not None:
      writer.close()


def track_best(tracker: Tracker, best: BestCheckpoint, step: int, state: TrainState,
               meta: dict[str, Any], value: float, writer: MetricWriter) -> str | None:
  """Updates the tracker with the evaluation of `step`, saves a new best; returns why the run
  stops early, or None."""
  if tracker.update(step, value):
    best.save(step, state, meta, tracker)
    log_improvement(tracker, step)
  writer.write(step, {"best/step": float(tracker.best_step),
                      "best/value": float(tracker.best_value)})
  return stop_reason(tracker) if tracker.should_stop() else None


def stop_reason(tracker: Tracker) -> str:
  return (f"{tracker.metric} has not improved by more than {tracker.min_delta:g} in "
          f"{tracker.evaluations_without_improvement} evaluations (early_stopping.patience="
          f"{tracker.patience}); the best is {tracker.best_value:.4f} at step "
          f"{tracker.best_step}")


def check_nonfinite(config: Any, state: TrainState) -> None:
  in_a_row = int(jax.device_get(state.nonfinite_in_a_row))
  total = int(jax.device_get(state.nonfinite_total))
  if total and config.nonfinite == "stop":
    raise FloatingPointError(
      f"non-finite loss or gradient at step {int(state.step)} (nonfinite='stop'); the "
      "parameters were left as before that step and the last checkpoint is intact"
    )
  if in_a_row >= config.max_consecutive_nonfinite:
    paper = config.optimizer.get("schedule", "paper") == "paper"
    rate = "optimizer.learning_rate_scale" if paper else "optimizer.learning_rate"
    raise FloatingPointError(
      f"{in_a_row} non-finite steps in a row (max_consecutive_nonfinite="
      f"{config.max_consecutive_nonfinite}); lower {rate} or check the data"
    )


def _fmt(record: dict[str, float]) -> str:
  return "  ".join(f"{k.split('/')[-1]} {v:.4f}" for k, v in record.items())
