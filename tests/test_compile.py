"""Compiling before the first step, the persistent compilation cache, and a profiled run.

Two training runs of the tiny config with three length buckets, in fresh processes that share
one compilation-cache directory: the first compiles every program and fills the cache, the
second loads them from it and is profiled. Together they show that the loop compiles nothing
after the start, that a restart loads the compiled programs, and that profiling changes no
result.
"""

import json
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import numbers as numbers_config
from tests.test_train import FAST_COMPILE, REPO, read_metrics
from transformer import compilation
from transformer import sharding as sharding_lib
from transformer.data.bucketing import TrainBatches
from transformer.data.packing import PackedBatches
from transformer.data.token_cache import TokenizedSplit
from transformer.training.trainer import Trainer, shape_key
from transformer.training.validate import validate

BUCKETS = [16, 32, 64]
# A training run in a child process that records, in order, every XLA compile ('compile'),
# persistent-cache hit ('hit'), training step ('step') and the end of the loop ('end'), and
# writes them to the file named by $EVENTS when it exits.
CHILD = """
import atexit, json, os, sys
import jax
from transformer import compilation, main
from transformer.training import train, trainer

events = []
jax.monitoring.register_event_duration_secs_listener(
  lambda e, d, **k: events.append("compile") if e == compilation.COMPILE_EVENT else None)
jax.monitoring.register_event_listener(
  lambda e, **k: events.append("hit") if e == compilation.CACHE_HIT_EVENT else None)

def marked(name, fn):
  def call(*args, **kwargs):
    events.append(name)
    return fn(*args, **kwargs)
  return call

trainer.Trainer.train_step = marked("step", trainer.Trainer.train_step)
train.evaluation_params = marked("end", train.evaluation_params)  # right after the loop
atexit.register(lambda: open(os.environ["EVENTS"], "w").write(json.dumps(events)))
sys.argv = ["main", *sys.argv[1:]]
main.run()
"""
CONFIG = """
from configs import numbers

def get_config(arg=None):
  config = numbers.get_config("tiny")
  config.data.bucket_lengths = %r
  # What is checked happens before and in the loop: no translation, no averaging after it.
  del config.evals["valid_translation"], config.evals["test_translation"]
  config.average_last_checkpoints = 0
  return config
"""


