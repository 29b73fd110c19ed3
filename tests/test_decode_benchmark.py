"""The decoding benchmark: its JSON record, cached and uncached greedy agreeing, its defaults.

Tiny shapes only, and no assertion on speed: the numbers depend on the machine.
"""

import json
import os
import subprocess
import sys

import pytest

from configs import numbers, wmt
from experiments import decoding
from transformer.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, S, T, K = 3, 6, 8, 2


def _last_json(stdout: str) -> dict:
  lines = [line for line in stdout.splitlines() if line.strip()]
  return json.loads(lines[-1])


def test_benchmark_main_tiny():
  """The command line on configs/numbers.py:tiny, one device, one timed run per decoder."""
  # Untied output weights: a random model with tied embeddings tends to repeat one token,
  # which would make the token-for-token comparison of the two greedy decoders weak.
  cmd = [
    sys.executable,
    "-m",
    "experiments.decode_benchmark",
    "--config=configs/numbers.py:tiny",
    "--config.model.share_embeddings=False",
    f"--batch_size={B}",
    f"--src_len={S}",
    f"--out_len={T}",
    f"--beam_size={K}",
    "--repeats=1",
  ]
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = _last_json(proc.stdout)

  for mode in decoding.MODES:
    for suffix in ("s", "s_median", "compile_s", "ms_per_step", "sentences_per_s", "tokens_per_s"):
      assert r[f"{mode}_{suffix}"] > 0, f"{mode}_{suffix}"
    assert len(r[f"{mode}_times_s"]) == 1
    assert r[f"{mode}_tokens_per_s"] == pytest.approx(T * r[f"{mode}_sentences_per_s"])
  for key in (
    "speedup_cached_vs_uncached_greedy",
    "beam_cost_vs_cached_greedy",
    "params",
    "device_count",
    "cpu_count",
  ):
    assert r[key] > 0, key
  assert r["speedup_cached_vs_uncached_greedy"] == pytest.approx(
    r["uncached_greedy_s"] / r["cached_greedy_s"]
  )
  assert r["same_tokens"] is True and r["token_agreement"] == 1.0
  assert r["exact_length"] is True  # out_len tokens each: no early EOS, EOS last
  first = r["greedy_tokens_first_row"]
  assert len(first) == T and first[-1] == 1 and len(set(first[:-1])) > 1
  expected = {
    "config": "numbers-tiny",
    "batch_size": B,
    "src_len": S,
    "out_len": T,
    "beam_size": K,
    "repeats": 1,
    "d_model": 32,
    "layers": 1,
    "vocab": 256,
    "dtype": "float32",
    "platform": "cpu",
    "device_count": 1,
  }
  assert {k: r[k] for k in expected} == expected
  assert isinstance(r["cpu"], str) and r["cpu"]


@pytest.mark.parametrize(
  "kwargs, field",
  [
    ({"beam_size": 1}, "--beam_size"),
    ({"out_len": 500}, "--out_len"),
    ({"repeats": 0}, "--repeats"),
    ({"batch_size": 0}, "--batch_size"),
  ],
)
def test_bad_arguments_are_config_errors(kwargs, field):
  """Checked before anything is built or compiled."""
  with pytest.raises(ConfigError, match=field):
    decoding.run_benchmark(numbers.get_config("tiny"), **kwargs)


def test_defaults_yield_to_the_command_line():
  config = wmt.get_config("base")
  config.model.dtype = "bfloat16"
  changes = decoding.apply_defaults(config, lambda field: False)
  assert len(changes) == 2
  assert config.model.dtype == "float32"
  assert config.model.vocab_size == decoding.DEFAULT_VOCAB_SIZE

  config = wmt.get_config("base")
  decoding.apply_defaults(config, lambda field: field == "model.vocab_size")
  assert config.model.vocab_size == 37000

  config = numbers.get_config()
  assert decoding.apply_defaults(config, lambda field: False) == []
  assert config.model.vocab_size == 256


def test_peer_ctranslate2_tiny(tmp_path):
  """--peer=ctranslate2 on configs/numbers.py:tiny: one round, both batch sizes, the report."""
  pytest.importorskip("ctranslate2")
  path = tmp_path / "peer.md"
  cmd = [sys.executable, "-m", "experiments.decode_benchmark", "--config=configs/numbers.py:tiny",
         "--peer=ctranslate2", "--peer_batch_sizes=3,1", f"--src_len={S}", f"--out_len={T}",
         f"--beam_size={K}", "--repeats=1", "--warmup=0", "--threads=1", f"--report={path}"]
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  r = _last_json(proc.stdout)
  assert r["exact_length_batch_3"] and r["exact_length_batch_1"]
  assert [(x["batch_size"], x["search"]) for x in r["results"]] == [
    (3, "greedy"), (3, "beam"), (1, "greedy"), (1, "beam")]
  for x in r["results"]:
    for decoder in decoding.PEER_DECODERS:
      assert x[f"{decoder}_tokens_per_s"] > 0
    assert x["ours_vs_ct2_float32"] == pytest.approx(
      x["ours_tokens_per_s"] / x["ct2_float32_tokens_per_s"])
  text = path.read_text()
  assert "--peer=ctranslate2" in text and "| 3 | beam 2 |" in text


def test_peer_bad_batch_sizes_is_one_line():
  cmd = [sys.executable, "-m", "experiments.decode_benchmark", "--config=configs/numbers.py:tiny",
         "--peer=ctranslate2", "--peer_batch_sizes=0"]
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith("error: --peer_batch_sizes")
