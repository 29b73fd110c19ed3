"""Training: the sharded Trainer and `train_and_evaluate(config, workdir)`.

Set-up follows the usual jit-with-shardings recipe: abstract init with `jax.eval_shape`,
shardings from the parameters' logical axis names and the config's rules, then a jitted init
with those output shardings, so parameters and optimiser state are created already sharded.
`train_step` is jitted once with input/output shardings and a donated state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from transformer import bleu as bleu_lib
from transformer import sharding as sharding_lib
from transformer.checkpoint import Checkpointer, average_params
from transformer.data import input_pipeline
from transformer.errors import CheckpointError, ConfigError
from transformer.metrics import MetricWriter, summarize
from transformer.model import TransformerConfig
from transformer.models import build_model
from transformer.train_state import TrainState, make_eval_step, make_optimizer, make_train_step
from transformer.translate import Translator
from transformer.validate import validate


class Trainer:
  """Model, optimiser, mesh and the jitted, sharded init / train / eval functions."""

  def __init__(self, config: Any, mesh: jax.sharding.Mesh, model_config: TransformerConfig):
    self.config = config
    self.mesh = mesh
    self.model_config = model_config
    self.model = build_model(model_config)
    self.tx = make_optimizer(config)
    self.rules = sharding_lib.rules(config)

    def init_boxed(rng):
      dummy = jnp.ones((1, 8), jnp.int32)
      params = self.model.init({"params": rng}, dummy, dummy)["params"]
      zero = jnp.zeros((), jnp.int32)
      return TrainState(step=zero, params=params, opt_state=self.tx.init(params),
                        nonfinite_in_a_row=zero, nonfinite_total=zero)

    with self.context():
      abstract = jax.eval_shape(init_boxed, jax.random.key(0))
      self.state_shardings = sharding_lib.logical_shardings(abstract, mesh, self.rules)
    self.abstract_state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      nn.unbox(abstract), self.state_shardings,
    )
    replicated = sharding_lib.replicated(mesh)
    batch = sharding_lib.batch_sharding(mesh)
    self._init = jax.jit(lambda rng: nn.unbox(init_boxed(rng)),
                         out_shardings=self.state_shardings)
    self._train_step = jax.jit(
      make_train_step(self.model, self.tx, config.label_smoothing),
      in_shardings=(self.state_shardings, batch, replicated),
      out_shardings=(self.state_shardings, replicated),
      donate_argnums=0,
    )
    self._eval_step = jax.jit(
      make_eval_step(self.model, config.label_smoothing),
      in_shardings=(self.state_shardings.params, batch), out_shardings=replicated,
    )

  @contextlib.contextmanager
  def context(self):
    """Mesh and logical-axis rules, so the model's sharding constraints resolve."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  def init_state(self, seed: int) -> TrainState:
    with self.context():
      return self._init(jax.random.key(seed))

  def train_step(self, state: TrainState, batch: dict[str, jax.Array], rng: jax.Array):
    with self.context():
      return self._train_step(state, batch, rng)

  def eval_step(self, params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    with self.context():
      return self._eval_step(params, batch)

  def lower_train_step(self, batch_shapes: dict[str, jax.ShapeDtypeStruct]):
    """The lowered step for given batch shapes (for compile time and memory analysis)."""
    with self.context():
      return self._train_step.lower(self.abstract_state, batch_shapes,
                                    jax.ShapeDtypeStruct((), jax.random.key(0).dtype))

  def learning_rate(self, step: int) -> float:
    from transformer.train_state import learning_rate_schedule

    opt = self.config.optimizer
    return float(learning_rate_schedule(self.model_config.d_model, opt.warmup_steps,
                                        opt.learning_rate_scale)(step))


def evaluate(trainer: Trainer, params: Any, batches: list[dict[str, np.ndarray]],
             prefix: str) -> dict[str, float]:
  """Loss, nll, perplexity and token accuracy over fixed-shape batches."""
  totals: dict[str, float] = {}
  for batch in batches:
    sums = trainer.eval_step(params, sharding_lib.local_batch_to_global(batch, trainer.mesh))
    for k, v in jax.device_get(sums).items():
      totals[k] = totals.get(k, 0.0) + float(v)
  return summarize(totals, prefix)


def _local_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's contiguous share of a global host batch."""
  n, p = jax.process_count(), jax.process_index()
  rows = batch["inputs"].shape[0] // n
  return {k: v[p * rows:(p + 1) * rows] for k, v in batch.items() if k in ("inputs", "targets")}


def bleu_on(translator: Translator, params: Any, tokenizer, pairs: list[tuple[str, str]],
            path: str | None) -> tuple[bleu_lib.BleuResult, list[str]]:
  """Translates the sources of `pairs`, scores against the targets, writes the outputs."""
  src_ids = [tokenizer.encode(s) for s, _ in pairs]
  hyps = [tokenizer.decode(ids) for ids in translator.translate_ids(params, src_ids)]
  result = bleu_lib.corpus_bleu(hyps, [t for _, t in pairs])
  if path is not None and jax.process_index() == 0:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(h + "\n" for h in hyps)
  return result, hyps


def run_meta(config: Any, model_config: TransformerConfig, vocab_path: str) -> dict[str, Any]:
  """What a checkpoint must agree on with the run that restores it."""
  with open(vocab_path, "rb") as f:
    vocab_sha = hashlib.sha256(f.read()).hexdigest()
  model = dataclasses.asdict(model_config)
  return {"model": model, "vocab_sha256": vocab_sha, "config": json.loads(config.to_json())}


# Fields that may differ between a checkpoint and the run restoring it: they change how the
# computation is done, not the parameters.
_COMPATIBLE_FIELDS = ("dtype", "attention", "attention_chunk_size", "remat", "dropout_rate",
                      "attention_dropout_rate", "dropout_mask_bits")


def check_meta(expected: dict[str, Any]):
  def check(meta: dict[str, Any], path: str) -> None:
    if meta.get("vocab_sha256") != expected["vocab_sha256"]:
      raise CheckpointError(
        f"checkpoint {path} was trained with another vocabulary than the workdir's; "
        "use a new --workdir"
      )
    old, new = meta.get("model", {}), expected["model"]
    for field in sorted(set(old) | set(new)):
      if field in _COMPATIBLE_FIELDS:
        continue
      if old.get(field) != new.get(field):
        raise CheckpointError(
          f"checkpoint {path} has model.{field}={old.get(field)!r} but the config has "
          f"{new.get(field)!r}; use a new --workdir or the checkpoint's config"
        )

  return check


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


def train_and_evaluate(config: Any, workdir: str) -> dict[str, Any]:
  """Trains with evaluation and checkpoints; resumes from the newest checkpoint in `workdir`.

  Returns the final metrics (with `interrupted` set if a signal stopped the run).
  """
  model_config = validate(config, jax.device_count(), workdir)
  mesh = sharding_lib.make_mesh(config.mesh)
  dp = sharding_lib.data_parallel_size(mesh)
  # Check the data before writing anything into the workdir.
  splits = input_pipeline.load_splits(config)
  os.makedirs(workdir, exist_ok=True)
  tokenizer = input_pipeline.get_tokenizer(config, workdir, splits["train"])
  if tokenizer.vocab_size != model_config.vocab_size:
    raise ConfigError(
      f"data.vocab_size={model_config.vocab_size} but {tokenizer.path} has "
      f"{tokenizer.vocab_size} pieces; use a new --workdir"
    )
  meta = run_meta(config, model_config, tokenizer.path)

  trainer = Trainer(config, mesh, model_config)
  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), config.keep_checkpoints)
  writer = None
  try:
    restored = checkpointer.restore_latest(trainer.abstract_state, check_meta(meta))
    if restored is None:
      state = trainer.init_state(config.seed)
      logging.info("Starting from scratch in %s", workdir)
    else:
      state, step = restored
      logging.info("Resumed from the checkpoint of step %d in %s", step, workdir)
    start_step = int(jax.device_get(state.step))
    writer = MetricWriter(workdir)
    writer.truncate_after(start_step)

    # Tokenize once; batch i is then a pure function of (seed, i), so resuming is exact.
    train_src, train_tgt = input_pipeline.tokenize_pairs(tokenizer, splits["train"])
    batches = input_pipeline.TrainBatches(
      train_src, train_tgt, config, batch_multiple=dp,
      process_index=jax.process_index(), process_count=jax.process_count(),
    )
    valid_ids = [(tokenizer.encode(s), tokenizer.encode(t)) for s, t in splits["validation"]]
    eval_batches = [
      _local_rows(b) for b in input_pipeline.eval_batches(valid_ids, config, batch_multiple=dp)
    ]
    translator = Translator(model_config, config.decode, mesh, trainer.state_shardings.params,
                            config.data.bucket_lengths)
    bleu_pairs = splits["validation"]
    if config.eval_bleu_sentences:
      bleu_pairs = bleu_pairs[: config.eval_bleu_sentences]
    n_params = sum(x.size for x in jax.tree.leaves(trainer.abstract_state.params))
    logging.info("Model: %s parameters; mesh %s; batch shapes %s", f"{n_params:,}",
                 dict(mesh.shape), batches.shapes())

    rng = jax.random.key(config.seed)
    result: dict[str, Any] = {"interrupted": None}
    last_log_time, last_log_step, host_time, tokens_seen = time.time(), start_step, 0.0, 0.0
    train_sums: dict[str, float] = {}
    pending = None  # metrics of the last step, fetched lazily to keep the device busy
    step = start_step
    with _StopSignal() as stop:
      while step < config.num_train_steps:
        t0 = time.time()
        batch = sharding_lib.local_batch_to_global(batches.batch(step), mesh)
        host_time += time.time() - t0
        state, metrics = trainer.train_step(state, batch, rng)
        step += 1
        if pending is not None:
          _accumulate(train_sums, pending)
        pending = metrics

        if step % config.log_every_steps == 0 or step == config.num_train_steps:
          _accumulate(train_sums, pending)
          pending = None
          elapsed = time.time() - last_log_time
          tokens_seen = train_sums.pop("_tokens_total", 0.0)
          steps_done = step - last_log_step
          record = summarize(train_sums, "train")
          record.update({
            "train/learning_rate": trainer.learning_rate(step - 1),
            "train/grad_norm": train_sums["grad_norm"] / max(steps_done, 1),
            "train/param_norm": train_sums["param_norm"] / max(steps_done, 1),
            "train/nonfinite_steps": train_sums["nonfinite"],
            "train/steps_per_s": steps_done / max(elapsed, 1e-9),
            "train/tokens_per_s": tokens_seen / max(elapsed, 1e-9),
            "train/host_fraction": host_time / max(elapsed, 1e-9),
          })
          writer.write(step, record)
          eta = (config.num_train_steps - step) / max(record["train/steps_per_s"], 1e-9)
          logging.info(
            "step %d/%d  loss %.4f  acc %.3f  lr %.2e  %.0f tokens/s  host %.1f%%  ETA %s",
            step, config.num_train_steps, record["train/loss"], record["train/accuracy"],
            record["train/learning_rate"], record["train/tokens_per_s"],
            100 * record["train/host_fraction"], _duration(eta),
          )
          _check_nonfinite(config, state)
          train_sums, last_log_time, last_log_step, host_time = {}, time.time(), step, 0.0

        if step % config.eval_every_steps == 0 and step < config.num_train_steps:
          record = evaluate(trainer, state.params, eval_batches, "eval")
          writer.write(step, record)
          logging.info("eval at step %d: %s", step, _fmt(record))
        if config.bleu_every_steps and step % config.bleu_every_steps == 0 and (
            step < config.num_train_steps):
          res, _ = bleu_on(translator, state.params, tokenizer, bleu_pairs,
                           os.path.join(workdir, "translations", f"validation_{step}.txt"))
          writer.write(step, {"eval/bleu": res.score})
          logging.info("validation BLEU at step %d: %.2f", step, res.score)
        if step % config.checkpoint_every_steps == 0 or step == config.num_train_steps:
          _check_nonfinite(config, state)
          checkpointer.save(step, state, meta)
        if stop.received is not None:
          _check_nonfinite(config, state)
          checkpointer.save(step, state, meta)
          checkpointer.wait()
          name = signal.Signals(stop.received).name
          logging.warning("%s received: saved the checkpoint of step %d in %s; rerun the same "
                          "command to continue", name, step, checkpointer.directory)
          result["interrupted"] = name
          result["step"] = step
          return result

    # Final evaluation: the newest state, or the average of the last checkpoints.
    checkpointer.save(step, state, meta)
    checkpointer.wait()
    params = state.params
    if config.average_last_checkpoints > 1:
      steps = checkpointer.all_steps()[-config.average_last_checkpoints:]
      params = average_params(checkpointer, steps, trainer.abstract_state)
      logging.info("Evaluating the average of the checkpoints of steps %s", steps)
    final = evaluate(trainer, params, eval_batches, "eval")
    valid_bleu, _ = bleu_on(translator, params, tokenizer, bleu_pairs,
                            os.path.join(workdir, "translations", f"validation_{step}.txt"))
    final["eval/bleu"] = valid_bleu.score
    test_bleu, test_hyps = bleu_on(translator, params, tokenizer, splits["test"],
                                   os.path.join(workdir, "translations", f"test_{step}.txt"))
    final["test/bleu"] = test_bleu.score
    if config.dataset == "wmt14":
      final["test/bleu_tokenized"] = bleu_lib.tokenized_bleu(
        test_hyps, [t for _, t in splits["test"]]).score
    writer.write(step, final)
    result.update(final)
    result["step"] = step
    result["bleu_signature"] = test_bleu.signature
    result["samples"] = [
      (s, h, t) for (s, t), h in zip(splits["test"][: config.num_samples_to_print],
                                     test_hyps[: config.num_samples_to_print], strict=True)
    ]
    return result
  finally:
    # Also on errors: wait for an async save in flight, so it finishes or is cleanly dropped.
    checkpointer.close()
    if writer is not None:
      writer.close()



