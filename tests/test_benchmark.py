"""The training benchmark: its JSON record, the peer's FLOP count, compile-only mode, errors.

Tiny shapes only, and no assertion on speed: the numbers depend on the machine.
"""

import json
import os
import subprocess
import sys

import jax
import pytest

from benchmarks import train_step
from configs import wmt
from measuring import measure, step_cost
from transformer import hardware
from transformer.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, S, T, VOCAB = 8, 6, 5, 128  # S != T, so source and target terms cannot be swapped unseen

# What a run measures by timing; null when --steps=0.
TIMING_KEYS = ("tokens_per_s", "step_s", "step_s_median", "first_step_s", "matmul_flops_per_s",
               "step_cpu_s", "achieved_flops_per_s", "fraction_of_matmul_peak")


def _last_json(stdout: str) -> dict:
  lines = [line for line in stdout.splitlines() if line.strip()]
  return json.loads(lines[-1])


def test_benchmark_main_one_step():
  """The command line on configs/wmt.py:tiny (8 simulated devices), one timed step."""
  cmd = [
    sys.executable,
    "-m",
    "benchmarks.train_step",
    "--config=configs/wmt.py:tiny",
    f"--config.model.vocab_size={VOCAB}",
    f"--batch_size={B}",
    f"--src_len={S}",
    f"--tgt_len={T}",
    "--steps=1",
    "--warmup_steps=1",
    "--matmul_size=128",
    "--profile_steps=1",
  ]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = _last_json(proc.stdout)

  # The profiled step: every part of the model that ran is there, and the shares add up.
  profile = r["profile"]
  assert profile["steps"] == 1 and profile["op_seconds_per_step"] > 0
  parts = {c["category"]: c["share"] for c in profile["categories"]}
  assert sum(parts.values()) == pytest.approx(1.0)
  for part in ("feed-forward", "layer norm", "output projection (tied embedding or logits layer)",
               "attention: Q, K, V, O projections",
               "attention: scores, softmax, weights x values"):
    assert parts.get(part, 0) > 0, part
  assert 0 < len(profile["top_ops"]) <= 8
  assert [o["seconds"] for o in profile["top_ops"]] == sorted(
    (o["seconds"] for o in profile["top_ops"]), reverse=True)
  assert r["cpu_kind"]

  assert r["model_flops_per_step"] == hardware.model_flops_per_step(r["params"], B * S, B * T)
  assert r["tokens_per_step"] == B * (S + T)
  for key in (
    *TIMING_KEYS,
    "compile_s",
    "lower_s",
    "temp_memory_bytes",
    "peak_memory_bytes",
    "argument_memory_bytes",
    "params",
  ):
    assert r[key] > 0, key
  assert r["step_s_stat"] == "best"
  assert isinstance(r["step_minor_faults"], int) and r["step_minor_faults"] >= 0
  assert len(r["step_times_s"]) == 1 and r["step_s"] == min(r["step_times_s"])
  assert r["step_s"] <= r["step_s_median"]
  assert r["tokens_per_s"] == pytest.approx(B * (S + T) / r["step_s"], rel=1e-9)
  assert r["achieved_flops_per_s"] == pytest.approx(r["model_flops_per_step"] / r["step_s"])
  assert r["fraction_of_matmul_peak"] == pytest.approx(
    r["achieved_flops_per_s"] / r["matmul_flops_per_s"]
  )
  assert r["lower_s"] < r["compile_s"]
  assert r["peak_memory_bytes"] == (
    r["argument_memory_bytes"]
    + r["output_memory_bytes"]
    - r["alias_memory_bytes"]
    + r["temp_memory_bytes"]
  )
  assert r["peak_memory_bytes"] >= r["temp_memory_bytes"]
  assert r["last_loss"] > 0

  expected = {
    "d_model": 32,
    "layers": 1,
    "heads": 4,
    "d_ff": 64,
    "vocab": VOCAB,
    "dtype": "float32",
    "attention": "xla",
    "scan_layers": False,
    "remat": "none",
    "dropout": 0.1,
    "devices": jax.device_count(),
    "backend": "cpu",
    "batch_size": B,
    "src_len": S,
    "tgt_len": T,
    "steps": 1,
  }
  assert {k: r[k] for k in expected} == expected
  # d*V embedding + per layer: 4 d^2 (enc attention) + 8 d^2 (dec attentions) + 2 x FFN
  # (2 d f + f + d) + layer norms (2 x 2d enc, 3 x 2d dec).
  d, f = 32, 64
  assert r["params"] == d * VOCAB + 12 * d * d + 2 * (2 * d * f + f + d) + 10 * d


