"""The experiments: sweep expansion and a tiny end-to-end sweep that resumes, the heads report,
the sequence-length cost measurement, the long-range task, and the attention-map recomputation.

Tiny models and few steps only; no assertion on speed.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import numbers
from experiments import attention_weights, heads, seq_len, sweep, tasks
from measuring import measure, report, step_cost
from tests.xla_flags import FAST_COMPILE
from transformer.nn.model_family import param_count
from transformer.training.validate import model_config

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One CPU device per subprocess, and cheap XLA:CPU compiles (the tiny models do not care).
ENV = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}


# ----------------------------------------------------------------------------- sweeps


def test_heads_sweep_points():
  """configs/sweeps/heads.py: h in {1..32} x 3 seeds at fixed d_model, d_k = d_model / h."""
  s = sweep.load_sweep(os.path.join(ROOT, "configs/sweeps/heads.py"))
  assert s.name == "heads"
  assert len(s.points) == 18
  pairs = {(p.overrides["model.num_heads"], p.overrides["seed"]) for p in s.points}
  assert pairs == {(h, seed) for h in (1, 2, 4, 8, 16, 32) for seed in (0, 1, 2)}
  for p in s.points:
    assert p.name == f"h{p.overrides['model.num_heads']}-seed{p.overrides['seed']}"
    config = sweep.point_config(s, p)
    mc = model_config(config)
    assert mc.d_model == 128 and mc.num_heads == p.overrides["model.num_heads"]
    assert mc.head_dim * mc.num_heads == mc.d_model
    assert config.seed == p.overrides["seed"]
  # The base config is not modified by the points.
  assert s.config.model.num_heads == numbers.get_config().model.num_heads

  wmt = sweep.load_sweep(os.path.join(ROOT, "configs/sweeps/heads.py:wmt"))
  assert wmt.name == "heads-wmt" and wmt.config.dataset == "wmt14"
  assert [p.overrides["model.num_heads"] for p in wmt.points] == [1, 4, 8, 16, 32]
  assert {512 // p.overrides["model.num_heads"] for p in wmt.points} == set(
    v[0] for v in heads.PAPER_ROW_A.values())


def test_seq_len_sweep_points():
  s = sweep.load_sweep(os.path.join(ROOT, "configs/sweeps/seq_len.py"))
  assert [p.name for p in s.points] == ["max24", "max48", "max64"]
  for p in s.points:
    config = sweep.point_config(s, p)
    limit = int(p.name[3:])
    assert config.data.max_source_len == config.data.max_target_len == limit
    assert max(config.data.bucket_lengths) == limit
    model_config(config)


def test_expand_names_overrides_and_errors():
  points = sweep.expand([{"model.num_heads": 2, "seed": 1}, {"data.bucket_lengths": [8, 16]}])
  assert [p.name for p in points] == ["num_heads-2_seed-1", "bucket_lengths--8--16-"]
  with pytest.raises(ValueError, match="same name"):
    sweep.expand([{"seed": 1}, {"seed": 1}])
  config = numbers.get_config("tiny")
  changed = sweep.apply_overrides(config, {"model.num_heads": 2, "num_train_steps": 3})
  assert (changed.model.num_heads, changed.num_train_steps) == (2, 3)
  assert config.model.num_heads == 4  # a copy
  with pytest.raises(KeyError, match="no field"):
    sweep.apply_overrides(config, {"model.nope": 1})
  assert sweep.parse_sets(["a=3", "b=x", "c=[1, 2]", "d=true"]) == {
    "a": 3, "b": "x", "c": [1, 2], "d": True}
  assert sweep.step_time([{"train/steps_per_s": 1.0}, {"train/steps_per_s": 4.0},
                          {"train/steps_per_s": 2.0}]) == pytest.approx(0.375)


TINY_SWEEP = textwrap.dedent('''
  """A two-point sweep on configs/numbers.py:tiny for the tests."""
  from configs import numbers


  def get_config(arg=None):
    config = numbers.get_config("tiny")
    config.num_train_steps = 2
    config.log_every_steps = 1
    config.evals.valid_loss.every_steps = 2
    config.checkpoint_every_steps = 2
    config.average_last_checkpoints = 0
    config.evals.valid_translation.sentences = 4
    config.decode.beam_size = 1
    config.num_samples_to_print = 0
    return config


  def sweep(arg=None):
    return [{"model.num_heads": 2}, {"model.num_heads": 4}]
''')


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
  """Runs the tiny sweep once (two points at once, --parallel=2); returns its paths."""
  tmp = tmp_path_factory.mktemp("sweep")
  path = tmp / "tiny.py"
  path.write_text(TINY_SWEEP)
  cmd = [sys.executable, "-m", "experiments.sweep", f"--sweep={path}", f"--root={tmp}/runs",
         f"--results={tmp}/results", "--parallel=2"]
  proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  logs = "".join(p.read_text() for p in (tmp / "runs" / "tiny").glob("*/sweep.log"))
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:] + logs[-3000:]
  return tmp, cmd, proc


def test_tiny_sweep_writes_the_table_and_a_rerun_skips(tiny_sweep):
  tmp, cmd, proc = tiny_sweep
  md = (tmp / "results" / "tiny.md").read_text()
  assert (tmp / "results" / "tiny.png").stat().st_size > 0
  for name in ("num_heads-2", "num_heads-4"):
    workdir = tmp / "runs" / "tiny" / name
    assert sweep.is_finished(str(workdir))
    assert f"| {name} |" in md
    info = json.loads((workdir / "sweep_point.json").read_text())
    assert info["params"] > 0 and info["overrides"]["model.num_heads"] == int(name[-1])
  assert "python -m experiments.sweep" in md and "## Machine" in md and "2/2 points" in proc.stdout
  # Every finished row has numbers in it.
  rows = [ln for ln in md.splitlines() if ln.startswith("| num_heads-")]
  assert len(rows) == 3 and all(" - |" not in r.split("|", 4)[-1] for r in rows[:2])
  # The second point's test scores against the first's, with their p-values.
  assert "### Significance of the test scores" in md
  tests = json.loads((tmp / "results" / "tiny.json").read_text())["significance"]
  assert list(tests) == ["num_heads-4"] and tests["num_heads-4"]["baseline"] == "num_heads-2"
  for metric in ("bleu", "chrf", "ter"):
    assert 0 < tests["num_heads-4"][metric]["p_bootstrap"] <= 1
    assert 0 < tests["num_heads-4"][metric]["p_randomization"] <= 1

  before = {p: p.stat().st_mtime_ns for p in (tmp / "runs").rglob("metrics.jsonl")}
  again = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("finished, skipped") == 2
  assert "training in" not in again.stdout
  assert before == {p: p.stat().st_mtime_ns for p in (tmp / "runs").rglob("metrics.jsonl")}


def test_a_sweep_points_workdir_translates_from_the_workdir_alone(tiny_sweep):
  """The point's config.json is the one training writes: `--workdir` alone translates."""
  tmp, _, _ = tiny_sweep
  workdir = tmp / "runs" / "tiny" / "num_heads-4"
  proc = subprocess.run(
    [sys.executable, "-m", "transformer.main", "--mode=translate", f"--workdir={workdir}"],
    cwd=ROOT, env=ENV, input="three hundred and forty-seven\n", capture_output=True, text=True,
    timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert len(proc.stdout.splitlines()) == 1, proc.stdout


def test_attention_maps_command(tiny_sweep, tmp_path):
  """The command on a trained workdir: a PNG with every head of every layer."""
  tmp, _, _ = tiny_sweep
  out = tmp_path / "maps.png"
  proc = subprocess.run(
    [sys.executable, "-m", "experiments.attention_maps", "--config=configs/numbers.py:tiny",
     "--config.model.num_heads=2", f"--workdir={tmp}/runs/tiny/num_heads-2",
     "--sentence=three hundred and forty-seven", f"--out={out}"],
    cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "3 attention layers x 2 heads" in proc.stdout  # 1 + 1 layers: enc, dec self, cross
  assert out.stat().st_size > 0


def test_heads_report_from_rows(tmp_path):
  """Means over seeds by h, the paper's row (A) beside them, unfinished points listed."""
  s = sweep.load_sweep(os.path.join(ROOT, "configs/sweeps/heads.py"))
  rows = []
  for p in s.points:
    h, seed = p.overrides["model.num_heads"], p.overrides["seed"]
    done = not (h == 32 and seed == 2)
    rows.append({"name": p.name, "overrides": p.overrides, "finished": done, "step": 200,
                 "eval/perplexity": 2.0 + h / 100 + seed / 10 if done else None,
                 "eval/bleu": 20.0 + seed if done else None, "test/bleu": 21.0 if done else None,
                 "params": 692224, "step_s": 0.1 * h if done else None, "wall_s": 60.0})
  groups = heads.summarize_by_heads(rows, 128)
  assert [g["h"] for g in groups] == [1, 2, 4, 8, 16, 32]
  assert groups[0]["d_k"] == 128 and groups[-1]["d_k"] == 4 and groups[-1]["seeds"] == 2
  paths = report.write(str(tmp_path / "heads"), command="python -m experiments.heads",
                       **heads.report_parts(s, rows, str(tmp_path / "heads.png")))
  md = open(paths[0]).read()
  assert "| 1 | 128 | 3/3 | 2.110 ± 0.100 | 21.00 ± 1.00 |" in md
  assert "5.29" in md and "24.9" in md and "Vaswani" in md
  assert "Unfinished points (no test/bleu yet): h32-seed2" in md
  assert os.path.getsize(tmp_path / "heads.png") > 0
  record = json.load(open(paths[1]))  # the same result, with the command and the machine
  assert record["command"] == "python -m experiments.heads" and record["hardware"]["cpu_kind"]
  assert [g["h"] for g in record["groups"]] == [1, 2, 4, 8, 16, 32]


# ----------------------------------------------------------------------------- seq_len


@pytest.fixture(scope="module")
def tiny_cost():
  """step_cost.cost_sweep on configs/numbers.py:tiny: xla at n = 8, 16 and lstm at n = 8."""
  base = numbers.get_config("tiny")
  quiet = lambda *_: None
  return (step_cost.cost_sweep(base, ["xla"], [8, 16], 2, steps=1, max_step_s=1e-6, log=quiet)
          + step_cost.cost_sweep(base, ["lstm"], [8], 2, steps=1, log=quiet))


def test_seq_len_cost_tiny(tiny_cost):
  """Memory from compilation only, loop counts, timing and its skipping, exponent fits."""
  records = tiny_cost
  by = {(r["kind"], r["n"]): r for r in records}
  assert set(by) == {("xla", 8), ("xla", 16), ("lstm", 8)}
  for r in records:
    assert r["temp_memory_bytes"] > 0 and r["peak_memory_bytes"] >= r["temp_memory_bytes"]
  # The first length is timed; the second is predicted slower than the 1 us limit: skipped.
  assert by[("xla", 8)]["step_s"] > 0 and by[("xla", 16)]["step_s"] is None
  assert "predicted" in by[("xla", 16)]["timing_skipped"]
  assert by[("lstm", 8)]["step_s"] > 0
  assert by[("xla", 16)]["temp_memory_bytes"] > by[("xla", 8)]["temp_memory_bytes"]
  # No loop in the Transformer's step; the 1-layer LSTM has 3 scans of n (encoder forward and
  # backward directions, decoder) in the forward pass and 3 in the backward pass.
  assert by[("xla", 16)]["hlo_iterations"] == 0
  assert by[("lstm", 8)]["hlo_trip_counts"] == [8] * 6
  assert by[("lstm", 8)]["hlo_iterations"] == 6 * 8
  # Equal parameter counts (to the LSTM's nearest width).
  assert abs(by[("lstm", 8)]["params"] / by[("xla", 8)]["params"] - 1) < 0.05
  exp = measure.exponents(records, "temp_memory_bytes", 8)
  assert exp["xla"][0] > 0 and exp["lstm"] == (None, None)


def test_reports_from_records(tiny_cost, tmp_path):
  """seq_len.md and claims.md (tables, exponents, the Table 1 comparison) from tiny records."""
  from configs import long_range
  from experiments import claims

  bins = [{"bin": "1-16", "lo": 1, "hi": 16, "sentences": 3, "bleu": 50.0},
          {"bin": ">16", "lo": 17, "hi": None, "sentences": 2, "bleu": 10.0}]
  quality = {"sweep": "s.py", "sweep_name": "s", "sentences": 5, "beam_size": 1,
             "models": [{"point": "max16", "max_len": 16, "step": 3, "train_kept": 7,
                         "train_total": 9, "eval": {"bleu_all": 30.0, "bins": bins}}]}
  paths = report.write(str(tmp_path / "seq_len"), command={"cost": "c1", "quality": "c2"},
                       **seq_len.report_parts(tiny_cost, quality, 8, str(tmp_path / "s.png")))
  md = open(paths[0]).read()
  assert "c1" in md and "c2" in md and "| 16 |" in md and "not timed" in md
  assert "| 16 | 7 / 9 | 3 | 30.00 | 50.00 | 10.00 * |" in md
  models = [{"kind": k, "d_model": 8, "params": 100, "train_s": 1.0, "step_s": 0.1,
             "losses": [(1, 0.5)], "accuracy": {"2": 1.0, "400": a}, "steps": 1,
             "correct": {"2": "1" * 8, "400": c}}
            for k, a, c in (("transformer", 1.0, "1" * 8), ("lstm", 0.125, "10000000"))]
  lr = {"settings": long_range.get_config().to_dict(),
        "runs": [{"distribution": "uniform", "models": models}]}
  caches = [{"kind": k, "n": n, "bytes": 10 * n} for k in ("transformer", "lstm") for n in (8, 16)]
  paths = report.write(str(tmp_path / "claims"), command={"cost": "c3"},
                       **claims.report_parts(tiny_cost, caches, lr, 8, str(tmp_path / "claims")))
  paths += [str(tmp_path / f"claims{f}") for f in claims.FIGURES]
  md = open(paths[0]).read()
  assert "O(n^2 d)" in md and "accuracy 0.12 at d=400 (uniform)" in md and "| lstm |" in md
  # McNemar: at d=2 they never disagree (p = 1); at d=400 only the Transformer is right on 7
  # examples (p = 2 / 2^7); pooled, the same 7.
  assert "| 2 | 0 | 0 | 1 |" in md and "| 400 | 7 | 0 | 0.0156 |" in md
  assert "| all | 7 | 0 | 0.0156 |" in md
  assert all(os.path.getsize(p) > 0 for p in paths)


def test_loop_iterations_nested():
  """Nested loops multiply: 3 outer iterations with 5 inner ones each = 3 + 15."""

  def f(x):
    def outer(i, x):
      return jax.lax.fori_loop(0, 5, lambda j, y: jnp.sin(y) * (j + 1.5), x) + i
    return jax.lax.fori_loop(0, 3, outer, x)

  text = jax.jit(f).lower(jnp.ones(4)).compile().as_text()
  r = measure.loop_iterations(text)
  assert r["loops"] == 2 and r["trip_counts"] == [3, 5]
  assert r["iterations"] == 3 + 3 * 5


def test_fit_exponent_and_bins():
  ns = [64, 128, 256, 512]
  assert measure.fit_exponent(ns, [3 * n**2 for n in ns]) == pytest.approx(2.0)
  assert measure.fit_exponent(ns, [5.0 * n for n in ns]) == pytest.approx(1.0)
  assert measure.fit_exponent([64], [1.0]) is None
  assert step_cost.predict_step_s([(64, 1.0), (128, 4.0)], 256) == pytest.approx(16.0)
  bins = seq_len.length_bins([16, 24])
  assert bins == [(1, 16), (17, 24), (25, None)]
  by_bin = seq_len.bleu_by_bin([[5] * 3, [5] * 20, [5] * 30], ["a b c d", "x", "e f g h"],
                               ["a b c d", "y", "e f g h"], bins)
  assert [b["sentences"] for b in by_bin] == [1, 1, 1]
  assert by_bin[0]["bleu"] == pytest.approx(100.0) and by_bin[1]["bleu"] == pytest.approx(0.0)


# ----------------------------------------------------------------------------- long range


def test_recall_task_answers_are_the_token_d_back():
  rng = np.random.default_rng(0)
  distances = np.array([2, 3, 7, 40, 400])
  b = tasks.recall_batch(rng, distances, num_keys=8, length=410)
  assert b["inputs"].shape == (5, 1) and b["targets"].shape == (5, 410)
  for i, d in enumerate(distances):
    row = b["targets"][i]
    assert row[d] == b["answer"][i] == row[d - d]  # the answer is the token d positions back
    assert tasks.FIRST_KEY <= row[d] < tasks.FIRST_KEY + 8
    assert row[d - 1] == tasks.QUERY and row[d + 1] == tasks.EOS and not row[d + 2:].any()
    # Nothing between the key and the answer carries it: blanks only.
    assert (row[1:d - 1] == tasks.BLANK).all()
  # Changing the key changes the answer and nothing else.
  a = tasks.recall_example(5, 10)
  c = tasks.recall_example(6, 10)
  assert (a != c).nonzero()[0].tolist() == [0, 10]
  with pytest.raises(ValueError, match="distance"):
    tasks.recall_example(5, 1)
  d = tasks.sample_distances(rng, 2000, 2, 400, "log_uniform")
  assert d.min() >= 2 and d.max() <= 400 and 15 < np.median(d) < 50  # log-uniform: ~28
  u = tasks.sample_distances(rng, 2000, 2, 400, "uniform")
  assert 150 < np.median(u) < 250
  t = tasks.training_batch(rng, 64, 2, 50, num_keys=4)
  assert t["targets"].shape == (64, 52) and 2 <= t["distance"].min() <= t["distance"].max() <= 50
  assert (t["targets"][np.arange(64), t["distance"]] == t["answer"]).all()


def test_long_range_models_have_equal_parameter_counts():
  from configs import long_range as settings
  from experiments import long_range

  s = settings.get_config()
  s.update(d_model=32, layers=1, heads=2, max_distance=20)
  (tcfg, tmc), (lcfg, lmc) = long_range.model_configs(s)
  assert tmc.kind == "transformer" and lmc.kind == "lstm"
  assert tmc.vocab_size == lmc.vocab_size == tasks.vocab_size(8) == tcfg.data.vocab_size
  pt, pl = param_count(tmc), param_count(lmc)
  assert abs(pl / pt - 1) < 0.05
  # Decoding caches: the Transformer's grows with n, the LSTM's does not.
  assert measure.decode_cache_bytes(tmc, 16) > measure.decode_cache_bytes(tmc, 8)
  assert measure.decode_cache_bytes(lmc, 16) == measure.decode_cache_bytes(lmc, 8)


# ----------------------------------------------------------------------------- attention maps


def _reference_weights(record):
  """softmax(Q K^T / sqrt(d_k)) in float64 NumPy, masks built independently."""
  p = {k: np.asarray(v, np.float64) for k, v in record["params"].items()}
  xq = np.asarray(record["inputs_q"], np.float64)
  xkv = np.asarray(record["inputs_kv"], np.float64)
  q = np.einsum("bqd,dhk->bhqk", xq, p["query"])
  k = np.einsum("bsd,dhk->bhsk", xkv, p["key"])
  logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
  b, h, nq, nk = logits.shape
  allowed = np.ones((b, h, nq, nk), bool)
  if record["kv_mask"] is not None:
    allowed &= np.asarray(record["kv_mask"])[:, None, None, :]
  if record["is_causal"]:
    allowed &= np.tril(np.ones((nq, nk), bool))[None, None]
  out = np.zeros_like(logits)
  for idx in np.ndindex(b, h, nq):
    row, ok = logits[idx], allowed[idx]
    if ok.any():
      e = np.exp(row[ok] - row[ok].max())
      out[idx][ok] = e / e.sum()
  return out


def test_attention_weights_match_float64_numpy():
  from transformer.nn.model import ModelConfig
  from transformer.nn.model_family import build_model

  cfg = ModelConfig(vocab_size=24, num_layers=2, d_model=16, d_ff=32, num_heads=4,
                          dropout_rate=0.0, max_len=32, dtype="float32")
  model = build_model(cfg)
  src = jnp.array([[5, 6, 7, 8, 1, 0, 0], [9, 10, 1, 0, 0, 0, 0]], jnp.int32)
  tgt = jnp.array([[11, 12, 13, 1, 0], [14, 1, 0, 0, 0]], jnp.int32)
  import flax.linen as nn

  params = nn.unbox(jax.jit(model.init)(jax.random.key(3), src, tgt)["params"])
  records = attention_weights.capture_attention(model, params, src, tgt)
  kinds = [attention_weights.kind_of(r) for r in records]
  assert sorted(kinds) == sorted(list(attention_weights.KINDS) * 2)
  assert sorted(attention_weights.layer_of(r) for r in records) == [0, 0, 0, 1, 1, 1]
  for r in records:
    w = attention_weights.attention_weights(r)
    ref = _reference_weights(r)
    np.testing.assert_allclose(w, ref, rtol=2e-5, atol=2e-6)
    # The weights reproduce what the module computed.
    np.testing.assert_allclose(attention_weights.recompute_output(r, w), np.asarray(r["output"]),
                               rtol=1e-4, atol=1e-5)
    if r["kv_mask"] is not None:  # padded source keys get no weight
      assert np.all(w[1, :, :, 3:] == 0)
    if r["is_causal"]:
      assert np.all(np.triu(w[0, 0], 1) == 0)
  attn = attention_weights.maps(records)
  assert [m["kind"] for m in attn] == [k for k in attention_weights.KINDS for _ in range(2)]


@pytest.mark.parametrize("args, names", [
  (["experiments.claims", "--part=long_range", "--long_range.nope=3"], "--long_range.nope"),
  (["experiments.seq_len", "--config.model.nope=3"], "--config.model.nope"),
  (["benchmarks.train_step", "--config=configs/nope.py"], "configs/nope.py"),
  (["experiments.sweep", "--parallel=two"], "--parallel"),
  (["experiments.attention_maps", "--nope"], "nope"),
])
def test_a_bad_flag_is_one_line_and_exit_2(args, names):
  proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True,
                        text=True, timeout=300)
  lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
  assert proc.returncode == 2 and len(lines) == 1 and names in lines[0], proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- data techniques


def test_backtranslation_and_distillation_reports_from_records():
  """The two data experiments' reports: every system's scores and p-values against the
  baseline, the synthetic text's BLEU, the students' size and speed."""
  from experiments import backtranslation, distillation
  from transformer.decoding import significance

  refs = ["eins zwei drei", "vier fünf", "sechs sieben acht neun", "zehn"] * 5
  worse = [" ".join(r.split()[:-1]) or "x" for r in refs]

  def compared(names):
    systems = [(names[0], refs)] + [(n, worse) for n in names[1:]]
    c = significance.compare(systems, refs, bootstrap_samples=20, randomization_trials=20)
    return c.to_json(), significance.table(c)

  c, table = compared(backtranslation.SYSTEMS)
  record = {"real": 2000, "mono": 20000, "steps": 10, "vocab_size": 256,
            "reverse_test_bleu": 50.0, "synthetic_bleu": {"beam": 40.0, "sample": 20.0},
            "comparison": c, "table": table}
  md = "\n".join(backtranslation.report_lines(record))
  assert "| real pairs only | 100.00 |" in md and "baseline" in md
  assert "beam 40.00, sampling 20.00" in md and "+ tagged back-translation" in md
  c, table = compared(distillation.SYSTEMS)
  record = {"pairs": 20000, "steps": 10, "vocab_size": 256, "comparison": c, "table": table,
            "params": {distillation.SYSTEMS[0]: 25, distillation.SYSTEMS[1]: 25,
                       distillation.SYSTEMS[2]: 100},
            "sentences_per_s": dict.fromkeys(distillation.SYSTEMS, 10.0)}
  md = "\n".join(distillation.report_lines(record))
  assert "0.25 of the teacher's parameters" in md and "| teacher | 100 |" in md


def test_commands_skip_finished_runs_and_kept_outputs(tmp_path):
  """An interrupted experiment goes on where it stopped: a finished workdir (its final
  metrics written) and an existing translation are not run again, but still recorded."""
  from experiments.commands import Commands, final_metrics
  from transformer.metrics import MetricWriter

  workdir = str(tmp_path / "w")
  assert final_metrics(workdir) is None
  MetricWriter(workdir, tensorboard=False).write(5, {"test/bleu": 12.5})
  output = tmp_path / "out.txt"
  output.write_text("kept\n")
  logs = []
  commands = Commands(log=logs.append)
  commands.train("a run", workdir, ["--config=configs/numbers.py:tiny"])
  commands.translate("a translation", workdir, "in.txt", str(output))
  assert final_metrics(workdir)["test/bleu"] == 12.5 and output.read_text() == "kept\n"
  assert commands.seconds == {} and len(commands.lines) == 2
  assert "--workdir=" in commands.lines[0] and "--mode=translate" in commands.lines[1]
