"""Evaluators from the config, the best checkpoint, early stopping (also across kill -9) and
fine-tuning from another workdir."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import optax
import pytest

from configs import numbers as numbers_config
from tests.xla_flags import FAST_COMPILE
from transformer import infer
from transformer.errors import CheckpointError, ConfigError
from transformer.training import evaluators
from transformer.training.best_checkpoint import BestCheckpoint, Tracker
from transformer.training.checkpoint import Checkpointer
from transformer.training.validate import validate

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 40
# A tiny run whose validation loss is evaluated every 2 steps, whose best loss is kept, and
# which stops when 2 evaluations in a row improve it by at most MIN_DELTA.
MIN_DELTA = 0.02
OVERRIDES = {
  "num_train_steps": STEPS, "checkpoint_every_steps": 3, "log_every_steps": 2,
  "evals.valid_loss.every_steps": 2, "evals.valid_translation.sentences": 4,
  "evals.test_translation.sentences": 4, "average_last_checkpoints": 0,
  "best_checkpoint.metric": "eval/loss", "best_checkpoint.mode": "min",
  "early_stopping.patience": 2, "early_stopping.min_delta": MIN_DELTA,
}


def tiny_config(**changes):
  config = numbers_config.get_config("tiny")
  for field, value in {**OVERRIDES, **changes}.items():
    *path, last = field.split(".")
    node = config
    for part in path:
      node = node[part]
    node[last] = value
  return config


def cli_overrides(**changes):
  return [f"--config.{k}={v}" for k, v in {**OVERRIDES, **changes}.items()]


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def evaluations(workdir):
  """(step, eval/loss) of every evaluation in the loop, in order (the final evaluation's
  record is the one with test metrics)."""
  return [(r["step"], r["eval/loss"]) for r in read_metrics(workdir)
          if "eval/loss" in r and "test/bleu" not in r]


def expected_stop(values, min_delta, patience):
  """Where the rule stops, computed here without the Tracker: (stop step, best step)."""
  best, best_step, bad = math.inf, None, 0
  for step, value in values:
    if value < best - min_delta:
      best, best_step, bad = value, step, 0
    else:
      bad += 1
      if bad >= patience:
        return step, best_step
  return None, best_step


def main_args(workdir):
  """The command line of a run of `tiny_config()` by the main program."""
  return [sys.executable, "-m", "transformer.main", "--config=configs/numbers.py:tiny",
          f"--workdir={workdir}", *cli_overrides()]


# Runs of the main program here share one environment, so that they train bitwise alike.
MAIN_ENV = dict(os.environ, XLA_FLAGS=FAST_COMPILE)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
  """An uninterrupted run of the main program that stops early: (workdir, result), the result
  read back from its output and the final evaluation's record of metrics.jsonl."""
  workdir = str(tmp_path_factory.mktemp("best") / "run")
  proc = subprocess.run(main_args(workdir), cwd=REPO, env=MAIN_ENV, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  stop = re.search(r"^Stopped early at step (\d+): (.*)$", proc.stdout, re.MULTILINE)
  label = re.search(r"^Step \d+, evaluating the parameters: (.*)$", proc.stdout, re.MULTILINE)
  assert label, proc.stdout[-3000:]
  final = [r for r in read_metrics(workdir) if "test/bleu" in r][-1]
  return workdir, {**final, "stopped_early": stop and stop.group(2),
                   "evaluated": label.group(1)}


def test_the_tracker_follows_its_rule():
  t = Tracker("eval/bleu", "max", min_delta=0.5, patience=2)
  assert t.update(10, 20.0) and t.best_step == 10
  assert not t.update(20, 20.4)  # not by more than min_delta
  assert t.update(30, 21.0) and t.evaluations_without_improvement == 0
  assert not t.update(40, math.nan) and not t.should_stop()
  assert not t.update(50, 10.0) and t.should_stop()
  fresh = Tracker("eval/bleu", "max", 0.5, 2)
  fresh.restore_state(t.state())
  assert fresh == t
  other = Tracker("eval/loss", "min", 0.0, 2)
  other.restore_state(t.state())  # another metric's state: a fresh start
  assert other.best_step is None
  low = Tracker("eval/loss", "min")
  assert low.update(1, 3.0) and low.update(2, 2.0) and not low.update(3, 2.5)
  assert low.patience == 0 and not low.should_stop()


def test_a_run_stops_early_where_its_rule_says_and_keeps_the_best(stopped):
  workdir, result = stopped
  values = evaluations(workdir)
  stop_step, best_step = expected_stop(values, MIN_DELTA, 2)
  assert stop_step is not None and stop_step < STEPS, f"the run did not stop early: {values}"
  assert result["step"] == stop_step and result["stopped_early"]
  assert f"step {best_step}" in result["stopped_early"]
  assert BestCheckpoint(workdir).step() == best_step
  # The final evaluation is the best checkpoint's, and it reports every evaluator's metrics.
  assert result["evaluated"].startswith(f"best checkpoint, step {best_step} (eval/loss ")
  for name in ("eval/loss", "eval/perplexity", "eval/bleu", "eval/chrf", "test/bleu",
               "test/ter"):
    assert name in result
  best_loss = dict(values)[best_step]
  assert result["eval/loss"] == pytest.approx(best_loss, rel=1e-6)
  # The newest checkpoints rotate (keep 2); the best one is kept apart.
  assert Checkpointer(os.path.join(workdir, "checkpoints"), None).latest_step() == stop_step


def test_checkpoint_best_restores_the_best_parameters(stopped):
  workdir, _ = stopped
  config = tiny_config()
  best = BestCheckpoint(workdir)
  step = best.step()
  want = best.checkpointer.restore(step, None)["params"]
  model = infer.restore(config, workdir, checkpoint="best")
  assert f"step {step}" in model.label and "eval/loss" in model.label
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(model.params),
               jax.device_get(want))
  assert infer.parse_checkpoint("best") == "best"


