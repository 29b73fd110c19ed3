"""Gradient accumulation (`config.grad_accum_steps`): the same training as one pass over the
batch, every micro-batch spread over all devices, own dropout masks, exact resume after kill -9.
"""


import jax
import numpy as np
import pytest

from configs import numbers as numbers_config
from measuring import measure
from tests.test_sharding import make_trainer
from transformer import sharding as sharding_lib
from transformer.errors import ConfigError
from transformer.training.run_meta import check_meta, run_meta
from transformer.training.train_state import loss_sums, make_train_step, split_micro_batches
from transformer.training.validate import validate

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow

VOCAB = 256
SUM_KEYS = ("loss", "nll", "correct", "tokens", "source_tokens")


def config_for(k, mesh=(1, 1, 1), dropout=0.0):
  config = numbers_config.get_config("tiny")
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
  config.model.dropout_rate = dropout
  config.grad_accum_steps = k
  return config


def make_batches(rows, packed, steps=3, seed=0):
  """Random batches [rows, 12] / [rows, 10] with padding at the ends of a third of the rows and
  an all-zero row in the first; packed ones have 3 segments a row (padding is segment 0)."""
  rng = np.random.default_rng(seed)
  out = []
  for step in range(steps):
    b = measure.random_batch(rng, rows, 12, 10, VOCAB, segments=3 if packed else 0)
    for side, keep in (("inputs", 9), ("targets", 7)):
      for key in [k for k in b if k.startswith(side)]:
        b[key][::3, keep:] = 0
        if step == 0:
          b[key][-1] = 0
    out.append(b)
  return out


@pytest.fixture(scope="module")
def initial():
  """A host copy of the tiny model's seed-0 training state: every run below starts from it
  (the state does not depend on k or the mesh, and one init compiles once)."""
  return jax.device_get(make_trainer(config_for(1), 1).init_state(0))


def train(trainer, batches, start):
  """Parameters (NumPy) after a step on each batch from the host state `start`, and every
  metric."""
  state, rng, metrics = jax.device_put(start, trainer.state_shardings), jax.random.key(0), []
  for b in batches:
    state, m = trainer.train_step(state, sharding_lib.local_batch_to_global(b, trainer.mesh),
                                  rng)
    metrics.append(jax.device_get(m))
  return jax.tree.map(np.asarray, jax.device_get(state.params)), metrics


def assert_same_training(one, accumulated):
  """k > 1 trains as k = 1 up to float32 summation order: sums and the gradient norm to 1e-6
  relative (these catch a wrong normalisation, which Adam's update alone would hide), and the
  parameters after the steps to 1e-5 absolute. Adam divides each gradient entry by its own
  root mean square, and its momentum can cancel an entry's gradient from one step to the next:
  there, rounding noise moves a few entries by up to 3e-6 differently (5e-4 of the first
  step's learning rate, 5.6e-3); the rest agree to 1e-6."""
  (p1, m1), (pk, mk) = one, accumulated
  for a, b in zip(m1, mk, strict=True):
    assert set(a) == set(b)
    for key in SUM_KEYS:
      np.testing.assert_allclose(b[key], a[key], rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-6)
    np.testing.assert_allclose(b["param_norm"], a["param_norm"], rtol=1e-6)
    assert a["nonfinite"] == b["nonfinite"] == 0
  jax.tree.map(lambda x, y: np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5), p1, pk)
  assert m1[-1]["loss"] != m1[0]["loss"]  # training moved


# Each row layout once, each over a mesh (one device is the mesh (1, 1, 1) of the same code).
@pytest.mark.parametrize("devices,mesh,packed,rows,k", [
  (8, (2, 2, 2), True, 16, 4),
  # One all-zero row pads 24 rows to 25; micro-batches of 5 rows, uneven over 8 devices.
  (8, (8, 1, 1), False, 24, 5),
], ids=["data2-fsdp2-tensor2-packed", "data8-bucketed-rows-not-divisible"])
def test_accumulated_micro_batches_train_as_one_batch(devices, mesh, packed, rows, k, initial):
  batches = make_batches(rows, packed)
  one = train(make_trainer(config_for(1, mesh), devices), batches, initial)
  assert_same_training(one, train(make_trainer(config_for(k, mesh), devices), batches, initial))