def test_compile_only_has_no_timings():
  """steps=0 (in process): compiled and analysed, nothing run, timing fields null."""
  config = wmt.get_config("tiny")
  config.model.scan_layers = True
  r = train_step.run_benchmark(config, B, S, T, steps=0)
  assert config.data.vocab_size == config.model.vocab_size
  for key in TIMING_KEYS:
    assert r[key] is None, key
  assert r["step_times_s"] == [] and r["steps"] == 0
  assert r["compile_s"] > 0 and r["temp_memory_bytes"] > 0 and r["scan_layers"] is True
  assert r["model_flops_per_step"] == 6 * r["params"] * B * (S + T) / 2
  json.dumps(r)  # the record is JSON-serialisable as it stands


@pytest.mark.parametrize(
  "kwargs, field",
  [
    ({"batch_size": 4}, "--batch_size"),
    ({"src_len": 500}, "--src_len"),
    ({"steps": -1}, "--steps"),
  ],
)
def test_bad_shapes_are_config_errors(kwargs, field):
  args = {"batch_size": B, "src_len": S, "tgt_len": T, "steps": 0, **kwargs}
  with pytest.raises(ConfigError, match=field):
    train_step.run_benchmark(wmt.get_config("tiny"), **args)


def test_minor_faults_count_first_touches():
  import numpy as np

  before = measure.minor_faults()
  x = np.ones(2**24, np.float32)  # 64 MiB: fresh pages, each mapped on first touch
  assert measure.minor_faults() - before >= 32, "not even one fault per 2 MiB page"
  del x


def test_compare_peer_alternates_programs_and_profiles_the_last_rounds_first_variant(
    monkeypatch):
  """The schedule of `compare`, with the runs stood in for: every variant of ours followed by
  the peer, round after round; only the last round's first variant profiled."""
  from benchmarks import compare_peer

  commands = []

  def fake_run(cmd, env=None):
    commands.append(cmd)
    return {"tokens_per_s": 1.0}

  monkeypatch.setattr(compare_peer.measure, "run_json", fake_run)
  seen = []
  records = compare_peer.compare("peer-python", "peer.py", ["small"], ["base", "no_dropout"],
                                 rounds=2, steps=3, profile_steps=4, benchmark_flags=["--x=1"],
                                 peer_flags=["--y"], env={},
                                 done=lambda recs: seen.append(len(recs)))
  assert [(r["round"], r["variant"], r["program"]) for r in records] == [
    (round_, v, p) for round_ in (0, 1) for v in ("base", "no_dropout") for p in ("ours", "peer")]
  assert seen == [2, 4, 6, 8]  # the report is written after every pair
  ours = [c for c in commands if c[0] == sys.executable]
  assert [c[-1] for c in ours] == ["--profile_steps=0", "--profile_steps=0",
                                    "--profile_steps=4", "--profile_steps=0"]
  assert all("--x=1" in c and "--steps=3" in c for c in ours)
  assert "--config.model.dropout_rate=0.0" in ours[1]
  peers = [c for c in commands if c[0] == "peer-python"]
  assert len(peers) == 4 and all(c[1] == "peer.py" and c[-1] == "--y" for c in peers)