def test_checkpoint_step_finds_a_step_kept_only_as_the_best(stopped):
  """`--checkpoint=STEP` looks in `best/` too: the best step, rotated out of `checkpoints/`,
  restores there (the same parameters as `--checkpoint=best`)."""
  workdir, _ = stopped
  best = BestCheckpoint(workdir)
  step = best.step()
  best.close()
  assert step not in Checkpointer(os.path.join(workdir, "checkpoints"), None).all_steps()
  by_step = infer.restore(tiny_config(), workdir, checkpoint=str(step))
  by_best = infer.restore(tiny_config(), workdir, checkpoint="best")
  assert by_step.label == f"step {step} (the best checkpoint)"
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(by_step.params),
               jax.device_get(by_best.params))
  with pytest.raises(CheckpointError, match="no such step"):
    infer.restore(tiny_config(), workdir, checkpoint="999999")


def test_a_stopped_run_started_again_only_evaluates(stopped, tmp_path):
  """(In this process, on 8 devices: the final evaluation's loss agrees to rounding.)"""
  from transformer.training.train import train_and_evaluate

  source, first = stopped
  workdir = str(tmp_path / "again")
  shutil.copytree(source, workdir)
  again = train_and_evaluate(tiny_config(), workdir)
  assert again["step"] == first["step"] and again["stopped_early"] == first["stopped_early"]
  assert again["eval/loss"] == pytest.approx(first["eval/loss"], rel=1e-5)


