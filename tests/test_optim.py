"""Optimiser options: the learning-rate schedules against their formulas, AdamW against a NumPy
AdamW, the parameters' exponential moving average (its recurrence, skipped steps, shardings,
exact resume, its use by evaluation and inference), and which changes a checkpoint refuses."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ml_collections import config_dict

from configs import numbers as numbers_config
from tests.test_faults import one_error_line, tree_digest
from tests.test_sharding import make_trainer
from tests.test_train import TINY, read_metrics, run_main
from transformer import sharding as sharding_lib
from transformer.errors import CheckpointError, ConfigError
from transformer.schedules import learning_rate_schedule, paper_schedule
from transformer.training.checkpoint import Checkpointer
from transformer.training.run_meta import check_meta, run_meta
from transformer.training.train_state import (
  EmaTrainState,
  TrainState,
  decay_mask,
  make_optimizer,
  make_train_step,
)
from transformer.training.validate import validate

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow


def config_with(**optimizer):
  """The tiny numbers config on one device with these optimizer fields (values of any type)."""
  tree = numbers_config.get_config("tiny").to_dict()
  tree["mesh"]["data"] = 1
  tree["optimizer"].update(optimizer)
  return config_dict.ConfigDict(tree)


# ------------------------------------------------------------------------------- schedules


def numpy_rate(name, count, *, peak=0.0, warmup=0, init=0.0, end=0.0, total=0, d_model=0,
               scale=1.0):
  """The rate of the update after `count` updates, in float64, from the formulas of
  docs/training.md (step s = count + 1)."""
  s = count + 1.0
  if name == "paper":
    return scale * d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)
  if s < warmup:
    return init + (peak - init) * s / warmup
  if name == "inverse_sqrt":
    return peak * np.sqrt(warmup / s)
  if name == "constant":
    return peak
  progress = min(s - warmup, total - warmup) / (total - warmup)
  return end + (peak - end) * 0.5 * (1 + np.cos(np.pi * progress))


def counts_around(*points):
  """Update counts at and beside each point, and 0."""
  return sorted({max(c, 0) for p in points for c in (p - 2, p - 1, p, p + 1)} | {0})


@pytest.mark.parametrize("name,fields", [
  ("inverse_sqrt", dict(learning_rate=5e-4, warmup_steps=40, warmup_init_lr=1e-7)),
  ("inverse_sqrt", dict(learning_rate=1e-3, warmup_steps=1, warmup_init_lr=0.0)),
  ("cosine", dict(learning_rate=3e-3, warmup_steps=40, warmup_init_lr=0.0,
                  end_learning_rate=3e-5)),
  ("cosine", dict(learning_rate=3e-3, warmup_steps=0, end_learning_rate=0.0)),
  ("constant", dict(learning_rate=2e-3, warmup_steps=40, warmup_init_lr=1e-4)),
  ("constant", dict(learning_rate=2e-3, warmup_steps=0)),
])
def test_each_schedule_follows_its_formula(name, fields):
  config = config_with(schedule=name, **fields)
  config.num_train_steps = 200
  validate(config, 1)
  schedule = learning_rate_schedule(config)
  warmup = fields["warmup_steps"]
  counts = counts_around(warmup, 100, config.num_train_steps) + [5000]
  expected = [numpy_rate(name, c, peak=fields["learning_rate"], warmup=warmup,
                         init=fields.get("warmup_init_lr", 0.0),
                         end=fields.get("end_learning_rate", 0.0),
                         total=config.num_train_steps) for c in counts]
  # As the optimiser calls it (int32 counts, jitted) and as the metrics do (Python ints). Near
  # the cosine's end, 1 + cos(x) cancels in float32: an absolute 1e-7 of the peak there.
  atol = 1e-7 * fields["learning_rate"]
  jitted = jax.jit(schedule)(jnp.asarray(counts, jnp.int32))
  np.testing.assert_allclose(jitted, expected, rtol=2e-6, atol=atol)
  np.testing.assert_allclose([float(schedule(c)) for c in counts], expected, rtol=2e-6,
                             atol=atol)
  assert float(schedule(0)) > 0 or (warmup == 0 and name == "cosine")  # the first update moves
  if warmup:
    # The peak is reached at step warmup_steps, i.e. after warmup_steps - 1 updates.
    np.testing.assert_allclose(float(schedule(warmup - 1)), fields["learning_rate"], rtol=1e-6)


def test_the_paper_schedule_is_equation_3_as_before():
  """'paper' (the default) computes equation 3 exactly as it always has, in float32; it is
  'inverse_sqrt' with its peak at d_model^-0.5 * warmup^-0.5 and no initial rate."""
  config = config_with()
  config.optimizer.learning_rate_scale = 2.0
  assert config.optimizer.schedule == "paper"
  d, w = config.model.d_model, config.optimizer.warmup_steps
  counts = jnp.asarray(counts_around(w, 1000), jnp.int32)
  step = counts.astype(jnp.float32) + 1.0
  before = 2.0 * d**-0.5 * jnp.minimum(step**-0.5, step * w**-1.5)
  np.testing.assert_array_equal(learning_rate_schedule(config)(counts), before)
  np.testing.assert_array_equal(paper_schedule(d, w, 2.0)(counts), before)
  expected = [numpy_rate("paper", int(c), warmup=w, d_model=d, scale=2.0) for c in counts]
  np.testing.assert_allclose(before, expected, rtol=1e-6)
  as_inverse_sqrt = config_with(schedule="inverse_sqrt", learning_rate=2.0 / np.sqrt(d * w),
                                warmup_steps=w, warmup_init_lr=0.0)
  np.testing.assert_allclose(learning_rate_schedule(as_inverse_sqrt)(counts), before, rtol=1e-6)


def test_a_config_without_the_new_fields_trains_as_before():
  """A workdir's config.json from before these fields: the paper's schedule and plain Adam,
  the same state as before (no average), and it validates."""
  tree = config_with().to_dict()
  for name in ("schedule", "learning_rate", "warmup_init_lr", "end_learning_rate",
               "weight_decay", "ema_decay"):
    del tree["optimizer"][name]
  old = config_dict.ConfigDict(tree)
  validate(old, 1)
  counts = jnp.arange(30)
  np.testing.assert_array_equal(learning_rate_schedule(old)(counts),
                                learning_rate_schedule(config_with())(counts))
  trainer = make_trainer(old, 1)
  assert type(trainer.abstract_state) is TrainState
  params = jax.tree.map(jnp.zeros_like, trainer.abstract_state.params)
  adam = optax.adam(paper_schedule(32, 10), b1=0.9, b2=0.98, eps=1e-9)
  assert jax.tree.structure(trainer.abstract_state.opt_state) == jax.tree.structure(
    adam.init(params))


# ------------------------------------------------------------------------------------ AdamW

SHAPES = {"dense": {"kernel": (3, 4), "bias": (4,)}, "norm": {"scale": (4,), "bias": (4,)},
          # A LayerNorm scale under nn.scan over 2 layers: 2-D, and still not decayed.
          "layers": {"norm": {"scale": (2, 4)}, "out": (2, 4, 3)},
          "embed": {"embedding": (5, 4)}}
DECAYED = {"dense": {"kernel": True, "bias": False}, "norm": {"scale": False, "bias": False},
           "layers": {"norm": {"scale": False}, "out": True}, "embed": {"embedding": True}}


def test_adamw_matches_a_numpy_adamw():
  config = config_with(schedule="constant", learning_rate=0.01, warmup_steps=2,
                       weight_decay=0.1)
  opt = config.optimizer
  rng = np.random.default_rng(0)
  is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
  params = jax.tree.map(lambda s: rng.normal(size=s), SHAPES, is_leaf=is_shape)
  grads = [jax.tree.map(lambda s: rng.normal(size=s), SHAPES, is_leaf=is_shape)
           for _ in range(4)]
  assert decay_mask(params) == DECAYED

  tx = make_optimizer(config, learning_rate_schedule(config))
  p32 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  state = tx.init(p32)
  for g in grads:
    updates, state = jax.jit(tx.update)(jax.tree.map(jnp.float32, g), state, p32)
    p32 = optax.apply_updates(p32, updates)

  def numpy_adamw(p, decayed, *gs):
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(gs, start=1):
      m = opt.b1 * m + (1 - opt.b1) * g
      v = opt.b2 * v + (1 - opt.b2) * g * g
      step = (m / (1 - opt.b1**t)) / (np.sqrt(v / (1 - opt.b2**t)) + opt.eps)
      rate = numpy_rate("constant", t - 1, peak=0.01, warmup=2)
      p = p - rate * (step + (opt.weight_decay * p if decayed else 0.0))
    return p

  expected = jax.tree.map(numpy_adamw, params, DECAYED, *grads)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6), p32,
               expected)


def test_weight_decay_0_is_the_papers_adam_unchanged():
  config = config_with()
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s), jnp.float32), SHAPES,
                        is_leaf=lambda x: isinstance(x, tuple))
  ours = make_optimizer(config, learning_rate_schedule(config))
  adam = optax.adam(paper_schedule(32, 10), b1=0.9, b2=0.98, eps=1e-9)
  a, b = ours.init(params), adam.init(params)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for _ in range(3):
    g = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    (ua, a), (ub, b) = ours.update(g, a, params), adam.update(g, b, params)
    jax.tree.map(np.testing.assert_array_equal, ua, ub)


def test_the_decay_mask_of_the_models_keeps_biases_and_layer_norm_scales():
  """On the Transformer (unrolled and scanned layers) and the LSTM: every parameter named
  'bias' or 'scale' is left out, every other one decayed; scanned scales are 2-D."""
  for fields in ({}, {"scan_layers": True}, {"kind": "lstm"}):
    config = config_with()
    config.model.update(fields)
    params = make_trainer(config, 1).abstract_state.params
    mask = decay_mask(params)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    names = {jax.tree_util.keystr(path): (path[-1].key, leaf.ndim) for path, leaf in flat}
    decayed = {jax.tree_util.keystr(path): m
               for path, m in jax.tree_util.tree_flatten_with_path(mask)[0]}
    assert decayed == {k: name not in ("bias", "scale") for k, (name, _) in names.items()}
    assert any(decayed.values()) and not all(decayed.values())
    if fields.get("scan_layers"):
      assert any(name == "scale" and ndim == 2 for name, ndim in names.values())


# -------------------------------------------------------------------------------------- EMA


def random_batch(rng, rows=8, source=12, target=10):
  """Random tokens with padding at the ends of every other row."""
  batch = {"inputs": rng.integers(3, 256, (rows, source)),
           "targets": rng.integers(3, 256, (rows, target))}
  for x in batch.values():
    x[::2, -3:] = 0
  return {k: v.astype(np.int32) for k, v in batch.items()}


def host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def test_the_average_follows_its_recurrence():
  decay = 0.8
  trainer = make_trainer(config_with(ema_decay=decay), 1)
  state = trainer.init_state(0)
  assert isinstance(state, EmaTrainState)
  start = host(state.params)
  jax.tree.map(np.testing.assert_array_equal, host(state.ema_params), start)
  expected = jax.tree.map(lambda p: p.astype(np.float64), start)
  rng = np.random.default_rng(0)
  for _ in range(4):
    batch = sharding_lib.local_batch_to_global(random_batch(rng), trainer.mesh)
    state, _ = trainer.train_step(state, batch, jax.random.key(0))
    params = host(state.params)
    expected = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, expected, params)
  ema = host(state.ema_params)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), ema,
               expected)
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(ema))
  # It lags behind the parameters, which moved from where both started.
  moved = lambda a, b: max(float(np.abs(x - y).max())  # noqa: E731
                           for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
  assert 0 < moved(ema, start) < moved(params, start)


def test_a_nonfinite_step_leaves_the_average_unchanged():
  trainer = make_trainer(config_with(ema_decay=0.9), 1)
  step = jax.jit(make_train_step(trainer.model, trainer.tx, 0.1, ema_decay=0.9),
                 donate_argnums=0)
  rng = np.random.default_rng(0)
  batch = {k: jnp.asarray(v) for k, v in random_batch(rng).items()}
  with trainer.context():
    state, _ = step(trainer.init_state(0), batch, jax.random.key(1))
    embedding = state.params["embed"]["embedding"]
    poisoned = state.replace(params={**state.params, "embed": {
      "embedding": embedding.at[0, 0].set(np.inf)}})
    before = host(poisoned)
    after, metrics = step(poisoned, batch, jax.random.key(1))
    assert float(metrics["nonfinite"]) == 1.0
    jax.tree.map(np.testing.assert_array_equal, before.ema_params, host(after.ema_params))
    jax.tree.map(np.testing.assert_array_equal, before.params, host(after.params))
    # A finite step after it moves the average again.
    healed = after.replace(params={**after.params, "embed": {"embedding": embedding}})
    moved, _ = step(healed, batch, jax.random.key(1))
    assert any(not np.array_equal(x, y) for x, y in zip(
      jax.tree.leaves(before.ema_params), jax.tree.leaves(host(moved.ema_params)), strict=True))


def test_the_average_is_sharded_like_the_parameters():
  config = config_with(ema_decay=0.9)
  config.mesh.data, config.mesh.fsdp = 2, 4
  trainer = make_trainer(config, 8)
  assert trainer.state_shardings.ema_params == trainer.state_shardings.params
  state = trainer.init_state(0)
  for p, e in zip(jax.tree.leaves(state.params), jax.tree.leaves(state.ema_params),
                  strict=True):
    assert e.sharding == p.sharding
  embedding = state.ema_params["embed"]["embedding"]
  assert embedding.sharding.shard_shape(embedding.shape)[1] == embedding.shape[1] // 4


def test_resume_with_the_average_is_bitwise_exact(tmp_path):
  """4 steps in one go, and 2 steps, a checkpoint, a fresh Trainer restoring it, 2 steps: the
  same state to the bit (parameters, Adam's moments, the average), with cosine, AdamW and
  dropout."""
  config = config_with(schedule="cosine", learning_rate=3e-3, warmup_steps=1,
                       weight_decay=0.01, ema_decay=0.9)
  config.model.dropout_rate = 0.1
  rng = np.random.default_rng(0)
  batches = [random_batch(rng) for _ in range(4)]
  meta = run_meta(config, validate(config, 1), "sha")

  def steps(trainer, state, batches):
    for b in batches:
      state, _ = trainer.train_step(state, sharding_lib.local_batch_to_global(b, trainer.mesh),
                                    jax.random.key(3))
    return state

  first = make_trainer(config, 1)
  straight = host(steps(first, first.init_state(0), batches))
  ckpt = Checkpointer(str(tmp_path), 2)
  ckpt.save(2, steps(first, first.init_state(0), batches[:2]), meta)
  ckpt.wait()
  second = make_trainer(config, 1)
  restored, step = ckpt.restore_latest(second.abstract_state, check_meta(meta))
  ckpt.close()
  assert step == 2 and isinstance(restored, EmaTrainState)
  resumed = host(steps(second, restored, batches[2:]))
  assert int(resumed.step) == 4
  jax.tree.map(np.testing.assert_array_equal, straight, resumed)
  assert not np.array_equal(straight.ema_params["embed"]["embedding"],
                            straight.params["embed"]["embedding"])


# ------------------------------------------------------ what a checkpoint refuses, and allows


@pytest.mark.parametrize("field", ["ema_decay", "weight_decay", "grad_clip_norm"])
def test_turning_a_part_of_the_state_on_or_off_is_refused_its_value_may_change(field):
  meta = lambda c: run_meta(c, validate(c, 1), "sha")  # noqa: E731
  off, on, other = config_with(), config_with(**{field: 0.5}), config_with(**{field: 0.25})
  check_meta(meta(on))(meta(other), "ckpt")
  check_meta(meta(off))(meta(off), "ckpt")
  for saved, wanted in ((on, off), (off, on)):
    with pytest.raises(CheckpointError, match=f"optimizer.{field}=") as e:
      check_meta(meta(wanted))(meta(saved), "ckpt")
    assert "\n" not in str(e.value)


def test_metadata_written_before_the_new_fields_is_read_as_without_them():
  meta = run_meta(config_with(), validate(config_with(), 1), "sha")
  for name in ("weight_decay", "ema_decay"):
    del meta["config"]["optimizer"][name]
  ema = config_with(ema_decay=0.5)
  check_meta(run_meta(config_with(), validate(config_with(), 1), "sha"))(meta, "ckpt")
  with pytest.raises(CheckpointError, match="optimizer.ema_decay="):
    check_meta(run_meta(ema, validate(ema, 1), "sha"))(meta, "ckpt")


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("field,good,bad", [
  ("optimizer.schedule", ["paper", "inverse_sqrt", "cosine", "constant"],
   ["Paper", "linear", "", None, 1]),
  ("optimizer.learning_rate", [1e-4, 1, 0.5], [0, -1e-3, np.nan, np.inf, "1e-3", True]),
  ("optimizer.warmup_init_lr", [0, 1e-7], [-1e-7, np.nan, np.inf, "0"]),
  ("optimizer.end_learning_rate", [0, 1e-5], [-1e-5, np.nan, None]),
  ("optimizer.weight_decay", [0, 0.01, 1], [-0.1, np.nan, np.inf, "0.01", False]),
  ("optimizer.ema_decay", [0, 0.9, 0.9999], [1, 1.0, -0.1, np.nan, "0.99", True]),
  ("optimizer.warmup_steps", [1, 4000], [-1, 1.5, True, None]),
])
def test_optimizer_fields(field, good, bad):
  name = field.split(".")[1]
  # A warm-up shorter than the tiny run of 6 steps, as 'cosine' needs.
  fields = lambda value: {"warmup_steps": 2, name: value}  # noqa: E731
  for value in good:
    validate(config_with(**fields(value)), 1)
  for value in bad:
    with pytest.raises(ConfigError, match=f"^{field}=") as e:
      validate(config_with(**fields(value)), 1)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fields,message", [
  (dict(schedule="paper", warmup_steps=0), "^optimizer.warmup_steps=0: .*'paper'"),
  (dict(schedule="inverse_sqrt", warmup_steps=0), "^optimizer.warmup_steps=0: .*'inverse_sqrt'"),
  (dict(schedule="cosine", warmup_steps=6), "^optimizer.warmup_steps=6: .*num_train_steps=6"),
  (dict(schedule="cosine", warmup_steps=2, end_learning_rate=1.0),
   "^optimizer.end_learning_rate=1.0: .*optimizer.learning_rate=0.0007"),
])
def test_what_a_schedule_needs_is_one_line_naming_the_field(fields, message):
  with pytest.raises(ConfigError, match=message) as e:
    validate(config_with(**fields), 1)
  assert "\n" not in str(e.value)


def test_warmup_0_is_no_warmup_for_cosine_and_constant_and_a_peak_is_required():
  for name in ("cosine", "constant"):
    validate(config_with(schedule=name, warmup_steps=0), 1)
  tree = config_with(schedule="constant").to_dict()
  del tree["optimizer"]["learning_rate"]
  with pytest.raises(ConfigError, match="^optimizer.learning_rate: missing"):
    validate(config_dict.ConfigDict(tree), 1)


# ------------------------------------------------------------- end to end: the CLI with EMA

# inverse_sqrt (independent of num_train_steps, so a run may stop at 3 and go on to 6), AdamW
# and the average; checkpoints at steps 3 and 6, evaluation at step 3.
EMA_RUN = [*TINY, "--config.optimizer.schedule=inverse_sqrt",
           "--config.optimizer.learning_rate=3e-3", "--config.optimizer.warmup_steps=3",
           "--config.optimizer.weight_decay=0.01", "--config.optimizer.ema_decay=0.8"]


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("ema") / "w")
  proc = run_main(*EMA_RUN, f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


def saved_states(workdir):
  """{step: the checkpoint's state as a tree of NumPy arrays} (restored without a target)."""
  import orbax.checkpoint as ocp

  with ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                             item_names=("state", "meta")) as mgr:
    return {step: host(mgr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore()))["state"]) for step in mgr.all_steps()}


