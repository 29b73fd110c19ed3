"""OPUS-MT (Marian) import against Hugging Face transformers' own outputs.

tests/fixtures/marian_tiny/ is a tiny random MarianMTModel directory and `expected.json` what
transformers computed with it (written by scripts/make_marian_fixture.py in its own virtual
environment; nothing here needs torch or transformers). The fixture is imported through the
main program, and the workdir's tokenizer, teacher-forced log-probabilities, greedy search,
translate mode and CTranslate2 export are compared with transformers'.
"""

import dataclasses
import glob
import json
import os
import shutil
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.xla_flags import FAST_COMPILE
from transformer import infer, safetensors_file
from transformer import workdir as workdir_lib
from transformer.data import vocabulary
from transformer.data.marian_tokenizer import MarianTokenizer
from transformer.data.tokenizer import SOURCE, TARGET
from transformer.errors import UserError
from transformer.interop import export, marian
from transformer.nn.model import sinusoidal_positions
from transformer.nn.model_family import build_model

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "marian_tiny")
with open(os.path.join(FIXTURE, "expected.json")) as _f:
  EXPECTED = json.load(_f)
with open(os.path.join(FIXTURE, "config.json")) as _f:
  V = json.load(_f)["vocab_size"]
# float32 against float32 in another order of summation (XLA against torch).
TOLERANCE = 2e-4


def ours(marian_ids: list[int]) -> list[int]:
  """Marian ids -> the project's: (id + 1) % V."""
  return [(i + 1) % V for i in marian_ids]


def run_main(*args: str, stdin: str | None = None, timeout: int = 300):
  env = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "transformer.main", *args], cwd=REPO, env=env,
                        input=stdin, capture_output=True, text=True, timeout=timeout)


