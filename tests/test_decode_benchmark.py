"""The decoding benchmark: its JSON record, cached and uncached greedy agreeing, its defaults.

Tiny shapes only, and no assertion on speed: the numbers depend on the machine.
"""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import decode as decoding
from configs import numbers, wmt
from tests.xla_flags import FAST_COMPILE
from transformer.errors import ConfigError

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, S, T, K = 3, 6, 8, 2


def _last_json(stdout: str) -> dict:
  lines = [line for line in stdout.splitlines() if line.strip()]
  return json.loads(lines[-1])


def _results(r: dict) -> dict:
  return {(x["batch_size"], x["decoder"], x["search"]): x for x in r["results"]}


def test_benchmark_main_tiny(tmp_path):
  """The command line on configs/numbers.py:tiny, one device, one timed round."""
  # Untied output weights: a random model with tied embeddings tends to repeat one token,
  # which would make the token-for-token comparison of the two greedy decoders weak.
  path = tmp_path / "decode.md"
  cmd = [sys.executable, "-m", "benchmarks.decode", "--config=configs/numbers.py:tiny",
         "--config.model.share_embeddings=False", f"--batch_size={B}", f"--src_len={S}",
         f"--out_len={T}", f"--beam_size={K}", "--repeats=1", f"--out={path.with_suffix('')}"]
  env = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = _last_json(proc.stdout)

  results = _results(r)
  assert list(results) == [(B, "ours", "greedy"), (B, "uncached", "greedy"), (B, "ours", "beam")]
  for x in results.values():
    for key in ("s", "s_median", "compile_s", "ms_per_step", "sentences_per_s", "tokens_per_s"):
      assert x[key] > 0, key
    assert len(x["times_s"]) == 1
    assert x["tokens_per_s"] == pytest.approx(T * x["sentences_per_s"])
  assert results[B, "ours", "beam"]["beams"] == K
  [check] = r["checks"]
  assert check["same_tokens"] is True and check["token_agreement"] == 1.0
  assert check["exact_length"] is True  # out_len tokens each: no early EOS, EOS last
  first = check["greedy_tokens_first_row"]
  assert len(first) == T and first[-1] == 1 and len(set(first[:-1])) > 1
  expected = {"config": "numbers-tiny", "batch_sizes": [B], "src_len": S, "out_len": T,
              "beam_size": K, "repeats": 1, "d_model": 32, "layers": 1, "vocab": 256,
              "dtype": "float32", "peer": None}
  assert {k: r[k] for k in expected} == expected
  assert r["params"] > 0 and r["hardware"]["backend"] == "cpu"
  ratio = results[B, "ours", "greedy"]["tokens_per_s"] / results[B, "uncached",
                                                                  "greedy"]["tokens_per_s"]
  text = path.read_text()
  assert f"| {B} | greedy |" in text and f"{ratio:.2f}x" in text and "same tokens: True" in text

  # The profiles (on by default): both searches, every op sorted into a part of the program.
  assert [(p["batch_size"], p["search"]) for p in r["profiles"]] == [(B, "greedy"), (B, "beam")]
  for p in r["profiles"]:
    parts = {c["category"]: c["share"] for c in p["categories"]}
    assert sum(parts.values()) == pytest.approx(1.0) and p["steps"] == T
    for part in ("encoder (once per batch)", "feed-forward", "decoder cross-attention",
                 "decoder self-attention over the cache"):
      assert parts.get(part, 0) > 0, (p["search"], part)
  beam_parts = {c["category"] for c in r["profiles"][1]["categories"]}
  assert "search: log-softmax, top-k, hypotheses, cache reorder" in beam_parts
  assert f"### Where our beam {K} time goes: batch {B}" in text


@pytest.mark.parametrize(
  "kwargs, field",
  [
    ({"beam_size": 1}, "--beam_size"),
    ({"out_len": 500}, "--out_len"),
    ({"repeats": 0}, "--repeats"),
    ({"batch_sizes": (0,)}, "--batch_size"),
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
  import ctranslate2  # noqa: F401  (requirements.txt: a missing install fails here)
  path = tmp_path / "peer.md"
  cmd = [sys.executable, "-m", "benchmarks.decode", "--config=configs/numbers.py:tiny",
         "--peer=ctranslate2", "--peer_batch_sizes=3,1", f"--src_len={S}", f"--out_len={T}",
         f"--beam_size={K}", "--repeats=1", "--warmup=0", "--threads=1",
         f"--out={path.with_suffix('')}"]
  env = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  r = _last_json(proc.stdout)
  assert [c["exact_length"] for c in r["checks"]] == [True, True]
  results = _results(r)
  assert list(results) == [(b, d, s) for b in (3, 1) for s in ("greedy", "beam")
                           for d in ("ours", "ct2_float32", "ct2_int8")]
  assert all(x["tokens_per_s"] > 0 for x in results.values())
  text = path.read_text()
  assert "--peer=ctranslate2" in text and "| 3 | beam 2 |" in text
  ours, ct2 = results[1, "ours", "beam"], results[1, "ct2_float32", "beam"]
  assert f"| {ours['tokens_per_s'] / ct2['tokens_per_s']:.2f}x |" in text


def test_peer_bad_batch_sizes_is_one_line():
  cmd = [sys.executable, "-m", "benchmarks.decode", "--config=configs/numbers.py:tiny",
         "--peer=ctranslate2", "--peer_batch_sizes=0"]
  env = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith("error: --peer_batch_sizes")


def test_isa_note_names_the_limits_and_the_machine():
  """The AVX2 kernels measured on an AVX-512 machine are labelled as such, not as an AVX2 CPU."""
  hw = {"cpu_kind": "x86-64 AVX-512 (AVX2 only for XLA: --xla_cpu_max_isa=AVX2)",
        "xla_flags": "--xla_force_host_platform_device_count=1 --xla_cpu_max_isa=AVX2"}
  note = decoding.isa_note({"hardware": hw, "ct2_force_cpu_isa": "AVX2"})
  assert "XLA (`--xla_cpu_max_isa=AVX2`) to AVX2" in note
  assert "CTranslate2 (`CT2_FORCE_CPU_ISA=AVX2`) to AVX2" in note
  assert "the AVX2 kernels on this x86-64 AVX-512 machine, not an AVX2 machine" in note
  assert decoding.isa_note({"hardware": {**hw, "xla_flags": ""}, "ct2_force_cpu_isa": None}) == ""