def test_the_run_logs_its_schedule_and_checkpoints_the_average(ema_run):
  records = read_metrics(ema_run)
  logged = {r["step"]: r["train/learning_rate"] for r in records if "train/learning_rate" in r}
  assert sorted(logged) == [2, 4, 6]
  for step, rate in logged.items():
    np.testing.assert_allclose(rate, numpy_rate("inverse_sqrt", step - 1, peak=3e-3, warmup=3),
                               rtol=1e-6)
  states = saved_states(ema_run)
  assert sorted(states) == [3, 6]
  for state in states.values():
    assert set(state) >= {"params", "ema_params", "opt_state"}
    jax.tree.map(lambda p, e: np.testing.assert_equal(p.shape, e.shape), state["params"],
                 state["ema_params"])
    assert not np.array_equal(state["params"]["embed"]["embedding"],
                              state["ema_params"]["embed"]["embedding"])


def test_evaluation_and_inference_use_the_average(ema_run):
  from transformer import infer
  from transformer import workdir as workdir_lib
  from transformer.data import bucketing, input_pipeline
  from transformer.training.evaluators import evaluate_loss as evaluate

  config = workdir_lib.load(ema_run)
  states = saved_states(ema_run)
  newest = infer.restore(config, ema_run, average=1)
  assert newest.label == "step 6 (EMA)"
  jax.tree.map(np.testing.assert_array_equal, host(newest.params), states[6]["ema_params"])
  at_3 = infer.restore(config, ema_run, checkpoint="3")
  jax.tree.map(np.testing.assert_array_equal, host(at_3.params), states[3]["ema_params"])
  mean = infer.restore(config, ema_run, average=2)
  jax.tree.map(lambda x, a, b: np.testing.assert_allclose(x, (a + b) / 2, rtol=1e-6),
               host(mean.params), states[3]["ema_params"], states[6]["ema_params"])

  # The evaluation at step 3 of training scored the average, not the parameters.
  evals, _ = input_pipeline.evaluation_data(
    config, input_pipeline.open_reader(config), at_3.tokenizer,
    sharding_lib.data_parallel_size(at_3.layout.mesh),
    buckets=bucketing.workdir_buckets(config, ema_run))
  logged = next(r["eval/loss"] for r in read_metrics(ema_run)
                if r["step"] == 3 and "eval/loss" in r)
  params = jax.device_put(states[3]["params"], at_3.layout.param_shardings)
  of_average = evaluate(at_3.layout, at_3.params, evals["validation"], "eval")["eval/loss"]
  of_params = evaluate(at_3.layout, params, evals["validation"], "eval")["eval/loss"]
  np.testing.assert_allclose(logged, of_average, rtol=1e-5)
  assert abs(of_params - of_average) > 100 * abs(logged - of_average)


def test_turning_the_average_off_on_resume_is_one_line_and_touches_nothing(ema_run, tmp_path):
  workdir = str(tmp_path / "w")
  shutil.copytree(ema_run, workdir)
  before = tree_digest(workdir)
  proc = run_main(*EMA_RUN, f"--workdir={workdir}", "--config.optimizer.ema_decay=0",
                  "--config.num_train_steps=9")
  assert proc.returncode == 2, proc.stderr[-3000:]
  line = one_error_line(proc.stderr)
  assert "optimizer.ema_decay=0.8 (on)" in line and "checkpoints" in line
  assert tree_digest(workdir) == before
