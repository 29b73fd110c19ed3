"""Restored parameters kept for the next process (transformer/training/parameter_cache.py): read
back exactly, keyed by the checkpoint files, never trusted when damaged, and a translation whose
parameters were kept imports no Orbax."""

import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from transformer import workdir as workdir_lib
from transformer.training import parameter_cache
from transformer.training.parameter_cache import ParameterCache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _params():
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  split = NamedSharding(mesh, PartitionSpec("data"))
  replicated = NamedSharding(mesh, PartitionSpec())
  rng = np.random.default_rng(0)
  host = {"decoder": {"kernel": rng.normal(size=(8, 3)).astype(np.float32)},
          "embed": {"embedding": rng.normal(size=(5, 2)).astype(ml_dtypes.bfloat16)}}
  shardings = {"decoder": {"kernel": split}, "embed": {"embedding": replicated}}
  params = jax.device_put(host, shardings)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          host, shardings)
  return params, abstract


def _workdir(tmp_path):
  workdir = tmp_path / "run"
  for step in (10, 20):
    (workdir / "checkpoints" / str(step)).mkdir(parents=True)
    (workdir / "checkpoints" / str(step) / "state").write_bytes(b"x" * step)
  return str(workdir)


META = {"model": {"d_model": 8}, "vocab_sha256": "abc"}


def test_kept_parameters_come_back_bitwise_on_their_shardings(tmp_path):
  params, abstract = _params()
  cache = ParameterCache(str(tmp_path / "cache"))
  key = cache.key(_workdir(tmp_path), workdir_lib.choose(), META, False, abstract)
  assert cache.load(key, abstract) is None
  cache.keep(key, params, "step 20", 20)
  loaded, label, step = cache.load(key, abstract)
  assert (label, step) == ("step 20", 20)
  for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(params), strict=True):
    assert got.dtype == want.dtype and got.sharding == want.sharding
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_key_changes_with_the_checkpoint_files_and_the_choice(tmp_path):
  _, abstract = _params()
  cache = ParameterCache(str(tmp_path / "cache"))
  workdir = _workdir(tmp_path)
  key = lambda **kw: cache.key(workdir, workdir_lib.choose(**kw), META, False, abstract)  # noqa: E731
  first = key()
  assert key() == first
  assert key(average=2) != first
  assert key(checkpoint="10") != first
  assert cache.key(workdir, workdir_lib.choose(), META, True, abstract) != first  # EMA
  assert cache.key(workdir, workdir_lib.choose(), {**META, "vocab_sha256": "d"}, False,
                   abstract) != first
  state = os.path.join(workdir, "checkpoints", "20", "state")
  with open(state, "r+b") as f:  # the same size, written again: a new modification time
    f.write(b"y")
  os.utime(state, ns=(0, os.stat(state).st_mtime_ns + 1))
  assert key() != first
  second = key()
  os.makedirs(os.path.join(workdir, "checkpoints", "30"))
  with open(os.path.join(workdir, "checkpoints", "30", "state"), "wb") as f:
    f.write(b"z")
  assert key() != second
  # Other shapes (another model in a workdir trained again): another key.
  other = jax.tree.map(lambda a: jax.ShapeDtypeStruct((a.shape[0] * 2,) + a.shape[1:], a.dtype,
                                                      sharding=a.sharding), abstract)
  assert cache.key(workdir, workdir_lib.choose(), META, False, other) != key()


def test_nothing_is_kept_without_a_directory_or_for_a_remote_workdir(tmp_path):
  _, abstract = _params()
  assert ParameterCache(None).key(_workdir(tmp_path), workdir_lib.choose(), META, False,
                                  abstract) is None
  assert ParameterCache(str(tmp_path)).key("gs://bucket/run", workdir_lib.choose(), META,
                                           False, abstract) is None


def test_a_damaged_or_mismatched_file_is_restored_again(tmp_path, caplog):
  params, abstract = _params()
  cache = ParameterCache(str(tmp_path / "cache"))
  key = cache.key(_workdir(tmp_path), workdir_lib.choose(), META, False, abstract)
  cache.keep(key, params, "step 20", 20)
  path = os.path.join(cache.directory, f"{key}.safetensors")
  data = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2])
  with caplog.at_level(logging.WARNING):
    assert cache.load(key, abstract) is None
  assert "cannot be read" in caplog.text
  # A file of other shapes under the key (never written so, but never trusted either).
  wrong = jax.tree.map(lambda x: jnp.concatenate([x, x]), params)
  cache.keep(key, wrong, "step 20", 20)
  assert cache.load(key, abstract) is None


def test_only_the_newest_files_are_kept(tmp_path, monkeypatch):
  params, abstract = _params()
  monkeypatch.setattr(parameter_cache, "KEEP", 2)
  cache = ParameterCache(str(tmp_path / "cache"))
  keys = [cache.key(_workdir(tmp_path / str(i)), workdir_lib.choose(), META, False, abstract)
          for i in range(3)]
  for i, key in enumerate(keys):
    cache.keep(key, params, "step 20", 20)
    path = os.path.join(cache.directory, f"{key}.safetensors")
    os.utime(path, ns=(0, 10**18 + i))  # kept one after the other, in this order
  assert cache.load(keys[0], abstract) is None
  assert cache.load(keys[2], abstract) is not None


@pytest.mark.slow
def test_a_second_translation_reads_the_kept_parameters_without_orbax(tiny_trained, tmp_path):
  """Two processes restore a trained workdir with one compilation cache: the first restores the
  checkpoints (the average the config asks for) and keeps them, the second reads them without
  importing Orbax, and both translate the same."""
  workdir, _, _ = tiny_trained
  script = (
    "import sys\n"
    "from transformer import infer, workdir as w\n"
    f"config = w.load({workdir!r})\n"
    f"config.compilation_cache_dir = {str(tmp_path / 'cache')!r}\n"
    f"model = infer.restore(config, {workdir!r})\n"
    "ids = model.translator.translate_ids(model.params, [model.tokenizer.encode('seven')])\n"
    "print(model.label, ids, 'orbax.checkpoint' in sys.modules)\n")
  outs = []
  for _ in range(2):
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"restoring {workdir} failed:\n{proc.stderr[-3000:]}"
    outs.append(proc.stdout.strip().splitlines()[-1])
  assert outs[0].endswith("True"), outs[0]
  assert outs[1] == outs[0][: -len("True")] + "False", outs


@pytest.mark.slow
def test_a_translation_imports_no_optimiser_no_metrics_and_warm_no_orbax(tiny_trained, tmp_path):
  """`--mode=translate` of one sentence imports neither optax nor sacrebleu nor num2words (what
  training, scoring and building the corpus need), and from a warm cache no Orbax either."""
  workdir, _, _ = tiny_trained
  script = (
    "import runpy, sys\n"
    f"sys.argv = ['transformer.main', '--mode=translate', '--workdir={workdir}', "
    f"'--config.compilation_cache_dir={tmp_path / 'cache'}']\n"
    "try:\n"
    "  runpy.run_module('transformer.main', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "  assert not e.code, e.code\n"
    "print('imported', sorted(m for m in ('optax', 'sacrebleu', 'num2words', 'orbax.checkpoint')"
    " if m in sys.modules))\n")
  imported = []
  for _ in range(2):
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, input="seven\n",
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"translating with {workdir} failed:\n{proc.stderr[-3000:]}"
    imported.append(proc.stdout.strip().splitlines()[-1])
  assert imported == ["imported ['orbax.checkpoint']", "imported []"], imported