def one_error_line(proc) -> str:
  lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  return lines[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> str:
  """The fixture imported by the main program, as a user imports a model."""
  path = str(tmp_path_factory.mktemp("marian") / "imported")
  proc = run_main("--mode=import", f"--source={FIXTURE}", f"--workdir={path}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "as step 0" in proc.stdout, proc.stdout
  return path


@pytest.fixture(scope="module")
def restored(workdir):
  config = workdir_lib.load(workdir)
  return config, infer.restore(config, workdir)


def test_the_workdir_is_a_trained_one(workdir):
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["0"]
  config = workdir_lib.load(workdir)
  assert config.model.activation == "swish" and config.model.positional == "sinusoidal_halves"
  assert config.model.attention_bias and config.model.logits_bias
  assert config.model.layer_norm_epsilon == 1e-5 and config.decode.suppress_padding
  assert (config.data.source_lang, config.data.target_lang) == ("en", "de")
  assert config.data.vocab_size == config.model.vocab_size == V
  assert isinstance(vocabulary.stored_tokenizer(workdir), MarianTokenizer)


def test_tokenization_equals_marian_tokenizer(workdir):
  tokenizer = vocabulary.stored_tokenizer(workdir)
  assert tokenizer.vocab_size == V
  for text, ids in zip(EXPECTED["sources"], EXPECTED["source_ids"], strict=True):
    assert tokenizer.encode(text, side=SOURCE) == ours(ids), text
  for text, ids in zip(EXPECTED["targets"], EXPECTED["target_ids"], strict=True):
    assert tokenizer.encode(text, side=TARGET) == ours(ids), text
  batch = tokenizer.encode_batch([s.encode() for s in EXPECTED["sources"]], side=SOURCE)
  assert batch == [ours(ids) for ids in EXPECTED["source_ids"]]
  # The fixture's vocab.json lacks a few source pieces: some sentence meets one (<unk>).
  assert any(1 in ids for ids in EXPECTED["source_ids"])
  # The two SentencePiece models cut at least one sentence differently.
  assert any(tokenizer.encode(t, side=SOURCE) != tokenizer.encode(t, side=TARGET)
             for t in EXPECTED["sources"] + EXPECTED["targets"])
  for found in EXPECTED["greedy"] + EXPECTED["beam4"]:
    assert tokenizer.decode(ours(found["ids"][1:])) == found["text"]


def test_teacher_forced_log_probs_equal_transformers(restored):
  config, model = restored
  sources = [ours(ids) for ids in EXPECTED["source_ids"]]
  targets = [ours(ids) for ids in EXPECTED["target_ids"]]
  length = max(map(len, sources + targets))
  inputs = np.zeros((len(sources), length), np.int32)
  outputs = np.zeros((len(targets), length), np.int32)
  for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
    inputs[i, : len(s)], outputs[i, : len(t)] = s, t
  mc = model.translator.model_config
  logits = build_model(mc).apply({"params": model.params}, jnp.asarray(inputs),
                                 jnp.asarray(outputs))
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  for i, t in enumerate(targets):
    # Marian's column m is the project's column (m + 1) % V.
    theirs = np.roll(np.asarray(EXPECTED["teacher_forced_log_probs"][i]), 1, axis=-1)
    np.testing.assert_allclose(log_probs[i, : len(t)], theirs, atol=TOLERANCE, rtol=0)
  # The scorer of --mode=score sums the same numbers.
  scores = model.translator.score_ids(model.params, list(zip(sources, targets, strict=True)))
  for i, t in enumerate(targets):
    expected = sum(np.roll(EXPECTED["teacher_forced_log_probs"][i][j], 1)[tok]
                   for j, tok in enumerate(t))
    assert abs(scores[i] - expected) < 1e-3


def _search(config, workdir, **decode):
  config = workdir_lib.from_json(workdir_lib.to_json(config))
  for key, value in {"max_extra_len": EXPECTED["max_extra_len"], **decode}.items():
    config.decode[key] = value
  model = infer.restore(config, workdir)
  sources = [ours(ids) for ids in EXPECTED["source_ids"]]
  return model, model.translator.search_ids(model.params, sources)


def test_greedy_search_equals_generate(restored, workdir):
  model, found = _search(restored[0], workdir, method="greedy")
  for hyps, expected in zip(found, EXPECTED["greedy"], strict=True):
    # transformers' sequence: the start token (<pad>), the output, then EOS.
    assert hyps[0].ids == ours(expected["ids"][1:-1])
    assert expected["ids"][-1] == 0 and 0 not in ours(expected["ids"][1:])
    assert model.tokenizer.decode(hyps[0].ids) == expected["text"]
  # Some outputs end at the length limit (EOS forced), some before it.
  limits = [len(s) + EXPECTED["max_extra_len"] for s in EXPECTED["source_ids"]]
  ended = [len(e["ids"]) - 1 < limit for e, limit in zip(EXPECTED["greedy"], limits, strict=True)]
  assert any(ended) and not all(ended)
  # The fixture's <pad> logit is high: without decode.suppress_padding the search takes it.
  _, unbanned = _search(restored[0], workdir, method="greedy", suppress_padding=False)
  assert [h[0].ids for h in unbanned] != [h[0].ids for h in found]


def test_beam_search_with_alpha_0_equals_generate(restored, workdir):
  """Beam 4 without a length penalty: transformers' `length_penalty=0.0,
  early_stopping="never"` (sums of log-probabilities, as the project's alpha 0).

  The searches are not the same algorithm (transformers keeps K live beams from the top 2K
  extensions, the project the non-EOS ones among the top K; at the length limit transformers
  counts the forced EOS as log-probability 0), so the test compares the best hypotheses that
  end before the limit, and the score transformers gives each of its hypotheses with the
  project's teacher-forced log-probability of it.
  """
  model, found = _search(restored[0], workdir, method="beam", beam_size=4, alpha=0.0)
  compared = 0
  for src, hyps, expected in zip(EXPECTED["source_ids"], found, EXPECTED["beam4"], strict=True):
    if len(expected["ids"]) - 1 < len(src) + EXPECTED["max_extra_len"]:
      assert hyps[0].ids == ours(expected["ids"][1:-1])
      target = ours(expected["ids"][1:])
      [score] = model.translator.score_ids(model.params, [(ours(src), target)])
      assert abs(score - expected["score"]) < 1e-3
      assert abs(hyps[0].log_prob - expected["score"]) < 1e-3
      compared += 1
  assert compared >= 1
  # Beam search finds other outputs than greedy search on this model.
  assert [e["ids"] for e in EXPECTED["beam4"]] != [e["ids"] for e in EXPECTED["greedy"]]


def test_translate_mode_gives_generates_text(workdir):
  proc = run_main("--mode=translate", f"--workdir={workdir}", "--config.decode.method=greedy",
                  f"--config.decode.max_extra_len={EXPECTED['max_extra_len']}",
                  stdin="".join(s + "\n" for s in EXPECTED["sources"]))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.splitlines() == [e["text"] for e in EXPECTED["greedy"]]


def test_score_mode_gives_transformers_log_probs(workdir, tmp_path):
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("".join(f"{s}\t{t}\n" for s, t in zip(EXPECTED["sources"],
                                                           EXPECTED["targets"], strict=True)))
  proc = run_main("--mode=score", f"--workdir={workdir}", f"--input={pairs}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  scores = [json.loads(line) for line in proc.stdout.splitlines()]
  for score, ids, log_probs in zip(scores, EXPECTED["target_ids"],
                                   EXPECTED["teacher_forced_log_probs"], strict=True):
    # Targets are cut by target.spm: the ids transformers gave `text_target`.
    assert score["tokens"] == len(ids)
    expected = sum(row[i] for row, i in zip(log_probs, ids, strict=True))
    assert abs(score["logprob"] - expected) < 1e-3


def test_ctranslate2_export_decodes_as_generate(restored, tmp_path):
  ctranslate2 = pytest.importorskip("ctranslate2")
  import sentencepiece

  _, model = restored
  out = export.export_restored(model, str(tmp_path / "ct2"))
  sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(out, "source.spm"))
  translator = ctranslate2.Translator(out, device="cpu", intra_threads=1)
  pieces = model.tokenizer.pieces()
  compared = 0
  for text, src, expected in zip(EXPECTED["sources"], EXPECTED["source_ids"],
                                 EXPECTED["greedy"], strict=True):
    if text.startswith(">>") or len(expected["ids"]) - 1 >= len(src) + EXPECTED["max_extra_len"]:
      continue  # a language code is one token, not pieces; at the limit CT2 stops without EOS
    [result] = translator.translate_batch(
      [sp.encode(text, out_type=str)], beam_size=1, min_decoding_length=0,
      max_decoding_length=len(src) + EXPECTED["max_extra_len"], suppress_sequences=[["<pad>"]])
    assert [pieces.index(p) for p in result.hypotheses[0]] == ours(expected["ids"][1:-1])
    compared += 1
  assert compared >= 1


def _copy_fixture(tmp_path, drop=(), config_changes=None) -> str:
  source = str(tmp_path / "source")
  shutil.copytree(FIXTURE, source, ignore=shutil.ignore_patterns("expected.json", *drop))
  if config_changes:
    path = os.path.join(source, "config.json")
    with open(path) as f:
      config = json.load(f)
    with open(path, "w") as f:
      json.dump({**config, **config_changes}, f)
  return source


def test_a_missing_file_exits_2_naming_it(tmp_path):
  source = _copy_fixture(tmp_path, drop=("vocab.json",))
  line = one_error_line(run_main("--mode=import", f"--source={source}",
                                 f"--workdir={tmp_path / 'w'}"))
  assert "vocab.json not found" in line
  assert not (tmp_path / "w").exists()


def test_an_unsupported_activation_exits_2_naming_it(tmp_path):
  source = _copy_fixture(tmp_path, config_changes={"activation_function": "tanh"})
  line = one_error_line(run_main("--mode=import", f"--source={source}",
                                 f"--workdir={tmp_path / 'w'}"))
  assert "config.json: activation_function='tanh' is not supported" in line
  assert not (tmp_path / "w").exists()


def test_an_existing_workdir_is_never_overwritten(workdir):
  before = {f: os.path.getmtime(os.path.join(workdir, f)) for f in os.listdir(workdir)}
  line = one_error_line(run_main("--mode=import", f"--source={FIXTURE}", f"--workdir={workdir}"))
  assert f"--workdir={workdir} is not empty" in line and "checkpoints" in line
  assert {f: os.path.getmtime(os.path.join(workdir, f)) for f in os.listdir(workdir)} == before


@pytest.mark.parametrize("changes, field", [
  ({"normalize_before": True}, "normalize_before"),
  ({"decoder_layers": 3}, "decoder_layers"),
  ({"activation_dropout": 0.1}, "activation_dropout"),
  ({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings"),
  ({"pad_token_id": 5}, "pad_token_id"),
  ({"model_type": "bart"}, "model_type"),
])
def test_unsupported_config_values_are_one_line_naming_the_field(tmp_path, changes, field):
  source = _copy_fixture(tmp_path, config_changes=changes)
  with pytest.raises(UserError, match=f"config.json: {field}=") as info:
    marian.read_source(source)
  assert "\n" not in str(info.value)


def test_torch_weights_need_torch_or_are_read_with_it(tmp_path):
  source = _copy_fixture(tmp_path, drop=("model.safetensors",))
  weights = os.path.join(source, "pytorch_model.bin")
  try:
    import torch  # noqa: F401
  except ImportError:
    with pytest.raises(UserError, match="pytorch_model.bin: reading it needs torch") as info:
      marian.read_weights(weights)
    assert "model.safetensors" in str(info.value) and "\n" not in str(info.value)
    return
  from_torch = marian.read_weights(weights)
  from_safetensors = safetensors_file.read(os.path.join(FIXTURE, "model.safetensors"))
  for name, value in from_safetensors.items():
    np.testing.assert_array_equal(from_torch[name], value)


def test_a_damaged_weights_file_is_one_line(tmp_path):
  source = _copy_fixture(tmp_path)
  path = os.path.join(source, "model.safetensors")
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2])
  with pytest.raises(UserError, match="model.safetensors: tensor .* damaged or cut short"):
    marian.read_weights(path)


def test_safetensors_file_reads_what_the_format_says(tmp_path):
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  b = np.array([1.5, -2.0], np.float16)
  header = {"__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"dtype": "F16", "shape": [2], "data_offsets": [24, 28]}}
  text = json.dumps(header).encode()
  path = tmp_path / "x.safetensors"
  path.write_bytes(struct.pack("<Q", len(text)) + text + a.tobytes() + b.tobytes())
  read = safetensors_file.read(str(path))
  assert sorted(read) == ["a", "b"]
  np.testing.assert_array_equal(read["a"], a)
  np.testing.assert_array_equal(read["b"], b)
  path.write_bytes(struct.pack("<Q", 10**6) + text)
  with pytest.raises(UserError, match="cut short"):
    safetensors_file.read(str(path))


def test_sinusoids_in_halves_are_the_interleaved_ones_regrouped():
  interleaved = sinusoidal_positions(20, 8)
  halves = sinusoidal_positions(20, 8, halves=True)
  np.testing.assert_array_equal(halves, np.concatenate([interleaved[:, 0::2],
                                                        interleaved[:, 1::2]], axis=1))


def test_scanned_layers_import_to_the_same_model(restored):
  """The converted tensors also fill a model whose layers are scanned (one stacked tree)."""
  config, model = restored
  tensors = safetensors_file.read(os.path.join(FIXTURE, "model.safetensors"))
  mc = dataclasses.replace(model.translator.model_config, scan_layers=True)
  params = marian.convert_params(tensors, mc, "model.safetensors")
  src = jnp.asarray([ours(EXPECTED["source_ids"][0])], jnp.int32)
  tgt = jnp.asarray([ours(EXPECTED["target_ids"][0])], jnp.int32)
  scanned = build_model(mc).apply({"params": params}, src, tgt)
  unrolled = build_model(model.translator.model_config).apply({"params": model.params}, src, tgt)
  np.testing.assert_allclose(np.asarray(scanned), np.asarray(unrolled), atol=1e-5, rtol=0)


def test_fine_tuning_continues_the_imported_workdir(workdir, tmp_path):
  """Training with the workdir's own config, on your files in the model's languages, starts
  from the imported step 0 and leaves a workdir that translates."""
  tuned = str(tmp_path / "tuned")
  shutil.copytree(workdir, tuned)
  for lang, texts in (("en", EXPECTED["sources"]), ("de", EXPECTED["targets"])):
    (tmp_path / f"train.{lang}").write_text("".join(t + "\n" for t in texts * 8))
  proc = run_main(f"--workdir={tuned}", f"--config.data.train_files.en={tmp_path}/train.en",
                  f"--config.data.train_files.de={tmp_path}/train.de",
                  "--config.data.heldout_pairs=4", "--config.num_train_steps=2",
                  "--config.log_every_steps=1", "--config.evals.valid_loss.every_steps=2",
                  "--config.checkpoint_every_steps=2",
                  "--config.evals.valid_translation.sentences=2",
                  "--config.decode.method=greedy", timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Resumed from the checkpoint of step 0" in proc.stderr, proc.stderr[-3000:]
  assert sorted(os.listdir(os.path.join(tuned, "checkpoints"))) == ["0", "2"]
  with open(os.path.join(tuned, "metrics.jsonl")) as f:
    losses = [r["train/loss"] for r in map(json.loads, f) if "train/loss" in r]
  assert len(losses) == 2 and all(np.isfinite(losses))
  # The token cache holds the training targets as target.spm cuts them (32 of the 40 lines:
  # 4 + 4 are held out).
  [cached] = glob.glob(os.path.join(tuned, "cache", "train-*", "target.bin"))
  tokenizer = vocabulary.stored_tokenizer(tuned)
  want = [i for n in range(32) for i in tokenizer.encode(EXPECTED["targets"][n % 5], side=TARGET)]
  assert np.fromfile(cached, np.uint16).tolist() == want
  config = workdir_lib.load(tuned)
  model = infer.restore(config, tuned, average=1)
  assert model.label == "step 2"
  [[hyp]] = model.translator.search_ids(model.params, [ours(EXPECTED["source_ids"][0])], 1)
  assert hyp.ids and all(0 < i < V for i in hyp.ids)


def test_init_from_an_imported_workdir_starts_from_its_parameters_and_vocabulary(workdir,
                                                                                  tmp_path):
  """`config.init_from` of an imported workdir: a new workdir whose step 0 holds the imported
  parameters and whose vocabulary is the imported one (both SentencePiece models and the
  joint table), used to tokenize the new corpus."""
  from transformer.training.checkpoint import Checkpointer
  from transformer.training.train import train_and_evaluate

  for lang, texts in (("en", EXPECTED["sources"]), ("de", EXPECTED["targets"])):
    (tmp_path / f"train.{lang}").write_text("".join(t + "\n" for t in texts * 8))
  config = workdir_lib.load(workdir)
  config.init_from = workdir
  config.num_train_steps = 0
  config.data.heldout_pairs = 4
  config.data.train_files.en = str(tmp_path / "train.en")
  config.data.train_files.de = str(tmp_path / "train.de")
  config.evals.valid_translation.sentences = 2
  config.evals.test_translation.sentences = 2
  config.decode.method = "greedy"
  tuned = str(tmp_path / "tuned")
  result = train_and_evaluate(config, tuned)
  assert result["step"] == 0 and np.isfinite(result["eval/loss"])
  source = Checkpointer(os.path.join(workdir, "checkpoints"), None).restore(0, None)
  started = Checkpointer(os.path.join(tuned, "checkpoints"), None).restore(0, None)
  jax.tree.map(np.testing.assert_array_equal, started["params"], source["params"])
  copied = sorted(os.path.relpath(os.path.join(d, f), os.path.join(tuned, "vocab"))
                  for d, _, files in os.walk(os.path.join(tuned, "vocab")) for f in files)
  original = sorted(os.path.relpath(os.path.join(d, f), os.path.join(workdir, "vocab"))
                    for d, _, files in os.walk(os.path.join(workdir, "vocab")) for f in files)
  assert set(original) - {"corpus.sha256"} <= set(copied)


# ---------------------------------------------------------------- export to Hugging Face Marian

EXPORT_FIXTURE = os.path.join(REPO, "tests", "fixtures", "marian_export")


def test_exporting_an_imported_model_gives_back_its_directory(workdir, tmp_path):
  """`--mode=export --format=marian` of the imported fixture writes the fixture's tensors,
  bitwise, with its vocabulary and architecture; importing that export gives back the same
  parameters, bitwise."""
  out = tmp_path / "exported"
  proc = run_main("--mode=export", "--format=marian", f"--workdir={workdir}", f"--output={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  original, exported = (safetensors_file.read(os.path.join(d, "model.safetensors"))
                        for d in (FIXTURE, out))
  assert set(original) == set(exported)
  for name, tensor in original.items():
    np.testing.assert_array_equal(exported[name], tensor, err_msg=name)
  for name in ("source.spm", "target.spm", "vocab.json"):
    with open(os.path.join(FIXTURE, name), "rb") as a, open(out / name, "rb") as b:
      assert a.read() == b.read(), name
  with open(os.path.join(FIXTURE, "config.json")) as a, open(out / "config.json") as b:
    theirs, ours_ = json.load(a), json.load(b)
  assert {k: v for k, v in theirs.items() if k != "transformers_version"} == {
    k: v for k, v in ours_.items() if k in theirs}
  proc = run_main("--mode=import", f"--source={out}", f"--workdir={tmp_path}/again")
  assert proc.returncode == 0, proc.stderr[-3000:]
  again = infer.restore(workdir_lib.load(f"{tmp_path}/again"), f"{tmp_path}/again")
  first = infer.restore(workdir_lib.load(workdir), workdir)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(again.params),
               jax.device_get(first.params))


def test_an_exported_model_computes_what_the_original_does():
  """A model of the paper's layout (interleaved sinusoids, ReLU, no biases): exported, then
  read back as the import reads Marian, it gives the same log-probabilities (the model
  dimension permuted, the ids rotated, zero biases)."""
  from transformer.interop import marian_export
  from transformer.nn.model import ModelConfig, Transformer

  mc = ModelConfig(vocab_size=50, num_layers=2, d_model=16, d_ff=32, num_heads=4, max_len=32,
                   layer_norm_epsilon=1e-5, dropout_rate=0.0)
  rng = np.random.default_rng(0)
  src = jnp.asarray(rng.integers(3, 50, (3, 7)), jnp.int32).at[:, -1].set(1)
  tgt = jnp.asarray(rng.integers(3, 50, (3, 5)), jnp.int32).at[:, -1].set(1)
  params = jax.tree.map(np.asarray, Transformer(mc).init(jax.random.key(1), src, tgt)["params"])
  import flax.linen as nn

  params = nn.unbox(params)
  hf = marian_export.hf_config(mc)
  back_mc = ModelConfig(**marian.model_fields(hf, "exported"))
  back = marian.convert_params(marian_export.marian_tensors(params, mc), back_mc, "exported")
  want = jax.nn.log_softmax(Transformer(mc).apply({"params": params}, src, tgt))
  got = jax.nn.log_softmax(Transformer(back_mc).apply({"params": back}, src, tgt))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_transformers_runs_an_export_as_the_project_does(tmp_path):
  """tests/fixtures/marian_export/ is a model trained here and exported by the project;
  expected.json is what transformers' MarianMTModel and MarianTokenizer compute with it
  (scripts/make_marian_fixture.py --export). Imported back, the project computes the same
  tokens, log-probabilities (1e-4 relative) and greedy outputs (identical); and exporting the
  import writes the fixture's tensors again, bitwise."""
  with open(os.path.join(EXPORT_FIXTURE, "expected.json")) as f:
    expected = json.load(f)
  size = json.load(open(os.path.join(EXPORT_FIXTURE, "config.json")))["vocab_size"]
  rotate = lambda ids: [(i + 1) % size for i in ids]  # noqa: E731
  path = str(tmp_path / "imported")
  # (The model's 128 positions: the base config's length limits made to fit them.)
  proc = run_main("--mode=import", f"--source={EXPORT_FIXTURE}", f"--workdir={path}",
                  "--config.data.max_source_len=64", "--config.data.max_target_len=64")
  assert proc.returncode == 0, proc.stderr[-3000:]
  config = workdir_lib.load(path)
  config.decode.method, config.decode.max_extra_len = "greedy", expected["max_extra_len"]
  model = infer.restore(config, path)
  sources = [rotate(ids) for ids in expected["source_ids"]]
  targets = [rotate(ids) for ids in expected["target_ids"]]
  assert [model.tokenizer.encode(s) for s in expected["sources"]] == sources
  assert [model.tokenizer.encode(t, side=TARGET) for t in expected["targets"]] == targets
  length = max(map(len, sources + targets))
  inputs, outputs = (np.zeros((len(sources), length), np.int32) for _ in range(2))
  for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
    inputs[i, : len(s)], outputs[i, : len(t)] = s, t
  logits = build_model(model.layout.model_config).apply(
    {"params": model.params}, jnp.asarray(inputs), jnp.asarray(outputs))
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  for i, t in enumerate(targets):
    theirs = np.roll(np.asarray(expected["teacher_forced_log_probs"][i]), 1, axis=-1)
    np.testing.assert_allclose(log_probs[i, : len(t)], theirs, rtol=1e-4, atol=1e-5)
  found = model.translator.search_ids(model.params, sources)
  for hyps, greedy in zip(found, expected["greedy"], strict=True):
    assert hyps[0].ids == rotate(greedy["ids"][1:-1])
    assert model.tokenizer.decode(hyps[0].ids) == greedy["text"]
  assert len({tuple(g["ids"]) for g in expected["greedy"]}) > 1  # real sentences, not one
  out = tmp_path / "again"
  proc = run_main("--mode=export", "--format=marian", f"--workdir={path}", f"--output={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  committed = safetensors_file.read(os.path.join(EXPORT_FIXTURE, "model.safetensors"))
  again = safetensors_file.read(out / "model.safetensors")
  assert set(committed) == set(again)
  for name, tensor in committed.items():
    np.testing.assert_array_equal(again[name], tensor, err_msg=name)


@pytest.mark.parametrize("field, value", [("pre_layer_norm", True),
                                          ("layer_norm_epsilon", 1e-6)])
def test_a_model_marian_cannot_express_is_refused_before_anything_is_written(
    workdir, tmp_path, field, value):
  """(The workdir's saved config edited to the variant: the export checks the model's fields
  before it restores anything.)"""
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  with open(copy / "config.json") as f:
    saved = json.load(f)
  saved["config"]["model"]["fields"][field]["value"] = value
  with open(copy / "config.json", "w") as f:
    json.dump(saved, f)
  out = tmp_path / "out"
  proc = run_main("--mode=export", "--format=marian", f"--workdir={copy}", f"--output={out}")
  assert f"model.{field}" in one_error_line(proc)
  assert not out.exists()