@pytest.mark.slow
def test_compare_peer_end_to_end_reports_ratios(tmp_path):
  """benchmarks.compare_peer end to end, with tiny shapes and a stand-in for the peer."""
  fake_peer = tmp_path / "peer.py"
  fake_peer.write_text(
    "import json\n"
    "print('log line')\n"
    "print(json.dumps({'torch': 'fake', 'threads': 2, 'tokens_per_s': 50.0, 'step_s': 1.0,\n"
    "                  'model_flops_per_step': 7, 'fraction_of_matmul_peak': 0.5,\n"
    "                  'matmul_peak_flops': 1e9}))\n")
  out = tmp_path / "cmp"
  shapes = [f"--config={ROOT}/configs/wmt.py:tiny", "--config.model.dtype=float32",
            "--config.mesh.data=1", f"--config.model.vocab_size={VOCAB}",
            f"--batch_size={B}", f"--src_len={S}", f"--tgt_len={T}"]
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.compare_peer", f"--peer_python={sys.executable}",
     f"--peer={fake_peer}", "--rounds=1", "--timed_steps=1", "--variants=no_dropout",
     "--shapes=custom", "--benchmark_flags=" + ",".join(shapes), "--profile_steps=1",
     "--env=PEER_PROBE=1", f"--out={out}"],
    cwd=ROOT, capture_output=True, text=True, timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = json.loads((tmp_path / "cmp.json").read_text())["sections"]["default"]["records"]
  assert [(r["round"], r["shape"], r["variant"], r["program"]) for r in records] == [
    (0, "custom", "no_dropout", p) for p in ("ours", "peer")]
  md = (tmp_path / "cmp.md").read_text()
  assert f"**{records[0]['tokens_per_s'] / 50.0:.2f}**" in md  # ours against the peer
  assert "compare_peer" in md and "torch fake" in md and "PEER_PROBE=1" in md
  assert records[0]["profile"] is not None
  assert "### Where our step's time goes: `custom`" in md
  assert "CPU kind: **" in md


def test_compile_depth_ratios_are_per_scan_setting():
  from benchmarks import compile_depth

  records = [{"layers": n, "scan_layers": scan, "compile_s": s}
             for n, scan, s in ((6, True, 10.0), (24, True, 12.0), (6, False, 20.0),
                                (24, False, 140.0))]
  ratios = [r["compile_vs_shallowest"] for r in compile_depth.with_ratios(records)]
  assert ratios == pytest.approx([1.0, 1.2, 1.0, 7.0])


@pytest.mark.slow
def test_compile_depth_end_to_end(tmp_path):
  """benchmarks.compile_depth at tiny shapes: a compile-only child at one depth, a report (the
  ratios between depths: test_compile_depth_ratios_are_per_scan_setting)."""
  out = tmp_path / "depth"
  shapes = ["--config=configs/wmt.py:tiny", f"--config.model.vocab_size={VOCAB}",
            f"--batch_size={B}", f"--src_len={S}", f"--tgt_len={T}"]
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.compile_depth", "--layers=2", "--scan_layers=true",
     "--benchmark_flags=" + ",".join(shapes), f"--out={out}"],
    cwd=ROOT, capture_output=True, text=True, timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = json.loads((tmp_path / "depth.json").read_text())["records"]
  assert [(r["layers"], r["scan_layers"]) for r in records] == [(2, True)]
  assert all(r["compile_s"] > 0 and r["temp_memory_bytes"] > 0 for r in records)
  assert records[0]["compile_vs_shallowest"] == 1.0
  md = (tmp_path / "depth.md").read_text()
  assert "CPU kind: **" in md and "compile_depth" in md


@pytest.mark.parametrize("args, message", [
  (["--layers=6,x"], "--layers"),
  (["--layers=0"], "--layers"),
  (["--scan_layers=maybe"], "--scan_layers"),
])
def test_compile_depth_bad_arguments_are_one_line(args, message):
  proc = subprocess.run([sys.executable, "-m", "benchmarks.compile_depth", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and message in proc.stderr, proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
  (["--shapes=tiny"], "--shapes"),
  (["--shapes=custom"], "--shapes=custom"),
  (["--env=NOVALUE"], "--env=NOVALUE"),
])
def test_compare_peer_bad_arguments_are_one_line(args, message):
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.compare_peer", f"--peer_python={sys.executable}", *args],
    cwd=ROOT, capture_output=True, text=True, timeout=120,
  )
  assert proc.returncode == 2 and message in proc.stderr, proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1


def test_compare_peer_needs_a_peer_python():
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.compare_peer", "--peer_python="],
    cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PEER_PYTHON": ""},
  )
  assert proc.returncode == 2 and "--peer_python" in proc.stderr


# The PyTorch peer (benchmarks/torch_peer.py). Its real run needs torch, which the project's
# environment does not have; these checks run without it.
PEER_SCRIPT = os.path.join(ROOT, "benchmarks", "torch_peer.py")
NO_TORCH = "import sys; sys.modules['torch'] = None; "  # `import torch` raises ImportError