def test_micro_batch_i_is_rows_i_mod_k_on_every_device():
  trainer = make_trainer(config_for(4, (2, 2, 2)), 8)
  split = jax.jit(split_micro_batches, static_argnums=1)
  for rows, k in ((16, 4), (12, 5)):
    batch = make_batches(rows, packed=True, steps=1)[0]
    with trainer.context():
      micro = split(sharding_lib.local_batch_to_global(batch, trainer.mesh), k)
    padded_rows = -(-rows // k) * k
    for key, x in micro.items():
      padded = np.zeros((padded_rows, *batch[key].shape[1:]), np.int32)
      padded[:rows] = batch[key]  # all-zero rows at the end
      np.testing.assert_array_equal(x, np.stack([padded[i::k] for i in range(k)]))
      if rows == 16:
        # Every device holds its part of all 4 micro-batches: 1 of their 4 rows (4 batch
        # shards), not whole micro-batches on some devices.
        assert {s.data.shape for s in x.addressable_shards} == {(4, 1, batch[key].shape[1])}


def test_dropout_masks_differ_per_micro_batch_and_runs_repeat(initial):
  """Two micro-batches of the same rows: the step's loss is the sum of the model's losses on
  them with keys fold_in(fold_in(seed key, step), i), i = 0, 1, which differ."""
  trainer = make_trainer(config_for(2, dropout=0.3), 1)
  rows = make_batches(4, packed=False, steps=1)[0]
  batch = {k: np.repeat(v, 2, axis=0) for k, v in rows.items()}  # rows 2j, 2j+1 alike
  params = initial.params
  step_key = jax.random.fold_in(jax.random.key(0), 0)

  @jax.jit
  def loss(key):
    logits = trainer.model.apply({"params": params}, rows["inputs"], rows["targets"], train=True,
                                 rngs={"dropout": key})
    return loss_sums(logits, rows["targets"], trainer.config.label_smoothing)["loss"]

  expected = [float(loss(jax.random.fold_in(step_key, i))) for i in range(2)]
  assert expected[0] != expected[1]
  runs = [train(trainer, [batch, batch], initial) for _ in range(2)]
  np.testing.assert_allclose(runs[0][1][0]["loss"], sum(expected), rtol=1e-6)
  jax.tree.map(np.testing.assert_array_equal, runs[0][0], runs[1][0])
  assert [m["loss"] for m in runs[0][1]] == [m["loss"] for m in runs[1][1]]


@pytest.mark.parametrize("value", [0, -2])
def test_grad_accum_steps_must_be_a_positive_integer(value):
  config = config_for(1)
  config.grad_accum_steps = value
  with pytest.raises(ConfigError, match="grad_accum_steps") as info:
    validate(config, 1)
  assert "\n" not in str(info.value)
  with pytest.raises(ValueError, match="grad_accum_steps"):
    make_train_step(None, None, 0.1, value)


def test_a_checkpoint_resumes_with_another_k():
  """k is not part of what a checkpoint must agree on: the state has the same tree for every k,
  and the checkpoint's metadata check accepts a run with another k."""
  one, three = config_for(1), config_for(3)
  shapes = lambda c: jax.tree.map(lambda a: (a.shape, a.dtype), make_trainer(c, 1).abstract_state)
  assert shapes(one) == shapes(three)
  meta = lambda c: run_meta(c, validate(c, 1), "sha")
  check_meta(meta(one))(meta(three), "ckpt")
  check_meta(meta(three))(meta(one), "ckpt")


def test_memory_falls_with_k_and_the_experiment_reports_it(tmp_path):
  """benchmarks/accum_memory.py on tiny models: XLA's temp bytes of the compiled step fall
  with k, and the report has both tables."""
  from benchmarks import accum_memory

  memory = accum_memory.memory_by_k(numbers_config.get_config("tiny"), 16, 32, [1, 4])
  assert memory[1]["micro_batch_rows"] == 4
  assert memory[1]["temp_memory_bytes"] < 0.5 * memory[0]["temp_memory_bytes"]
  timing = accum_memory.time_by_k(numbers_config.get_config("tiny"), [2], rounds=1,
                                  steps_per_round=2)
  assert len(timing[0]["losses"]) == 4  # the untimed round, then the timed one
  assert len(timing[0]["step_s"]) == 1 and timing[0]["micro_batch_rows"] == 4
  config = numbers_config.get_config("tiny")
  from measuring import report

  report.write(str(tmp_path / "r"), command="python -m x",
               **accum_memory.report_parts(config, config, memory, timing))
  text = (tmp_path / "r.md").read_text()
  assert "| 4 | 4 |" in text and "## Step time" in text and "python -m x" in text
