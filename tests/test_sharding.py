"""Sharding: the same losses on every mesh, parameters really split, checkpoints across meshes,
and two processes on 127.0.0.1 against one."""

import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import numbers as numbers_config
from tests.xla_flags import FAST_COMPILE
from transformer import sharding as sharding_lib
from transformer.errors import ConfigError
from transformer.training.checkpoint import Checkpointer
from transformer.training.trainer import Trainer
from transformer.training.validate import validate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(data=1, fsdp=1, tensor=1):
  config = numbers_config.get_config("tiny")
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = data, fsdp, tensor
  config.model.dropout_rate = 0.1
  return config


def make_trainer(config, num_devices):
  devices = jax.devices()[:num_devices]
  mesh = sharding_lib.make_mesh(config.mesh, devices)
  return Trainer(config, mesh, validate(config, num_devices))


def batches(n=3, rows=16, length=12, vocab=256):
  rng = np.random.default_rng(0)
  out = []
  for _ in range(n):
    inputs = rng.integers(2, vocab, size=(rows, length)).astype(np.int32)
    targets = rng.integers(2, vocab, size=(rows, length)).astype(np.int32)
    inputs[:, 9:] = 0  # some padding
    targets[::3, 7:] = 0
    out.append({"inputs": inputs, "targets": targets})
  return out


def losses(trainer, steps=3):
  state = trainer.init_state(0)
  rng = jax.random.key(0)
  result = []
  for batch in batches(steps):
    state, metrics = trainer.train_step(
      state, sharding_lib.local_batch_to_global(batch, trainer.mesh), rng)
    m = jax.device_get(metrics)
    result.append(float(m["loss"]) / float(m["tokens"]))
  return np.array(result), state


@pytest.fixture(scope="module")
def single_device_losses():
  return losses(make_trainer(tiny_config(), 1))[0]


@pytest.mark.parametrize("mesh", [(8, 1, 1), (1, 8, 1), (2, 2, 2), (2, 1, 4)],
                         ids=["data8", "fsdp8", "data2-fsdp2-tensor2", "data2-tensor4"])
def test_every_mesh_gives_the_single_device_losses(mesh, single_device_losses):
  trainer = make_trainer(tiny_config(*mesh), 8)
  result, state = losses(trainer)
  np.testing.assert_allclose(result, single_device_losses, rtol=1e-4)
  assert result[-1] != result[0]  # training moved


def test_fsdp_and_tensor_split_the_parameters():
  def max_bytes(mesh):
    # The bytes each device holds under the shardings the jitted init produces (no allocation).
    trainer = make_trainer(tiny_config(*mesh), 8)
    per_device = {}
    for leaf in jax.tree.leaves(trainer.abstract_state.params):
      shard = leaf.sharding.shard_shape(leaf.shape)
      for device in leaf.sharding.device_set:
        per_device[device.id] = per_device.get(device.id, 0) + np.prod(shard) * 4
    return max(per_device.values())

  replicated = max_bytes((8, 1, 1))
  assert max_bytes((1, 8, 1)) < replicated / 4
  assert max_bytes((2, 1, 4)) < replicated / 2
  assert max_bytes((2, 2, 2)) < replicated / 2


def test_checkpoint_written_under_one_mesh_restores_under_another(tmp_path):
  trainer_a = make_trainer(tiny_config(1, 8, 1), 8)
  _, state = losses(trainer_a, steps=2)
  ckpt = Checkpointer(str(tmp_path), 2)
  ckpt.save(2, state, {"model": {}})
  ckpt.wait()
  trainer_b = make_trainer(tiny_config(2, 1, 4), 8)
  restored, step = ckpt.restore_latest(trainer_b.abstract_state, lambda meta, path: None)
  assert step == 2
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               state.params, restored.params)
  leaf = jax.tree.leaves(restored.params)[0]
  assert leaf.sharding.mesh.shape == trainer_b.mesh.shape
  # The restored arrays really are split over the new mesh.
  total = sum(x.nbytes for x in jax.tree.leaves(restored.params))
  assert max(sharding_lib.bytes_per_device(restored.params).values()) < total / 2
  ckpt.close()