@pytest.mark.parametrize("params, source_tokens, target_tokens", [
  (63_045_632, 32 * 64, 32 * 64),  # the base model (WMT vocabulary), 32 x 64 tokens a side
  (1000, 7, 90),
  (1, 0, 1),
])
def test_torch_peer_flops_match_the_library(params, source_tokens, target_tokens):
  from benchmarks import torch_peer

  assert torch_peer.model_flops_per_step(params, source_tokens, target_tokens) == (
    hardware.model_flops_per_step(params, source_tokens, target_tokens))


def test_torch_peer_runs_without_torch_or_jax_until_main():
  """Importing it and parsing its flags need neither torch nor JAX; main without torch is a
  one-line error naming requirements-peer.txt (exit 2), and so is a bad flag."""
  probe = (NO_TORCH + "import json, benchmarks.torch_peer as p; a = p.parse_args([]); "
           "loaded = [m for m in ('jax', 'torch') if sys.modules.get(m)]; "
           "print(json.dumps([vars(a), loaded]))")
  proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 0, proc.stderr
  args, imported = json.loads(proc.stdout)
  assert imported == []
  base = {"vocab": 8192, "d_model": 512, "layers": 6, "heads": 8, "d_ff": 2048, "dropout": 0.1,
          "label_smoothing": 0.1, "batch_size": 32, "src_len": 64, "tgt_len": 64}
  assert {k: args[k] for k in base} == base

  run_main = NO_TORCH + ("import runpy; sys.argv[:1] = []; "
                         "runpy.run_path(sys.argv[0], run_name='__main__')")
  proc = subprocess.run([sys.executable, "-c", run_main, PEER_SCRIPT, "--repeats", "1"],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and "requirements-peer.txt" in proc.stderr, proc.stderr
  for bad in (["--heads", "3"], ["--repeats", "0"], ["--dropout", "1.5"]):
    proc = subprocess.run([sys.executable, PEER_SCRIPT, *bad], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and bad[0] in proc.stderr, (bad, proc.stderr)


def test_compare_peer_uses_the_repository_peer_and_writes_no_local_paths():
  from measuring import report

  with open(os.path.join(ROOT, "benchmarks", "compare_peer.py")) as f:
    assert 'os.path.join(ROOT, "benchmarks", "torch_peer.py")' in f.read()
  cmd1 = (f"python -m benchmarks.compare_peer --peer_python=/opt/env/bin/python "
          f"--peer={PEER_SCRIPT} --out=/scratch/run/cmp --rounds=1")
  cmd2 = (f"python -m benchmarks.compare_peer --peer_python /opt/env/bin/python "
          f"--benchmark_flags=--config={ROOT}/configs/wmt.py:tiny,--batch_size=8")
  hide = ("--peer_python",)
  assert report.public_command(cmd1, hide) == (
    "python -m benchmarks.compare_peer --peer_python=PY --peer=benchmarks/torch_peer.py "
    "--out=cmp --rounds=1")
  assert report.public_command(cmd2, hide) == (
    "python -m benchmarks.compare_peer --peer_python PY "
    "--benchmark_flags=--config=configs/wmt.py:tiny,--batch_size=8")


def test_the_peer_comparison_points_nowhere_outside_the_repository():
  """The peer used to live outside the repository (`../../shared/peers/...`)."""
  for name in ("benchmarks/compare_peer.py", "benchmarks/torch_peer.py",
               "benchmarks/results/train_step_vs_torch.md",
               "benchmarks/results/train_step_vs_torch.json"):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
      text = f.read()
    for outside in ("shared/peers", "torch_transformer_step", "/work/", '"..", ".."'):
      assert outside not in text, (name, outside)


HLO = "\n".join([
  "ENTRY %main (p: f32[4,8]) -> f32[4,8] {",
  '  %p = f32[4,8]{1,0} parameter(0), metadata={op_name="state.params"}',
  '  %ynn_fusion.1 = f32[4,8]{1,0} fusion(%p), kind=kCustom, '
  'metadata={op_name="jit(train_step)/jvp(Transformer)/decoder/feed_forward/wi/dot_general"}',
  '  %wrapped_scatter = f32[4,8]{1,0} fusion(%p), kind=kLoop, '
  'metadata={op_name="jit(train_step)/transpose(jvp(Transformer))/encoder/embed/scatter-add"}',
  '  %argmax = (f32[4]{0}, s32[4]{0}) fusion(%p), kind=kLoop, '
  'metadata={op_name="jit(train_step)/jvp()/reduce"}',
  "  %while.3 = f32[4,8]{1,0} while(%p), condition=%c, body=%b",
  "  %copy.7 = f32[4,8]{1,0} copy(%p)",
  '  ROOT %add.2 = f32[4,8]{1,0} fusion(%p), kind=kLoop, metadata={op_name="jit(train_step)/sqrt"}',
  "}",
])


def test_op_profile_sums_ops_per_step_by_part():
  """Trace events named after instructions of the module count (loops do not: their bodies are
  events of their own); other events (Python frames, the runtime) are left out."""
  seconds = {"ynn_fusion.1": 6.0, "wrapped_scatter": 2.0, "argmax": 1.0, "copy.7": 0.5,
             "add.2": 0.5, "while.3": 100.0, "ThunkExecutor::Execute": 50.0, "$main.py:1": 9.0}
  p = step_cost.op_profile(seconds, HLO, steps=2, top=3)
  assert p["op_seconds_per_step"] == pytest.approx(5.0)
  assert [(o["op"], o["seconds"], o["shape"]) for o in p["top_ops"]] == [
    ("ynn_fusion.1", 3.0, "f32[4,8]"), ("wrapped_scatter", 1.0, "f32[4,8]"),
    ("argmax", 0.5, "(f32[4], s32[4])")]
  assert p["top_ops"][0]["share"] == pytest.approx(0.6)
  assert {c["category"]: c["seconds"] for c in p["categories"]} == pytest.approx({
    "feed-forward": 3.0, "embedding lookup and its gradient": 1.0,
    "loss: log-softmax, cross-entropy, argmax": 0.5, "copies without a source": 0.25,
    "optimizer and metrics: Adam, norms, non-finite guard": 0.25})


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse4_2 avx avx2 fma bmi2

processor\t: 1
model name\t: should not be read
"""


@pytest.mark.parametrize("flags, kind", [
  ("sse4_2 avx avx2 fma", "x86-64 AVX2"),
  ("avx avx2 fma avx512f avx512bw avx512vl avx512_bf16", "x86-64 AVX-512"),
  ("avx2 avx512f amx_tile amx_bf16 amx_int8", "x86-64 AVX-512 + AMX"),
  ("fp asimd", "arm64 NEON"),
  ("", "riscv64"),
])
def test_cpu_kind_from_the_flags(flags, kind):
  from measuring import report

  assert report.cpu_kind(set(flags.split()), "riscv64") == kind
  restricted = report.cpu_kind(set(flags.split()), "x", "--xla_foo=1 --xla_cpu_max_isa=AVX2")
  assert restricted.endswith("(AVX2 only for XLA: --xla_cpu_max_isa=AVX2)")


def test_cpu_info_reads_the_first_processor(tmp_path, monkeypatch):
  from measuring import report

  path = tmp_path / "cpuinfo"
  path.write_text(CPUINFO)
  monkeypatch.setenv("XLA_FLAGS", "")
  info = report.cpu_info(str(path))
  assert info == {"model_name": "AMD EPYC 7B13", "family": 25, "model": 1,
                  "vendor": "AuthenticAMD", "vector_extensions": ["avx2", "fma"],
                  "kind": "x86-64 AVX2"}
  missing = report.cpu_info(str(tmp_path / "none"))  # not Linux: what the platform knows
  assert missing["family"] is None and missing["vector_extensions"] is None
  assert missing["model_name"] and missing["kind"]


def test_commands_name_the_variables_that_choose_kernels(monkeypatch):
  from measuring import report

  for name in report.KERNEL_ENV:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("CT2_FORCE_CPU_ISA", "AVX2")
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.setenv("OMP_NUM_THREADS", "")  # set but empty: left out
  command = report.command_line(["experiments/x.py", "--a=1"])
  assert command.startswith("XLA_FLAGS='' CT2_FORCE_CPU_ISA=AVX2 ")
  assert "OMP_NUM_THREADS" not in command and command.endswith("--a=1")