def test_early_stopping_survives_kill_9(stopped, tmp_path):
  """A run killed with -9 between evaluations stops at the same step with the same best step
  and the same evaluations, bitwise, as the uninterrupted one (`stopped`: both through the
  command line, in the same environment)."""
  straight, _ = stopped
  stop_step, best_step = expected_stop(evaluations(straight), MIN_DELTA, 2)
  assert stop_step is not None

  workdir = str(tmp_path / "killed")
  child = subprocess.Popen(main_args(workdir), cwd=REPO, env=MAIN_ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  # Kill once a checkpoint is finalized and the run has evaluated past it.
  deadline = time.time() + 300
  while time.time() < deadline and child.poll() is None:
    ckpt = os.path.join(workdir, "checkpoints")
    done = [int(d) for d in os.listdir(ckpt) if d.isdigit()] if os.path.isdir(ckpt) else []
    if done and os.path.exists(os.path.join(workdir, "metrics.jsonl")) and any(
        s > max(done) for s, _ in evaluations(workdir)):
      break
    time.sleep(0.05)
  assert child.poll() is None, "the run ended before it could be interrupted"
  child.send_signal(signal.SIGKILL)
  child.wait()
  assert max(s for s, _ in evaluations(workdir)) < stop_step
  proc = subprocess.run(main_args(workdir), cwd=REPO, env=MAIN_ENV, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"Stopped early at step {stop_step}" in proc.stdout, proc.stdout[-2000:]
  assert evaluations(workdir) == evaluations(straight)
  assert BestCheckpoint(workdir).step() == BestCheckpoint(straight).step() == best_step


def test_fine_tuning_starts_from_the_sources_best_parameters(stopped, tmp_path):
  from transformer.training.train import train_and_evaluate

  source, _ = stopped
  workdir = str(tmp_path / "tuned")
  config = tiny_config(num_train_steps=0, init_from=source, init_from_optimizer=True)
  config.best_checkpoint.metric = ""
  config.early_stopping.patience = 0
  config.optimizer.warmup_steps = 7  # this run's schedule, not the source's
  result = train_and_evaluate(config, workdir)
  assert result["step"] == 0
  best = BestCheckpoint(source)
  want = best.checkpointer.restore(best.step(), None)
  got = Checkpointer(os.path.join(workdir, "checkpoints"), None).restore(0, None)
  jax.tree.map(np.testing.assert_array_equal, got["params"], want["params"])
  # The Adam moments and their count are the source's; the schedule starts again.
  counts = [x for x in jax.tree.leaves(got["opt_state"]) if np.ndim(x) == 0]
  assert sorted(int(c) for c in counts) == [0, int(want["step"])]
  moments = lambda s: [x for x in jax.tree.leaves(s["opt_state"]) if np.ndim(x) > 0]
  jax.tree.map(np.testing.assert_array_equal, moments(got), moments(want))
  with open(os.path.join(source, "vocab", "spm.model"), "rb") as a, \
       open(os.path.join(workdir, "vocab", "spm.model"), "rb") as b:
    assert a.read() == b.read()


def test_fine_tuning_without_the_optimizer_starts_it_afresh(stopped, tmp_path):
  from transformer.sharding import make_mesh
  from transformer.training.finetune import check_source, initial_state
  from transformer.training.trainer import Trainer

  source, _ = stopped
  config = tiny_config(init_from=source)
  trainer = Trainer(config, make_mesh(config.mesh), validate(config, jax.device_count()))
  meta_vocab = BestCheckpoint(source).checkpointer.read_meta(BestCheckpoint(source).step())
  state = initial_state(trainer, config, meta_vocab, check_source(config, trainer.model_config))
  assert int(state.step) == 0
  fresh = trainer.init_state(config.seed)
  jax.tree.map(np.testing.assert_array_equal, state.opt_state, fresh.opt_state)
  adam = [s for s in state.opt_state if isinstance(s, optax.ScaleByAdamState)]
  assert adam and all(not np.any(np.asarray(m)) for m in jax.tree.leaves(adam[0].mu))


@pytest.mark.parametrize("field,value,named", [
  ("model.d_model", 64, "model.d_model"),
  ("data.vocab_size", 300, "data.vocab_size"),
])
def test_fine_tuning_refuses_another_model(stopped, field, value, named):
  from transformer.training.finetune import check_source

  source, _ = stopped
  changes = {field: value, "init_from": source}
  if field == "data.vocab_size":
    changes["model.vocab_size"] = value
  config = tiny_config(**changes)
  with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
    check_source(config, validate(config, 1))


def test_fine_tuning_from_a_missing_workdir_is_one_line_exit_2(tmp_path):
  proc = subprocess.run(
    [sys.executable, "-m", "transformer.main", "--config=configs/numbers.py:tiny",
     f"--workdir={tmp_path / 'new'}", f"--config.init_from={tmp_path / 'nowhere'}"],
    cwd=REPO, env=dict(os.environ, XLA_FLAGS=FAST_COMPILE), capture_output=True, text=True,
    timeout=600)
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert "init_from=" in last and "nowhere" in last
  assert not os.path.exists(tmp_path / "new" / "checkpoints")


@pytest.mark.parametrize("changes,named", [
  ({"best_checkpoint.metric": "eval/bleu"}, "best_checkpoint.metric"),  # not in the loop
  ({"best_checkpoint.metric": "", "early_stopping.patience": 3}, "early_stopping.patience"),
  ({"evals.valid_loss.split": "train"}, "evals.valid_loss.split"),
  ({"evals.valid_translation.metrics": "bleu,meteor"}, "evals.valid_translation.metrics"),
  ({"evals.test_translation.prefix": "eval"}, "evals.test_translation"),
])
def test_evaluation_settings_are_checked_before_work(changes, named):
  with pytest.raises(ConfigError, match=named.replace(".", r"\.")) as e:
    validate(tiny_config(**changes), 1)
  assert "\n" not in str(e.value)


def test_an_evaluator_of_a_new_type_runs_without_an_edit_of_the_loop(monkeypatch, tmp_path):
  """A new metric is a class in evaluators.TYPES and an entry in the config."""
  from transformer.training.train import train_and_evaluate

  seen = []

  class Counting:
    FIELDS = {"split": "validation", "prefix": "count", "every_steps": 0}

    def __init__(self, name, spec, context):
      self.spec = spec
      self.context = context

    @staticmethod
    def names(spec):
      return [f"{spec['prefix']}/sentences"]

    def run(self, params, step, tag=""):
      rows = sum(int((b["inputs"][:, 0] > 0).sum()) for b in
                 self.context.batches[self.spec.split])
      seen.append(step)
      return evaluators.Result({f"{tag}{self.spec.prefix}/sentences": float(rows)})

  monkeypatch.setitem(evaluators.TYPES, "count", Counting)
  config = tiny_config(num_train_steps=4)
  config.best_checkpoint.metric = ""
  config.early_stopping.patience = 0
  config.evals.count = {"type": "count", "split": "validation", "every_steps": 2}
  result = train_and_evaluate(config, str(tmp_path / "run"))
  assert seen == [2, 4]  # at step 2 in the loop, then in the final evaluation
  assert result["count/sentences"] == float(
    len(numbers_config_references(config)["validation"]))


def numbers_config_references(config):
  from transformer.data import input_pipeline

  return {"validation": input_pipeline.open_reader(config).read_pairs("validation")}


def test_the_domain_adaptation_corpus_holds_out_its_test_numbers(stopped, tmp_path):
  """experiments/domain_adaptation.py: ordinal phrases whose test numbers training never sees,
  and one config for both runs that fine-tuning accepts against the general model."""
  import re

  from experiments import domain_adaptation as da
  from transformer import workdir as workdir_lib
  from transformer.training.finetune import check_source

  def numbers(pairs):
    return {phrase for s, _ in pairs for phrase in re.split(r" and then ", s)}

  train, test = da.ordinal_pairs("train", 300), da.ordinal_pairs("test", 100)
  assert len(train) == 300 and len(test) == 100
  assert not numbers(train) & numbers(test)
  assert all(s.startswith("the ") and t.startswith("der ") for s, t in train)
  assert da.ordinal_pairs("test", 100) == test  # deterministic
  source, _ = stopped
  files = da.write_corpus(str(tmp_path / "corpus"), 50, 20)
  config = da.domain_config(workdir_lib.load(source), files, 10, 2)
  config.init_from = source
  check_source(config, validate(config, 1))