@pytest.mark.parametrize("mesh,devices,match", [
  ((3, 1, 1), 8, "mesh"),
  ((-1, -1, 1), 8, "at most one"),
  ((1, 1, 3), 3, "num_heads"),
])
def test_meshes_that_do_not_fit_are_refused_before_training(mesh, devices, match):
  with pytest.raises(ConfigError, match=match):
    validate(tiny_config(*mesh), devices)


@pytest.fixture(scope="module")
def tiny_train_split(tmp_path_factory):
  """The tokenized training split of the tiny numbers corpus (built once)."""
  from transformer.data import input_pipeline

  config = tiny_config()
  config.data_dir = str(tmp_path_factory.mktemp("tfds"))
  pipe = input_pipeline.build_pipeline(config, str(tmp_path_factory.mktemp("w")),
                                       batch_multiple=1)
  return pipe.train.split


def plan_losses(mesh, num_devices, split, steps=4):
  """Training losses of the first `steps` batches of the real plan on `mesh`."""
  from transformer.data import bucketing

  config = tiny_config(*mesh)
  config.data.tokens_per_batch = 300  # 9 and 4 examples per batch: padded on 8 devices
  trainer = make_trainer(config, num_devices)
  batches = bucketing.TrainBatches(
    split, config, batch_multiple=sharding_lib.data_parallel_size(trainer.mesh))
  state, rng, out = trainer.init_state(0), jax.random.key(0), []
  for step in range(steps):
    batch = sharding_lib.local_batch_to_global(batches.batch(step), trainer.mesh)
    state, metrics = trainer.train_step(state, batch, rng)
    m = jax.device_get(metrics)
    out.append(float(m["loss"]) / float(m["tokens"]))
  return np.array(out), batches


@pytest.mark.slow
def test_batch_plan_and_losses_do_not_depend_on_the_mesh(tiny_train_split):
  """1 device against 8 (data 2 x fsdp 4): the same examples, the same losses every step."""
  single, plan1 = plan_losses((1, 1, 1), 1, tiny_train_split)
  assert plan1.shapes() == [(9, 32), (4, 64)]  # no device multiple on one device
  result, plan8 = plan_losses((2, 4, 1), 8, tiny_train_split)
  # Padded up to the data-parallel size (8) with zero rows, none dropped.
  assert plan8.shapes() == [(16, 32), (8, 64)]
  np.testing.assert_allclose(result, single, rtol=1e-4)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_cli(workdir, extra, devices, env_extra=None):
  env = dict(os.environ,
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}",
             **(env_extra or {}))
  return subprocess.Popen(
    [sys.executable, "-m", "transformer.main", "--config=configs/numbers.py:tiny",
     f"--workdir={workdir}", "--config.num_train_steps=4", *extra],
    cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )


