"""After training: a self-contained workdir translates corpora (n-best lists, sampling, jsonl,
resume) and scores pairs, from the workdir alone."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.xla_flags import FAST_COMPILE
from transformer import infer
from transformer import workdir as workdir_lib
from transformer.data import numbers as nb
from transformer.data import vocabulary
from transformer.decoding import files
from transformer.errors import UserError

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = [
  "--config.data.vocab_size=256", "--config.model.vocab_size=256", "--config.model.num_layers=1",
  "--config.model.d_model=32", "--config.model.d_ff=64", "--config.data.tokens_per_batch=512",
  "--config.data.packed_source_len=64", "--config.data.packed_target_len=48",
  "--config.data.heldout_pairs=30", "--config.data.spm_train_sentences=2000",
  "--config.optimizer.warmup_steps=10", "--config.num_train_steps=12",
  "--config.checkpoint_every_steps=6", "--config.evals.valid_loss.every_steps=100",
  "--config.log_every_steps=6", "--config.evals.valid_translation.sentences=8",
  "--config.decode.beam_size=3",
  "--config.decode.max_extra_len=5", "--config.average_last_checkpoints=0",
]


def run_main(*args, stdin=None, timeout=600):
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE)
  return subprocess.run([sys.executable, "-m", "transformer.main", *args], cwd=REPO, env=env,
                        input=stdin, capture_output=True, text=True, timeout=timeout)


def one_error_line(stderr):
  lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
  assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
  return lines[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A run of configs/text.py trained on files that are then deleted, its workdir moved."""
  root = tmp_path_factory.mktemp("corpus")
  pairs = list(nb.generate("train", 600))
  for i, lang in enumerate(("en", "de")):
    (root / f"train.{lang}").write_text("".join(p[i] + "\n" for p in pairs))
  trained = root / "trained"
  proc = run_main("--config=configs/text.py:en-de,small",
                  f"--config.data.train_files.en={root}/train.en",
                  f"--config.data.train_files.de={root}/train.de", *TINY,
                  f"--workdir={trained}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Test chrF" in proc.stdout and "Test TER" in proc.stdout
  records = [json.loads(ln) for ln in (trained / "metrics.jsonl").read_text().splitlines()]
  keys = set().union(*records)
  for key in ("eval/bleu", "eval/chrf", "eval/ter", "test/bleu", "test/chrf", "test/ter"):
    assert key in keys, key
  # A copy elsewhere, without the corpus or its token cache: the workdir is all there is.
  moved = root / "moved"
  shutil.copytree(trained, moved, ignore=shutil.ignore_patterns("cache"))
  shutil.rmtree(trained)
  for lang in ("en", "de"):
    os.remove(root / f"train.{lang}")
  return str(moved)


@pytest.fixture(scope="module")
def restored(workdir):
  config = workdir_lib.load(workdir)
  return config, infer.restore(config, workdir)


SOURCES = ["seven", "three hundred and forty-two", "", "twelve thousand and one", "nine"]


def test_the_workdir_alone_translates_nbest_samples_and_scores(workdir, tmp_path):
  text = "\n".join(SOURCES) + "\n"
  plain = run_main("--mode=translate", f"--workdir={workdir}", stdin=text)
  assert plain.returncode == 0, plain.stderr[-3000:]
  assert len(plain.stdout.splitlines()) == len(SOURCES)
  assert "sentences/s" in plain.stderr  # the progress line

  nbest = run_main("--mode=translate", f"--workdir={workdir}", "--nbest=3",
                   "--output_format=jsonl", stdin=text)
  assert nbest.returncode == 0, nbest.stderr[-3000:]
  objects = [json.loads(ln) for ln in nbest.stdout.splitlines()]
  assert [o["source"] for o in objects] == SOURCES
  for obj, best in zip(objects, plain.stdout.splitlines(), strict=True):
    if not obj["source"]:
      assert obj["hypotheses"] == []
      continue
    hyps = obj["hypotheses"]
    assert 1 <= len(hyps) <= 3 and hyps[0]["text"] == best
    scores = [h["score"] for h in hyps]
    assert scores == sorted(scores, reverse=True)
    assert all(h["logprob"] <= 0 for h in hyps)

  samples = run_main("--mode=translate", f"--workdir={workdir}", "--nbest=2",
                     "--config.decode.method=sample", "--config.decode.top_k=5", stdin=text)
  assert samples.returncode == 0, samples.stderr[-3000:]
  assert len(samples.stdout.splitlines()) == 2 * len(SOURCES)  # N lines per source

  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("seven\tsieben\nnine\tneun\n")
  scored = run_main("--mode=score", f"--workdir={workdir}", f"--input={pairs}",
                    f"--output={tmp_path / 'scores.jsonl'}")
  assert scored.returncode == 0, scored.stderr[-3000:]
  lines = [json.loads(ln) for ln in (tmp_path / "scores.jsonl").read_text().splitlines()]
  assert len(lines) == 2 and all(set(ln) == {"logprob", "tokens", "perplexity"} for ln in lines)
  for ln in lines:
    assert ln["perplexity"] == pytest.approx(np.exp(-ln["logprob"] / ln["tokens"]))


def test_a_model_field_differing_from_the_saved_config_is_one_line(workdir, tmp_path):
  out = tmp_path / "out.txt"
  proc = run_main("--mode=translate", f"--workdir={workdir}", "--config.model.d_model=64",
                  f"--output={out}", stdin="seven\n")
  assert proc.returncode == 2
  assert "model.d_model" in one_error_line(proc.stderr)
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("args,name", [
  (["--nbest=4"], "--nbest"),  # above the beam size (3)
  (["--config.decode.method=greedy", "--nbest=2"], "--nbest"),
  (["--config.decode.method=nucleus"], "decode.method"),
  (["--config.decode.top_p=1.5"], "decode.top_p"),  # each field's range: test_validate
  (["--config.decode.temperature=0.0"], "decode.temperature"),
  (["--output_format=xml"], "--output_format"),
  (["--checkpoint=best-ish"], "--checkpoint"),
])
def test_bad_translate_requests_are_one_line_and_write_nothing(workdir, tmp_path, args, name):
  source = tmp_path / "in.txt"
  source.write_text("seven\n")
  out = tmp_path / "out.txt"
  proc = run_main("--mode=translate", f"--workdir={workdir}", f"--input={source}",
                  f"--output={out}", *args)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert name in one_error_line(proc.stderr)
  assert sorted(os.listdir(tmp_path)) == ["in.txt"]


@pytest.mark.parametrize("content,what", [
  ("seven\tsieben\nnine neun\n", "line 2 has no tab"),
  ("seven\tsieben\nnine\t  \n", "line 2 has an empty target"),
])
def test_bad_score_input_is_one_line_and_writes_nothing(workdir, tmp_path, content, what):
  source = tmp_path / "pairs.tsv"
  source.write_text(content)
  proc = run_main("--mode=score", f"--workdir={workdir}", f"--input={source}",
                  f"--output={tmp_path / 'out.jsonl'}")
  assert proc.returncode == 2
  assert what in one_error_line(proc.stderr)
  assert sorted(os.listdir(tmp_path)) == ["pairs.tsv"]


def test_an_existing_output_is_never_overwritten(workdir, tmp_path):
  out = tmp_path / "out.txt"
  out.write_text("precious\n")
  proc = run_main("--mode=translate", f"--workdir={workdir}", f"--output={out}", stdin="seven\n")
  assert proc.returncode == 2 and "--output" in one_error_line(proc.stderr)
  assert out.read_text() == "precious\n"


def _translate(config, restored, tmp_path, name, lines, nbest=1, fmt="jsonl", **decode):
  source = tmp_path / "in.txt"
  source.write_text("".join(ln + "\n" for ln in lines))
  out = tmp_path / name
  with config.unlocked():
    config.decode.chunk_size = 4
    for k, v in decode.items():
      config.decode[k] = v
  model = restored
  from transformer.decoding.translate import Search, Translator

  model.translator = Translator(model.translator.model_config, config.decode,
                                model.translator.mesh, model.layout.param_shardings,
                                model.translator.bucket_lengths)
  settings = {"nbest": nbest, "format": fmt, "search": str(Search.from_config(config.decode))}
  files.translate_corpus(files.CorpusRun(model, str(source), str(out), settings), config,
                          nbest, fmt)
  return out.read_text() if out.exists() else None


@pytest.mark.parametrize("method", ["beam", "greedy", "sample"])
def test_hypotheses_log_probs_are_their_teacher_forced_scores(restored, method):
  import jax
  import jax.numpy as jnp

  from transformer.decoding.translate import Search, decode_hypotheses, target_log_probs

  config, model = restored
  nbest = 1 if method == "greedy" else 3
  search = Search(method=method, beam_size=3, alpha=0.6, max_extra_len=5, top_k=8)
  sources = [model.tokenizer.encode(s) for s in SOURCES if s]
  inputs = np.zeros((len(sources), 16), np.int32)
  for row, ids in enumerate(sources):
    inputs[row, :len(ids)] = ids
  mc = model.layout.model_config
  seqs, scores, log_probs = jax.jit(lambda p, x: decode_hypotheses(
    p, x, mc, search, nbest=nbest, max_len=24))(model.params, jnp.asarray(inputs))
  seqs, scores, log_probs = map(np.asarray, (seqs, scores, log_probs))
  assert seqs.shape == (len(sources), nbest, 24)
  flat = seqs.reshape(-1, 24)
  forced = np.asarray(target_log_probs(model.params, jnp.asarray(np.repeat(inputs, nbest, 0)),
                                       jnp.asarray(flat), mc))
  checked = 0
  for row, seq in enumerate(flat):
    tokens = seq.tolist()
    if 1 not in tokens or 0 in tokens[: tokens.index(1)]:
      continue  # padding emitted inside a hypothesis: teacher forcing would skip it
    b, n = divmod(row, nbest)
    assert log_probs[b, n] == pytest.approx(forced[row], rel=1e-4, abs=1e-4)
    lp = ((5.0 + tokens.index(1) + 1) / 6.0) ** 0.6
    assert scores[b, n] == pytest.approx(log_probs[b, n] / lp, rel=1e-5, abs=1e-5)
    checked += 1
  assert checked >= len(flat) // 2


def test_score_mode_mean_nll_is_the_evaluation_loss(restored):
  """Sum of -logprob over the pairs' tokens / their token count = eval loss without label
  smoothing, on the same pairs."""
  from transformer.training.evaluators import evaluate_loss
  from transformer.training.trainer import Trainer

  config, model = restored
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.label_smoothing = 0.0
  pairs = list(nb.generate("test", 40))
  ids = [(model.tokenizer.encode(s), model.tokenizer.encode(t)) for s, t in pairs]
  log_probs = model.translator.score_ids(model.params, ids)
  tokens = sum(len(t) for _, t in ids)
  nll = -sum(log_probs) / tokens

  trainer = Trainer(config, model.layout.mesh, model.layout.model_config)
  length = 64
  batch = {"inputs": np.zeros((40, length), np.int32), "targets": np.zeros((40, length), np.int32)}
  for row, (s, t) in enumerate(ids):
    batch["inputs"][row, :len(s)] = s
    batch["targets"][row, :len(t)] = t
  record = evaluate_loss(trainer, model.params, [batch], "eval")
  assert nll == pytest.approx(record["eval/loss"], rel=1e-5)


def test_an_interrupted_translation_resumes_to_the_same_file(restored, tmp_path, monkeypatch):
  config, model = restored
  config = config.copy_and_resolve_references()
  lines = [" and ".join(["seven", "nine", "twelve"][: 1 + i % 3]) + f" {i}" for i in range(11)]
  whole = _translate(config, model, tmp_path, "whole.txt", lines, nbest=2, fmt="text")

  calls = []
  original = files.ResumableOutput.write

  def write_then_die(self, text, n):
    calls.append(n)
    original(self, text, n)
    if len(calls) == 2:
      raise KeyboardInterrupt  # a kill after the second chunk

  monkeypatch.setattr(files.ResumableOutput, "write", write_then_die)
  with pytest.raises(KeyboardInterrupt):
    _translate(config, model, tmp_path, "part.txt", lines, nbest=2, fmt="text")
  assert not (tmp_path / "part.txt").exists() and (tmp_path / "part.txt.partial").exists()
  # Bytes of a chunk written after the last recorded state are dropped on resume.
  with open(tmp_path / "part.txt.partial", "a") as f:
    f.write("half a chunk\n")
  searched = []
  search_ids = type(model.translator).search_ids
  monkeypatch.setattr(type(model.translator), "search_ids",
                      lambda self, params, sources, *a, **k:
                      searched.append(len(sources)) or search_ids(self, params, sources, *a, **k))
  resumed = _translate(config, model, tmp_path, "part.txt", lines, nbest=2, fmt="text")
  assert resumed == whole
  assert sum(searched) == len(lines) - 8  # the two finished chunks (4 lines each) not redone
  assert not (tmp_path / "part.txt.partial").exists()


def test_a_partial_output_of_other_settings_is_refused(restored, tmp_path, monkeypatch):
  config, model = restored
  config = config.copy_and_resolve_references()
  monkeypatch.setattr(files.ResumableOutput, "finish", lambda self: None)
  _translate(config, model, tmp_path, "out.txt", ["seven", "nine"], nbest=1, fmt="text")
  monkeypatch.undo()
  from transformer.errors import UserError

  with pytest.raises(UserError, match="other settings"):
    _translate(config, model, tmp_path, "out.txt", ["seven", "nine"], nbest=2, fmt="text")


def test_samples_depend_on_the_seed_not_on_the_mesh_or_the_batch(workdir, tmp_path):
  lines = ["seven", "three hundred", "nine", "twelve and one", "five"] * 2
  outputs = {}
  for name, mesh, batch in (("8x1", (-1, 1), 64), ("2x4", (2, 4), 64), ("small", (-1, 1), 8)):
    config = workdir_lib.load(workdir)
    with config.unlocked():
      config.mesh.data, config.mesh.fsdp = mesh
      config.decode.batch_size = batch
      config.decode.method = "sample"
      config.decode.seed = 7
    model = infer.restore(config, workdir)
    found = model.translator.search_ids(
      model.params, [model.tokenizer.encode(s) for s in lines], 3)
    outputs[name] = [[h.ids for h in hyps] for hyps in found]
  assert outputs["8x1"] == outputs["2x4"] == outputs["small"]
  # The same source at another line number draws other samples; one line's samples differ.
  assert outputs["8x1"][0] != outputs["8x1"][5] or outputs["8x1"][1] != outputs["8x1"][6]
  assert any(len({tuple(s) for s in hyps}) > 1 for hyps in outputs["8x1"])


def test_translation_gives_the_same_outputs_on_one_and_on_several_cpu_devices(workdir, tmp_path):
  """--mode=translate splits each batch over a CPU device per core (cpu_devices.py): the
  hypotheses are those of one device, and of three (uneven parts); their scores, sums over
  other batch shapes, may move in their last bits."""
  source = tmp_path / "in.txt"
  source.write_text("".join(s + "\n" for s, _ in nb.generate("test", 40)))
  outputs = {}
  for devices in (None, 1, 3):
    out = tmp_path / f"out-{devices}.jsonl"
    flag = [] if devices is None else [f"--cpu_devices={devices}"]
    proc = run_main("--mode=translate", f"--workdir={workdir}", f"--input={source}",
                    f"--output={out}", "--nbest=2", "--output_format=jsonl", *flag)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if devices is not None:
      assert f"{devices} JAX CPU devices" in proc.stderr
    outputs[devices] = [json.loads(ln) for ln in out.read_text().splitlines()]
  assert len(outputs[1]) == 40

  def texts(objects):
    return [[h["text"] for h in o["hypotheses"]] for o in objects]

  def scores(objects):
    return [h[k] for o in objects for h in o["hypotheses"] for k in ("score", "logprob")]

  assert texts(outputs[None]) == texts(outputs[1]) == texts(outputs[3])
  for devices in (None, 3):
    np.testing.assert_allclose(scores(outputs[devices]), scores(outputs[1]), rtol=1e-5)

  bad = run_main("--mode=translate", f"--workdir={workdir}", f"--input={source}",
                 f"--output={tmp_path / 'never.txt'}", "--cpu_devices=0")
  assert bad.returncode == 2 and "--cpu_devices=0" in one_error_line(bad.stderr)
  assert not (tmp_path / "never.txt").exists()


def test_check_request_refuses_bad_flags_before_work(tmp_path):
  from transformer.decoding.translate import Search
  from transformer.errors import UserError

  beam = Search(method="beam", beam_size=4)
  with pytest.raises(UserError, match="--nbest=5"):
    files.check_request("translate", 5, "text", beam, None, None)
  with pytest.raises(UserError, match="--input"):
    files.check_request("translate", 1, "text", beam, str(tmp_path / "nope"), None)
  with pytest.raises(UserError, match="--mode=score needs --input"):
    files.check_request("score", 1, "jsonl", beam, None, None)
  files.check_request("translate", 100, "jsonl", Search(method="sample"), None, None)


def test_the_corpus_benchmark_translates_the_same_file_with_both(workdir):
  from benchmarks import corpus_translation

  batches = (("examples", 8), ("tokens", 256))
  record = corpus_translation.run_benchmark(workdir, None, lines=24, rounds=1, threads=1,
                                            ct2_batches=batches, decode={"batch_size": 8},
                                            lockstep=True)
  assert record["lines"] == 24 and [r["search"] for r in record["rows"]] == ["beam 4", "greedy"]
  for row in record["rows"]:
    assert row["ours_sentences_per_s"] > 0
    # In-flight batching and lockstep batches write the same lines.
    assert row["lockstep"]["same_lines"] == 1.0 and row["lockstep"]["sentences_per_s"] > 0
    assert [c["batch"] for c in row["ct2"]] == ["8 sentences", "256 tokens"]
    # The ratio is against CTranslate2's fastest batching.
    assert row["ct2_s"] == min(c["s"] for c in row["ct2"])
    assert 0.0 <= row["same_lines"] <= 1.0
  report = "\n".join(corpus_translation.report_lines(record))
  assert "ours / CTranslate2" in report and "256 tokens per batch" in report
  assert "in-flight / lockstep" in report and "decode.batch_size=8" in report
  assert corpus_translation.parse_decode("batch_size=256,in_flight=False,tag=>>fr<<") == {
    "batch_size": 256, "in_flight": False, "tag": ">>fr<<"}
  with pytest.raises(ValueError, match="FIELD=VALUE"):
    corpus_translation.parse_decode("batch_size")
  assert corpus_translation.parse_batches("examples:64,tokens:16384") == (
    ("examples", 64), ("tokens", 16384))
  for bad in ("sentences:64", "tokens:0", "tokens"):
    with pytest.raises(ValueError, match=bad):
      corpus_translation.parse_batches(bad)


def test_the_startup_benchmark_times_the_parts_and_the_whole_process(workdir, tmp_path):
  from benchmarks import startup

  lines = ["one hundred and two", "seven", "forty-one thousand and nine"]
  (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
  cache = str(tmp_path / "cache")
  parts = startup.parts(workdir, cache, str(tmp_path / "in.txt"))
  assert set(parts) == {"imports", "restore", "programs", "search", "lengths"}
  # The programs' time is a difference of two searches' (near 0 when they were kept).
  assert parts["lengths"] >= 1 and all(parts[k] > 0 for k in ("imports", "restore", "search"))
  assert os.listdir(cache)  # the programs were kept for the next process
  seconds, one = startup.whole(workdir, cache, None, None, sentence=lines[0])
  assert seconds > 0 and len(one.splitlines()) == 1
  _, out = startup.whole(workdir, cache, str(tmp_path / "in.txt"), str(tmp_path / "out.txt"),
                         sentence=lines[0])
  assert out.splitlines()[0] == one.strip() and len(out.splitlines()) == 3
  row = {"input": "3 lines", "whole cold": seconds, "whole warm": seconds, "parts cold": parts,
         "parts warm": parts, "ctranslate2": 1.0, "ctranslate2 by batch": {"64 sentences": 1.0},
         "baseline cold": seconds, "baseline warm": seconds, "same output": False,
         "programs": startup.kept_programs(cache), "baseline programs": 9}
  report = "\n".join(startup.report_lines({
    "workdir": workdir, "parameters": "1 parameter", "beam": 4, "lines": 3, "threads": 1,
    "rows": [row], "input": "in.txt", "sentence": lines[0], "baseline": "/elsewhere"}))
  assert "| 3 lines | cold |" in report and "3 lines of in.txt" in report
  assert "| 3 lines | warm | " in report and "| 1.00x | **no** | 9 -> " in report
  assert startup.kept_programs(cache) >= 1 and startup.kept_programs(str(tmp_path)) == 0


def test_the_corpus_benchmark_reads_a_short_input_again_from_its_start(tmp_path):
  from benchmarks import corpus_translation

  (tmp_path / "in.txt").write_text("one\ntwo\nthree")  # no newline at the end
  corpus_translation.write_lines_of(str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), 7)
  assert (tmp_path / "out.txt").read_text().splitlines() == [
    "one", "two", "three", "one", "two", "three", "one"]
  (tmp_path / "empty.txt").write_text("")
  with pytest.raises(UserError, match="empty.txt: the file is empty"):
    corpus_translation.write_lines_of(str(tmp_path / "empty.txt"), str(tmp_path / "x"), 3)


def test_noisy_pairs_misaligns_exactly_and_counts_what_the_scores_catch(workdir):
  from experiments import noisy_pairs

  pairs = [(f"s{i}", f"t{i}") for i in range(50)]
  noisy, chosen = noisy_pairs.noisy_corpus(pairs, 0.1, seed=3)
  assert len(chosen) == 5
  assert [i for i, (p, q) in enumerate(zip(pairs, noisy, strict=True)) if p != q] == sorted(chosen)
  assert all(noisy[i][0] == pairs[i][0] for i in range(50))  # sources untouched
  assert noisy_pairs.caught([0.0, -5.0, 1.0, -4.0], {1, 2}) == 1

  record = noisy_pairs.run(workdir, 40, 0.1, seed=0)
  assert record["noisy"] == 4 and len(record["lowest"]) == 5
  assert 0 <= record["caught_by_perplexity"] <= 4


def test_translation_pads_to_the_buckets_training_resolved(workdir, restored):
  _, model = restored
  with open(os.path.join(workdir, "buckets.json")) as f:
    buckets = json.load(f)
  assert buckets and model.translator.bucket_lengths == buckets
  assert model.translator.pad_length(buckets[0]) == buckets[0]


def test_an_edited_training_file_is_not_read_with_the_old_vocabulary(workdir, tmp_path):
  """Training again on the run's files, one of them edited since: the vocabulary and the token
  cache of the old content are not reused, one line, exit 2, nothing changed."""
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  files = workdir_lib.load(workdir).data.train_files
  pairs = list(nb.generate("train", 600))
  pairs[7] = ("new", "neu")
  try:
    for i, lang in enumerate(("en", "de")):
      with open(files[lang], "w") as f:
        f.write("".join(p[i] + "\n" for p in pairs))
    proc = run_main("--config=configs/text.py:en-de,small",
                    f"--config.data.train_files.en={files.en}",
                    f"--config.data.train_files.de={files.de}", *TINY, f"--workdir={copy}")
  finally:
    for lang in ("en", "de"):
      os.remove(files[lang])
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "was trained on other data" in one_error_line(proc.stderr)
  assert not os.path.exists(copy / "cache")


def test_compare_mode_tests_workdirs_and_files(workdir, tmp_path):
  """`--mode=compare`: a workdir against itself is never significant; the references as a
  system beat it significantly; the JSON holds every number of the table."""
  pairs = list(nb.generate("test", 40))
  (tmp_path / "src.txt").write_text("".join(s + "\n" for s, _ in pairs))
  (tmp_path / "ref.txt").write_text("".join(t + "\n" for _, t in pairs))
  out = tmp_path / "compare.json"
  proc = run_main("--mode=compare", f"--references={tmp_path}/ref.txt",
                  f"--input={tmp_path}/src.txt",
                  f"--systems=model={workdir},again={workdir}@latest,oracle={tmp_path}/ref.txt",
                  "--bootstrap_samples=200", "--randomization_trials=400", f"--output={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| model |" in proc.stdout and "| oracle |" in proc.stdout
  result = json.loads(out.read_text())
  assert result["systems"] == ["model", "again", "oracle"] and result["sentences"] == 40
  for metric in ("bleu", "chrf", "ter"):
    again = result["results"]["again"][metric]
    assert again["p_bootstrap"] == 1.0 and again["p_randomization"] == 1.0
    oracle = result["results"]["oracle"][metric]
    assert oracle["p_bootstrap"] < 0.01 and oracle["p_randomization"] < 0.01, (metric, oracle)
  assert result["results"]["oracle"]["bleu"]["score"] == pytest.approx(100.0)


def test_compare_mode_refuses_a_file_of_another_length_before_any_work(workdir, tmp_path):
  (tmp_path / "ref.txt").write_text("a\nb\nc\n")
  (tmp_path / "short.txt").write_text("a\nb\n")
  proc = run_main("--mode=compare", f"--references={tmp_path}/ref.txt",
                  f"--systems={tmp_path}/ref.txt,{tmp_path}/short.txt",
                  f"--output={tmp_path}/out.json")
  assert proc.returncode == 2
  assert "short.txt: 2 lines" in one_error_line(proc.stderr)
  assert not (tmp_path / "out.json").exists()


def _mode(mode, config, workdir, tmp_path, name, lines, **request):
  """`modes.MODES[mode]` in this process on `lines` (a file), its output read back."""
  from transformer import modes

  source = tmp_path / f"{name}.in"
  source.write_text("".join(ln + "\n" for ln in lines))
  out = tmp_path / name
  modes.MODES[mode](config.copy_and_resolve_references(), workdir,
                    modes.Request(input=str(source), output=str(out), **request))
  return out.read_text()


SENTENCES = ["seven", "three hundred and five", "twelve thousand", "forty-two", "nine"]


def test_a_workdir_ensembled_with_itself_translates_and_scores_as_itself(workdir, tmp_path):
  config = workdir_lib.load(workdir)
  for fmt, nbest in (("text", 1), ("jsonl", 2)):
    alone = _mode("translate", config, workdir, tmp_path, f"alone.{fmt}", SENTENCES,
                  nbest=nbest, output_format=fmt)
    both = _mode("translate", config, workdir, tmp_path, f"both.{fmt}", SENTENCES,
                 nbest=nbest, output_format=fmt, ensemble=(workdir,))
    assert both == alone
  pairs = [f"{s}\t{t}" for s, t in nb.generate("test", 6)]
  assert (_mode("score", config, workdir, tmp_path, "both.scores", pairs, ensemble=(workdir,))
          == _mode("score", config, workdir, tmp_path, "alone.scores", pairs))


def test_bad_ensembles_are_refused_before_any_work(workdir, tmp_path):
  from transformer.errors import UserError

  config = workdir_lib.load(workdir)
  for request, match in (({"ensemble": (str(tmp_path / "none"),)}, "member .*none"),
                         ({"ensemble": (workdir,), "ensemble_weights": (1.0, 2.0, 3.0)},
                          "3 weights for 2 models"),
                         ({"ensemble": (workdir,), "ensemble_weights": (1.0, 0.0)}, "> 0"),
                         ({"ensemble_weights": (1.0,)}, "needs --ensemble")):
    with pytest.raises(UserError, match=match):
      _mode("translate", config, workdir, tmp_path, "out.txt", SENTENCES, **request)
    assert not (tmp_path / "out.txt").exists()


def test_mbr_in_translate_mode_ranks_by_expected_utility(workdir, tmp_path):
  config = workdir_lib.load(workdir)
  config.decode.method, config.decode.mbr_candidates = "mbr", 4
  text = _mode("translate", config, workdir, tmp_path, "mbr.jsonl", SENTENCES, nbest=3,
               output_format="jsonl")
  for line in text.splitlines():
    utilities = [h["utility"] for h in json.loads(line)["hypotheses"]]
    assert len(utilities) == 3 and utilities == sorted(utilities, reverse=True)
  config.decode.mbr_candidates = 0
  from transformer.errors import ConfigError

  with pytest.raises(ConfigError, match="decode.mbr_candidates"):
    _mode("translate", config, workdir, tmp_path, "none.jsonl", SENTENCES)


def test_a_forced_prefix_of_the_greedy_output_leaves_it_and_a_long_one_is_refused(workdir,
                                                                                   tmp_path):
  from transformer.errors import UserError

  config = workdir_lib.load(workdir)
  config.decode.method = "greedy"
  plain = _mode("translate", config, workdir, tmp_path, "plain.txt", SENTENCES).splitlines()
  tokenizer = vocabulary.stored_tokenizer(workdir)

  def head(out):
    """The output's first word, where it leaves the rest of the output (and its EOS) to go."""
    word = " ".join(out.split()[:1])
    return word if len(tokenizer.encode(word)) < len(tokenizer.encode(out)) else ""

  prefixed = [f"{s}\t{head(out)}" for s, out in zip(SENTENCES, plain, strict=True)]
  assert any(p.split("\t")[1] for p in prefixed)
  assert _mode("translate", config, workdir, tmp_path, "prefixed.txt", prefixed,
               target_prefix=True).splitlines() == plain
  empty = [f"{s}\t" for s in SENTENCES]
  assert _mode("translate", config, workdir, tmp_path, "empty.txt", empty,
               target_prefix=True).splitlines() == plain
  forced = _mode("translate", config, workdir, tmp_path, "forced.jsonl",
                 [f"{SENTENCES[0]}\tdreihundert"], target_prefix=True, output_format="jsonl")
  record = json.loads(forced)
  assert record["prefix"] == "dreihundert"
  assert record["hypotheses"][0]["text"].startswith("dreihundert")
  with pytest.raises(UserError, match="line 1: the prefix has"):
    _mode("translate", config, workdir, tmp_path, "long.txt",
          [f"seven\t{' '.join(['neun'] * 200)}"], target_prefix=True)
  assert not (tmp_path / "long.txt").exists()


def test_an_evaluator_ensembles_the_evaluated_parameters_with_other_workdirs(workdir,
                                                                             tmp_path):
  """`evals.NAME.ensemble`: the newest checkpoint evaluated in an ensemble with itself (the
  workdir@latest as the member) scores exactly as alone; a member that is not a workdir is one
  error naming the field."""
  from transformer.decoding.translate import Translator
  from transformer.errors import UserError
  from transformer.training import evaluators, parameters

  config = workdir_lib.load(workdir)
  model = infer.restore(config, workdir, average=1)
  layout = model.layout
  pairs = list(nb.generate("test", 12))

  def result(ensemble):
    config.evals.test_translation.ensemble = ensemble
    context = evaluators.Context(
      layout, lambda decode: Translator(layout.model_config, decode, layout.mesh,
                                        layout.param_shardings, detokenize=model.tokenizer.decode),
      model.tokenizer, {}, {"test": pairs}, str(tmp_path), config,
      restore_members=lambda specs, what: parameters.restore_members(
        config, model.tokenizer, specs, layout.mesh, what))
    evals = evaluators.build({"test_translation": config.evals.test_translation}, context)
    return evaluators.run_all(evals, model.params, 0).metrics

  alone = result("")
  assert result(f"{workdir}@latest") == alone
  with pytest.raises(UserError, match="evals.test_translation.ensemble member"):
    result(str(tmp_path / "none"))


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_a_sentence_alone_gets_the_outputs_and_scores_it_gets_in_a_batch(restored, method):
  """A call of few sources runs a batch of fewer rows (`Translator.rows_per_batch`); each
  sentence's hypotheses and scores are those of a full batch."""
  from transformer.decoding.translate import Translator

  config, model = restored
  decode = config.decode.copy_and_resolve_references()
  decode.method = method
  nbest = 2 if method == "beam" else 1
  translator = Translator(model.translator.model_config, decode, model.translator.mesh,
                          model.layout.param_shardings, model.translator.bucket_lengths)
  sources = [model.tokenizer.encode(s) for s in SOURCES + ["eighty-one", "four", "sixty"]]
  length = translator.pad_length(max(len(s) for s in sources))
  assert translator.rows_per_batch(length, 1) < translator.rows_per_batch(length)
  assert translator.rows_per_batch(length, len(sources)) >= len(sources)
  together = translator.search_ids(model.params, sources, nbest=nbest)
  for i in (0, 1, 4):
    alone = translator.search_ids(model.params, [sources[i]], nbest=nbest)[0]
    assert [h.ids for h in alone] == [h.ids for h in together[i]]
    np.testing.assert_allclose([h.score for h in alone], [h.score for h in together[i]],
                               rtol=1e-5, atol=1e-6)
  pairs = [(s, h[0].ids) for s, h in zip(sources, together, strict=True)]
  np.testing.assert_allclose(translator.score_ids(model.params, pairs[:1]),
                             translator.score_ids(model.params, pairs)[:1], rtol=1e-5, atol=1e-6)