def _accumulate(totals: dict[str, float], metrics: dict[str, jax.Array]) -> None:
  fetched = jax.device_get(metrics)
  for k, v in fetched.items():
    totals[k] = totals.get(k, 0.0) + float(v)
  # Throughput counts the real (non-padding) source and target tokens.
  totals["_tokens_total"] = totals.get("_tokens_total", 0.0) + float(
    fetched["tokens"] + fetched["source_tokens"])


def _check_nonfinite(config: Any, state: TrainState) -> None:
  in_a_row = int(jax.device_get(state.nonfinite_in_a_row))
  total = int(jax.device_get(state.nonfinite_total))
  if total and config.nonfinite == "stop":
    raise FloatingPointError(
      f"non-finite loss or gradient at step {int(state.step)} (nonfinite='stop'); the "
      "parameters were left as before that step and the last checkpoint is intact"
    )
  if in_a_row >= config.max_consecutive_nonfinite:
    raise FloatingPointError(
      f"{in_a_row} non-finite steps in a row (max_consecutive_nonfinite="
      f"{config.max_consecutive_nonfinite}); lower optimizer.learning_rate_scale or check the data"
    )


def _fmt(record: dict[str, float]) -> str:
  return "  ".join(f"{k.split('/')[-1]} {v:.4f}" for k, v in record.items())


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