def _train_losses(workdir):
  """step -> training loss, from the run's metrics.jsonl."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


@pytest.mark.slow
def test_two_processes_match_one_process(tiny_trained, tmp_path):
  """Two processes x 2 CPU devices over 127.0.0.1 give the losses of one process on one device
  (conftest.tiny_trained, the same config run for longer)."""
  port = _free_port()
  workdir = tmp_path / "multi"
  procs = [
    _run_cli(workdir, [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                       f"--process_id={i}", "--config.evals.valid_loss.every_steps=100",
                       "--config.average_last_checkpoints=0",
                       "--config.evals.valid_translation.sentences=4",
                       "--config.evals.test_translation.sentences=4"], 2)
    for i in range(2)
  ]
  outputs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outputs, strict=True):
    assert p.returncode == 0, err[-3000:]
  multi, single = _train_losses(workdir), _train_losses(tiny_trained[0])
  assert sorted(multi) == [2, 4]
  np.testing.assert_allclose([multi[s] for s in (2, 4)], [single[s] for s in (2, 4)], rtol=1e-4)
  # Only process 0 printed the results.
  assert "Test BLEU" in outputs[0][0] and "Test BLEU" not in outputs[1][0]


@pytest.mark.slow
def test_two_processes_translate_a_file_as_one_does(tiny_trained, tmp_path):
  """A corpus translated by two processes x 2 devices (each reads the input, process 0 writes)
  equals one process's translation on 4 devices, n-best lists included."""
  trained = tiny_trained[0]
  source = tmp_path / "in.txt"
  source.write_text("seven\nthree hundred\n\ntwelve and then five\n" * 5)

  def translate(out, devices, extra=()):
    env = dict(os.environ,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}")
    return subprocess.Popen(
      [sys.executable, "-m", "transformer.main", "--mode=translate", f"--workdir={trained}",
       f"--input={source}", f"--output={out}", "--nbest=2", "--output_format=jsonl",
       "--config.decode.chunk_size=7", *extra],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  one = translate(tmp_path / "one.jsonl", 4)
  assert one.communicate(timeout=600) and one.returncode == 0
  port = _free_port()
  procs = [translate(tmp_path / f"two{i}.jsonl", 2,
                     [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                      f"--process_id={i}"]) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
  assert (tmp_path / "two0.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()
  assert not (tmp_path / "two1.jsonl").exists()  # process 1 writes nothing


def test_beam_search_on_a_split_mesh_gives_one_devices_outputs_and_gathers_no_cache():
  """A lockstep beam search with the batch over data and fsdp and the heads over tensor: the
  same hypotheses as on one device, and no device gathers the self-attention caches of the
  others (each row's hypothesis is taken from its own sentence's rows, where they are)."""
  import re

  import flax.linen as nn
  from ml_collections import config_dict

  from transformer.decoding import translate
  from transformer.nn.model import ModelConfig, Transformer

  cfg = ModelConfig(vocab_size=40, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=48,
                    dropout_rate=0.0, logits_bias=True)
  src = jnp.ones((1, 8), jnp.int32)
  boxed = Transformer(cfg).init(jax.random.key(0), src, src)["params"]
  params = nn.unbox(boxed)
  bias = params["decoder"]["logits_bias"]  # EOS less likely: outputs of several tokens
  params = {**params, "decoder": {**params["decoder"], "logits_bias": bias.at[1].set(-2.0)}}
  rules = sharding_lib.rules(numbers_config.get_config("tiny"))
  beam_size = 4

  def translator(data, fsdp, tensor):
    mesh = sharding_lib.make_mesh(
      config_dict.ConfigDict({"data": data, "fsdp": fsdp, "tensor": tensor}),
      jax.devices()[:data * fsdp * tensor])
    shardings = sharding_lib.logical_shardings(boxed, mesh, rules)
    decode = config_dict.ConfigDict({"method": "beam", "beam_size": beam_size, "alpha": 0.6,
                                     "max_extra_len": 20, "batch_size": 16,
                                     "in_flight": False})
    return translate.Translator(cfg, decode, mesh, shardings, bucket_lengths=(8, 16)), shardings

  rng = np.random.default_rng(0)
  sources = [[*rng.integers(2, 40, rng.integers(2, 8)), 1] for _ in range(32)]
  one, _ = translator(1, 1, 1)
  split, shardings = translator(2, 2, 2)
  split_params = jax.device_put(params, shardings)
  want = one.search_ids(params, sources)
  got = split.search_ids(split_params, sources)
  assert [h[0].ids for h in got] == [h[0].ids for h in want]
  assert len({len(h[0].ids) for h in got}) > 1

  (key,) = [k for k in split._fns if k[0] == "decode"]
  rows = split.rows_per_batch(8, len(sources))
  args = [split._global(np.ones((rows, 8), np.int32)),
          split._global(np.arange(rows, dtype=np.int32))]
  hlo = split._fns[key].lower(split_params, *args).compile().as_text()
  head_dim = cfg.d_model // cfg.num_heads
  gathered = re.findall(r"= f32\[(\d+),(\d+),(\d+),(\d+)\]\S* all-gather\(", hlo)
  caches = [g for g in gathered if (int(g[0]), int(g[1]), int(g[3])) ==
            (rows * beam_size, cfg.num_heads, head_dim)]
  assert not caches, f"all-gathers of self-attention caches [rows, heads, L, k]: {caches}"