def train_child(tmp_path, name, *overrides):
  config = tmp_path / "config.py"
  config.write_text(CONFIG % BUCKETS)
  events = tmp_path / f"{name}.json"
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE, EVENTS=str(events),
             # Store every program, however fast it compiled (the tiny ones take well under 1 s).
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  proc = subprocess.run(
    [sys.executable, "-c", CHILD, f"--config={config}", f"--workdir={tmp_path / name}",
     f"--config.compilation_cache_dir={tmp_path / 'jax_cache'}", *overrides],
    cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  (tmp_path / f"{name}.log").write_text(proc.stderr)
  assert proc.returncode == 0, f"training run {name} failed:\n{proc.stderr[-3000:]}"
  return json.loads(events.read_text()), proc.stderr


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("compile")
  first = train_child(tmp, "first")
  files = sorted(os.listdir(tmp / "jax_cache"))
  second = train_child(tmp, "second", "--config.profile_steps=2:4")
  return tmp, first, second, files


def compiled_lines(log, what):
  return [ln for ln in log.splitlines() if f"Compiled the {what} step" in ln]


@pytest.mark.slow
def test_the_training_loop_compiles_nothing(two_runs):
  _, first, second, _ = two_runs
  for events, log in (first, second):
    # Several training batch shapes, all compiled before the first step.
    assert len(compiled_lines(log, "training")) >= 3, log[-3000:]
    assert compiled_lines(log, "evaluation"), log[-3000:]
    loop = events[events.index("step"):events.index("end")]
    assert loop.count("step") == 6
    assert "compile" not in loop, f"{loop.count('compile')} compiles inside the training loop"


@pytest.mark.slow
def test_a_restart_loads_the_compiled_programs_from_the_cache(two_runs):
  tmp, (events1, log1), (events2, log2), files = two_runs
  assert files, "the first run wrote nothing to the compilation cache"
  # (A program may still hit the cache within the first run: the same one jitted twice.)
  assert "0 loaded from the persistent compilation cache" in log1
  # Every program compiled ahead of time came from the cache in the second run.
  programs = compiled_lines(log2, "training") + compiled_lines(log2, "evaluation")
  assert programs and all("loaded from the persistent compilation cache" in ln
                          for ln in programs), "\n".join(programs)
  assert events2.count("hit") >= len(programs)


@pytest.mark.slow
def test_profiling_writes_a_trace_and_changes_no_result(two_runs):
  tmp, _, (_, log), _ = two_runs
  files = [os.path.join(d, f) for d, _, fs in os.walk(tmp / "second" / "profile") for f in fs]
  assert any(f.endswith(".xplane.pb") for f in files), files
  assert any(f.endswith("perfetto_trace.json.gz") for f in files), files
  assert "Profiling steps 2 to 4" in log and "Profile written to" in log
  assert not (tmp / "first" / "profile").exists()
  first, second = read_metrics(str(tmp / "first")), read_metrics(str(tmp / "second"))
  drop = ("train/steps_per_s", "train/tokens_per_s", "train/host_fraction", "startup/seconds",
          "startup/compile_s")
  same = lambda recs: [{k: v for k, v in r.items() if k not in drop} for r in recs]
  assert same(first) == same(second)
  assert all(0 < r["train/real_token_fraction"] <= 1 for r in first if "train/loss" in r)
  assert not any("train/mfu" in r for r in first)  # a CPU: no known peak, no MFU


def test_compile_counter_counts_compiles_and_not_cached_calls():
  f = jax.jit(lambda x: x * 3 + 1)
  x, y = jnp.arange(5.0), jnp.ones(5)
  with compilation.CompileCounter() as counter:
    f(x)
    f(y)  # same shape: no compile
  assert counter.compiles == 1 and counter.cache_hits == 0
  f(jnp.ones(6))  # closed: not counted
  assert counter.compiles == 1


def test_an_unusable_cache_directory_is_a_warning(tmp_path, caplog):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  before = jax.config.jax_compilation_cache_dir  # set by an earlier test of this process or not
  try:
    with caplog.at_level(logging.WARNING):
      assert compilation.use_persistent_cache(str(blocker / "cache")) is None
    assert "compilation_cache_dir" in caplog.text and str(blocker) in caplog.text
    assert jax.config.jax_compilation_cache_dir is None  # compiling goes on without a cache
    assert compilation.use_persistent_cache("") is None  # '' turns it off
  finally:
    compilation.use_persistent_cache(before or "")


def test_default_cache_directory_is_local_beside_the_token_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("TRANSFORMER_CACHE", str(tmp_path))
  assert compilation.default_cache_dir() == str(tmp_path / "jax_compilation_cache")


@pytest.mark.parametrize("packing", [False, True])
def test_batch_specs_match_the_batches_the_loop_sees(packing):
  """The programs are looked up by `shape_key`: the spec of every `shapes()` entry must give the
  key of the real batches of that shape, or the loop would compile them again."""
  config = numbers_config.get_config("tiny")
  config.data.bucket_lengths = BUCKETS
  rng = np.random.default_rng(0)
  lengths = rng.integers(2, 60, size=(200, 2))
  split = TokenizedSplit.from_sequences([rng.integers(2, 50, n) for n in lengths[:, 0]],
                                        [rng.integers(2, 50, n) for n in lengths[:, 1]])
  batches = (PackedBatches if packing else TrainBatches)(split, config, batch_multiple=8)
  trainer = Trainer(config, sharding_lib.make_mesh(config.mesh), validate(config, 8))
  specs = {shape_key(trainer.batch_spec(shape)) for shape in batches.shapes()}
  seen = {shape_key(batches.batch(i)) for i in range(batches.steps_per_epoch)}
  assert seen == specs and len(specs) == (1 if packing else len(BUCKETS))


def test_executable_keys_follow_what_a_program_depends_on():
  x = jnp.ones((4, 8))
  key = compilation.executable_key("p", ("a", 1), [x])
  assert key == compilation.executable_key("p", ("a", 1), [jnp.zeros((4, 8))])  # values don't
  assert key != compilation.executable_key("p", ("a", 2), [x])
  assert key != compilation.executable_key("q", ("a", 1), [x])
  assert key != compilation.executable_key("p", ("a", 1), [jnp.ones((4, 9))])
  assert key != compilation.executable_key("p", ("a", 1), [x.astype(jnp.bfloat16)])


def test_kept_programs_load_in_a_new_process_with_the_same_outputs(tiny_trained, tmp_path):
  """A translation keeps its compiled search programs beside the persistent cache; the next
  process loads them instead of tracing and compiling, with the same outputs; a damaged kept
  program is a warning and compiled again."""
  from tests.test_train import run_main

  workdir = tiny_trained[0]
  cache = tmp_path / "jcc"
  source = tmp_path / "in.txt"
  source.write_text("three hundred and twelve\nseven\nforty thousand and one\n")

  def translate(i):
    out = tmp_path / f"out{i}.txt"
    proc = run_main("--mode=translate", f"--workdir={workdir}", f"--input={source}",
                    f"--output={out}", f"--config.compilation_cache_dir={cache}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out.read_text(), proc.stderr

  first, log = translate(0)
  kept = sorted((cache / compilation.EXECUTABLES_DIR).glob("*.pkl"))
  assert kept and "loaded the compiled translator program" not in log
  second, log = translate(1)
  assert second == first and "loaded the compiled translator program" in log
  for path in kept:
    path.write_bytes(b"damaged")
  third, log = translate(2)
  assert third == first and "cannot be loaded" in log


FALLBACK_SCRIPT = """
import os, pickle, sys
import jax, jax.numpy as jnp
from jax.experimental import serialize_executable
from transformer import compilation

cache, step = sys.argv[1], sys.argv[2]
compilation.use_persistent_cache(cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
f = jax.jit(lambda x, y: jnp.where(x > y, jnp.sin(x) @ y, 0.0).sum())
# Over every device, as the translator's programs are (a program on part of them is not kept).
every = jax.sharding.NamedSharding(jax.make_mesh((jax.device_count(),), ("d",)),
                                   jax.sharding.PartitionSpec())
args = (jax.device_put(jnp.ones((32, 32)), every), jax.device_put(jnp.full((32, 32), 0.5), every))
store = compilation.Executables(os.path.join(cache, compilation.EXECUTABLES_DIR))
if step == "seed":
  print(float(f(*args)))  # compiled, and written to the persistent cache
elif step == "plant":
  # Loaded from the persistent cache: with jaxlib 0.10 on CPU such an executable serializes
  # without its kernels. Kept under the store's key, as a damaged entry that still loads.
  program = f.lower(*args).compile()
  path = store._path(compilation.executable_key("t", 1, args))
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as fh:
    pickle.dump(serialize_executable.serialize(program), fh)
elif step == "part":
  # A program on one device of several is compiled but not kept.
  one = (jnp.ones((8, 8)), jnp.ones((8, 8)))
  if jax.device_count() > 1:
    store.run("one device", 1, f, one)
    assert not os.path.exists(store._path(compilation.executable_key("one device", 1, one)))
else:
  print(float(store.run("t", 1, f, args)))
"""


def test_a_kept_program_that_fails_to_run_is_compiled_again(tmp_path):
  cache = str(tmp_path / "jcc")
  outputs = []
  for step in ("seed", "plant", "run", "run", "part"):
    proc = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT, cache, step], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs.append((proc.stdout.strip(), proc.stderr))
  expect = outputs[0][0]
  assert outputs[2][0] == expect and outputs[3][0] == expect
  # The planted program either ran (a jaxlib that serializes it whole) or was replaced.
  if "failed to run" in outputs[2][1]:
    assert "failed to run" not in outputs[3][1]
