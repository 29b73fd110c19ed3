"""Packed training batches: the plan, the batch layout, and the model on packed rows.

The central check: a packed batch gives every example the same loss and the same gradient as
the example alone in an unpacked batch (float32, `xla` and `chunked` attention).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import numbers as numbers_config
from transformer.data import packing
from transformer.data.token_cache import TokenizedSplit
from transformer.errors import ConfigError
from transformer.nn.model import ModelConfig, Transformer, shift_right
from transformer.training.train_state import cross_entropy
from transformer.training.validate import validate


def synthetic(n=300, seed=0, longest=30):
  rng = np.random.default_rng(seed)
  src, tgt = [], []
  for i in range(n):
    ls, lt = rng.integers(1, longest, size=2)
    src.append(np.r_[rng.integers(2, 50, size=ls - 1), 1].astype(np.int32))
    tgt.append(np.r_[rng.integers(2, 50, size=lt - 1) + 0 * i, 1].astype(np.int32))
  return src, tgt


def packed_config(source_len=32, target_len=24, tokens=128, **data):
  config = numbers_config.get_config("tiny")
  config.data.update(packing=True, packed_source_len=source_len, packed_target_len=target_len,
                     tokens_per_batch=tokens, **data)
  return config


def packed(src, tgt, config, **kw):
  return packing.PackedBatches(TokenizedSplit.from_sequences(src, tgt), config, **kw)


def unpack(batch, row, segment, side):
  """The ids of one segment of one row, and its positions."""
  where = batch[f"{side}_segment_ids"][row] == segment
  return batch[side][row][where], batch[f"{side}_position"][row][where]


def test_batches_hold_every_example_once_per_epoch_with_segments_and_positions():
  src, tgt = synthetic()
  config = packed_config()
  pb = packed(src, tgt, config)
  kept = [i for i in range(len(src)) if len(src[i]) <= 32 and len(tgt[i]) <= 24]
  assert pb.num_examples == len(kept) and pb.num_dropped == len(src) - len(kept)
  rows = 128 // 32
  assert pb.shapes() == [(rows, 32, 24)]
  seen = []
  for step in range(pb.steps_per_epoch):
    batch = pb.batch(step)
    assert {k: v.shape for k, v in batch.items()} == {
      "inputs": (rows, 32), "inputs_segment_ids": (rows, 32), "inputs_position": (rows, 32),
      "targets": (rows, 24), "targets_segment_ids": (rows, 24), "targets_position": (rows, 24)}
    assert all(v.dtype == np.int32 for v in batch.values())
    examples, row = pb.placements(step)
    for r in range(rows):
      mine = examples[row == r]
      for k, e in enumerate(mine.tolist(), start=1):  # segments in placement order
        for side, ref in (("inputs", src[e]), ("targets", tgt[e])):
          ids, pos = unpack(batch, r, k, side)
          np.testing.assert_array_equal(ids, ref)
          np.testing.assert_array_equal(pos, np.arange(len(ref)))
      for side in ("inputs", "targets"):  # padding: id, segment and position 0
        pad = batch[f"{side}_segment_ids"][r] == 0
        assert pad.sum() == batch[side].shape[1] - sum(
          len((src if side == "inputs" else tgt)[e]) for e in mine)
        assert not batch[side][r][pad].any() and not batch[f"{side}_position"][r][pad].any()
    seen.extend(examples.tolist())
  assert sorted(seen) == kept  # epoch 0: every kept example exactly once
  assert pb.real_token_fraction() > 0.6  # items up to a whole row: no tight fit here


def test_plan_is_a_pure_function_of_seed_and_step_and_not_of_the_devices():
  src, tgt = synthetic(200)
  config = packed_config()
  a = packed(src, tgt, config)
  b = packed(src, tgt, config)
  steps = list(range(3 * a.steps_per_epoch + 2))
  got = {s: b.batch(s) for s in reversed(steps)}  # another access order, as on a resume
  for s in steps:
    for k, v in a.batch(s).items():
      np.testing.assert_array_equal(v, got[s][k])
  # Later epochs: their own order, as many steps, nearly every example.
  e1 = np.concatenate([a.placements(a.steps_per_epoch + s)[0] for s in range(a.steps_per_epoch)])
  e0 = np.concatenate([a.placements(s)[0] for s in range(a.steps_per_epoch)])
  assert (e0[: len(e1)] != e1[: len(e0)]).any() and len(np.unique(e1)) > 0.9 * a.num_examples
  # 8 devices, 2 processes: zero rows added after the same packed rows.
  eight = packed(src, tgt, config, batch_multiple=8)
  halves = [packed(src, tgt, config, batch_multiple=8, process_index=p, process_count=2)
            for p in range(2)]
  for s in range(a.steps_per_epoch + 2):
    one, full = a.batch(s), eight.batch(s)
    for k, v in one.items():
      assert full[k].shape[0] == 8
      np.testing.assert_array_equal(full[k][: len(v)], v)
      assert not full[k][len(v):].any()
      np.testing.assert_array_equal(np.concatenate([h.batch(s)[k] for h in halves]), full[k])
  config.seed = 5
  other = packed(src, tgt, config)
  assert any((other.batch(s)["inputs"] != a.batch(s)["inputs"]).any() for s in range(3))


def test_packing_fills_rows_and_keeps_the_data_layer_contract():
  rng = np.random.default_rng(1)
  src, tgt = synthetic(2000, longest=20)
  pb = packed(src, tgt, packed_config(64, 64, tokens=64 * 16))
  # Source and target lengths drawn independently: each row's longer side fills, the other
  # falls short a little (real corpora, with correlated lengths, fill better).
  assert pb.real_token_fraction() > 0.9
  # first_fit_decreasing: longest first, the first row where both sides fit.
  s, t = rng.integers(1, 9, 50), rng.integers(1, 9, 50)
  row = packing.first_fit_decreasing(s, t, 6, 12, 10)
  for r in range(6):
    assert s[row == r].sum() <= 12 and t[row == r].sum() <= 10
  np.testing.assert_array_equal(packing.first_fit_decreasing(np.array([5, 9, 4]),
                                                             np.array([1, 1, 1]), 2, 10, 10),
                                [1, 0, 1])


def test_an_epoch_that_wraps_never_holds_an_example_twice_in_a_step():
  # Fewer examples than one step holds: later epochs go round the permutation again.
  s, t = np.array([3, 4, 5, 2, 6]), np.array([2, 2, 3, 4, 5])
  p0 = packing.plan_epoch(np.arange(5), s, t, 4, 8, 8)
  assert len(p0.bounds) == 2 and sorted(p0.example.tolist()) == list(range(5))
  p1 = packing.plan_epoch(np.array([2, 0, 4, 3, 1]), s, t, 2, 8, 8, steps=4)
  assert len(p1.bounds) == 5
  for i in range(4):
    step = p1.example[p1.bounds[i]:p1.bounds[i + 1]].tolist()
    assert step and len(set(step)) == len(step)


def test_shift_right_restarts_in_every_segment():
  targets = jnp.array([[5, 6, 1, 7, 1, 8, 9, 1, 0, 0]])
  segments = jnp.array([[1, 1, 1, 2, 2, 3, 3, 3, 0, 0]])
  np.testing.assert_array_equal(shift_right(targets, segments),
                                [[0, 5, 6, 0, 7, 0, 8, 9, 0, 0]])
  np.testing.assert_array_equal(shift_right(targets), [[0, 5, 6, 1, 7, 1, 8, 9, 1, 0]])


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_packed_losses_and_gradients_equal_unpacked(implementation):
  """Per example: the loss and its gradient from a packed row equal those of the example alone
  (float32); several segments per row, chunks that straddle segment boundaries."""
  src, tgt = synthetic(12, seed=3, longest=12)
  pb = packed(src, tgt, packed_config(24, 20, tokens=72))
  examples, row = pb.placements(0)
  batch = pb.batch(0)
  assert len(examples) > batch["inputs"].shape[0]  # some rows hold several examples
  segment = np.array([(row[:j] == row[j]).sum() + 1 for j in range(len(row))])
  length = 12
  ui = np.stack([np.pad(src[e], (0, length - len(src[e]))) for e in examples])
  ut = np.stack([np.pad(tgt[e], (0, length - len(tgt[e]))) for e in examples])

  mc = ModelConfig(vocab_size=50, num_layers=1, d_model=16, d_ff=32, num_heads=2,
                   dropout_rate=0.0, max_len=32, dtype="float32", attention=implementation,
                   attention_chunk_size=8, positional="learned")
  model = Transformer(mc)
  params = jax.jit(model.init)(jax.random.key(0), ui[:1], ut[:1])["params"]
  # Learned positions at random, so that a wrong position cannot hide among similar ones.
  params["embed"]["positions"] = jax.random.normal(jax.random.key(1), (32, 16))
  seg_of = jnp.asarray(segment)
  row_of = jnp.asarray(row)

  def unpacked(p):
    logits = model.apply({"params": p}, ui, ut)
    return (cross_entropy(logits, ut, 0.1)[0] * (ut > 0)).sum(-1)  # [examples]

  def packed_losses(p):
    logits = model.apply({"params": p}, batch["inputs"], batch["targets"],
                         **packing.packing_kwargs(batch))
    loss = cross_entropy(logits, batch["targets"], 0.1)[0] * (batch["targets"] > 0)
    mine = batch["targets_segment_ids"][row_of] == seg_of[:, None]  # [examples, t]
    return (loss[row_of] * mine).sum(-1)

  def per_example(f):
    losses, vjp = jax.vjp(f, params)
    grads = jax.vmap(vjp)(jnp.eye(len(examples)))[0]
    return losses, grads

  # One compiled program for both layouts.
  (loss_a, grad_a), (loss_b, grad_b) = jax.jit(
    lambda: (per_example(unpacked), per_example(packed_losses)))()
  np.testing.assert_allclose(loss_b, loss_a, rtol=1e-5, atol=1e-5)
  for ga, gb in zip(jax.tree.leaves(grad_a), jax.tree.leaves(grad_b), strict=True):
    np.testing.assert_allclose(gb, ga, rtol=1e-4, atol=1e-5)


def test_validation_of_the_packing_fields():
  config = packed_config()
  validate(config, 1)
  for field, value, match in (("packing", 1, "data.packing"),
                              ("packed_target_len", 1, "data.packed_target_len"),
                              ("packed_source_len", 4096, "data.packed_source_len")):
    bad = packed_config()
    del bad.data[field]  # a field of another type than the default's
    bad.data[field] = value
    with pytest.raises(ConfigError, match=match):
      validate(bad, 1)
  lstm = packed_config()
  lstm.model.kind = "lstm"
  with pytest.raises(ConfigError, match="data.packing") as e:
    validate(lstm, 1)
  assert "\n" not in str(e.value)
  lstm.data.packing = False
  validate(lstm, 1)


def test_the_pipeline_packs_when_the_config_says_so():
  from transformer.data import bucketing, input_pipeline

  src, tgt = synthetic(50)
  split = TokenizedSplit.from_sequences(src, tgt)
  config = packed_config()
  assert isinstance(input_pipeline.train_batches(split, config), packing.PackedBatches)
  config.data.packing = False
  bucketed = input_pipeline.train_batches(split, config)
  assert isinstance(bucketed, bucketing.TrainBatches)
  assert not set(packing.PACKING_KEYS) & set(bucketed.batch(0))
  assert packing.packing_kwargs(bucketed.batch(0)) == {}


def test_a_restart_maps_the_plans_it_made_and_plans_nothing(tmp_path, monkeypatch):
  src, tgt = synthetic(200)
  config = packed_config(target_len="auto")
  in_memory = TokenizedSplit.from_sequences(src, tgt)
  split = dataclasses.replace(in_memory, directory=str(tmp_path))
  first = packing.PackedBatches(split, config)
  steps = list(range(4 * first.steps_per_epoch + 1))  # epochs 0 to 4 planned and written
  want = {s: first.batch(s) for s in steps}
  reference = packing.PackedBatches(in_memory, config)  # the same plan without a disk
  for s in steps:
    for k, v in reference.batch(s).items():
      np.testing.assert_array_equal(v, want[s][k])
  store = first._store  # noqa: SLF001
  assert store.epochs() == [0, 3, 4]  # epoch 0 and the two latest stay on disk

  def never(*args, **kwargs):
    raise AssertionError("planned or read the corpus's lengths on a restart")

  with monkeypatch.context() as m:
    m.setattr(packing, "plan_epoch", never)
    m.setattr(TokenizedSplit, "source_lengths", never)
    again = packing.PackedBatches(split, config)
    summary = ("steps_per_epoch", "num_examples", "num_dropped", "target_len", "rows")
    assert [getattr(again, a) for a in summary] == [getattr(first, a) for a in summary]
    assert again.real_token_fraction() == first.real_token_fraction()
    for s in reversed(steps[3 * first.steps_per_epoch:]):  # epochs 3 and 4, from disk
      for k, v in again.batch(s).items():
        np.testing.assert_array_equal(v, want[s][k])
    config.seed = 1  # another seed is another plan
    with pytest.raises(AssertionError, match="planned"):
      packing.PackedBatches(split, config)
  config.seed = 0
  # A plan that cannot be read, or a pruned epoch, is planned again, the same.
  (tmp_path / "plans").joinpath(store.directory.rsplit("/", 1)[1], "epoch-3", "row.npy") \
    .write_bytes(b"not an array")
  again = packing.PackedBatches(split, config)
  for s in steps[first.steps_per_epoch:]:
    for k, v in again.batch(s).items():
      np.testing.assert_array_equal(v, want[s][k])
