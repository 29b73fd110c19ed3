"""Export to CTranslate2: its greedy and beam-4 outputs equal the project's on a trained model.

A tiny model is trained for 150 steps (about 15 s), exported through the main
program, and both libraries translate the same sentences, CTranslate2 given the SentencePiece
pieces alone, as its users pass them. Beam search is compared with the length penalty off: the
two libraries' penalties differ (transformer/interop/export.py).
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import sentencepiece

ctranslate2 = pytest.importorskip("ctranslate2")

from configs import numbers  # noqa: E402
from tests.test_train import FAST_COMPILE, REPO  # noqa: E402
from transformer import infer  # noqa: E402
from transformer.decoding import translate  # noqa: E402
from transformer.errors import ConfigError, UserError  # noqa: E402
from transformer.interop import export  # noqa: E402
from transformer.nn.model import ModelConfig  # noqa: E402
from transformer.nn.model_family import build_model  # noqa: E402
from transformer.training.validate import model_config  # noqa: E402

# Most tests here run a command or train a model: `-m 'not slow'` leaves the whole file out.
pytestmark = pytest.mark.slow

# Enough training that outputs mostly end with their own EOS rather than at the length limit
# (packed rows: more sentences per step).
OVERRIDES = ["--config.model.d_model=64", "--config.model.d_ff=128",
             "--config.num_train_steps=150", "--config.optimizer.warmup_steps=50",
             "--config.data.packing=True", "--config.evals.valid_loss.every_steps=150",
             "--config.checkpoint_every_steps=150", "--config.log_every_steps=50"]
TINY = ["--config=configs/numbers.py:tiny", *OVERRIDES]
SENTENCES = [
  "seven", "forty-two", "three hundred", "twelve and then five", "ninety-nine thousand",
  "one thousand, three hundred and eleven", "sixty-one thousand, two hundred and twenty-four",
  "eight hundred and seventy-nine and then twenty-eight thousand, nine hundred and thirty-five",
]


def _main(*args, timeout=300):
  env = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "transformer.main", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)
  return proc


def _tail(proc) -> str:
  return "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])


def _until_eos(ids):
  return ids[: ids.index(1)] if 1 in ids else ids


def _config():
  config = numbers.get_config("tiny")
  for arg in OVERRIDES:
    key, value = arg.removeprefix("--config.").split("=")
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = type(node[leaf])(value)
  return config


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """A trained tiny workdir and its CTranslate2 export (written by the main program)."""
  tmp = tmp_path_factory.mktemp("export")
  workdir, out = str(tmp / "w"), str(tmp / "ct2")
  proc = _main(*TINY, f"--workdir={workdir}")
  assert proc.returncode == 0, _tail(proc)
  proc = _main(*TINY, f"--workdir={workdir}", "--mode=export", "--format=ctranslate2",
               f"--output={out}", "--average=1")
  assert proc.returncode == 0, _tail(proc)
  assert sorted(os.listdir(out)) == ["config.json", "model.bin", "shared_vocabulary.json",
                                     "spm.model"]
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["add_source_eos"] is True  # CTranslate2 appends the EOS itself
  return workdir, out


def _project_outputs(restored, config, sources, beam_size):
  decode = ml_collections.ConfigDict({"beam_size": beam_size, "alpha": 0.0, "batch_size": 8,
                                      "max_extra_len": config.decode.max_extra_len})
  translator = translate.Translator(restored.translator.model_config, decode,
                                    restored.layout.mesh, restored.layout.param_shardings,
                                    config.data.bucket_lengths)
  return translator.translate_ids(restored.params, sources)


def _ct2_outputs(model_dir, sentences, beam_size, max_extra_len):
  """As a CTranslate2 user translates: the SentencePiece pieces of each sentence, nothing more
  (no EOS appended), and the output pieces back to ids."""
  sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(model_dir, export.SPM_NAME))
  translator = ctranslate2.Translator(model_dir, device="cpu", inter_threads=1, intra_threads=1)
  outputs = []
  for sentence in sentences:
    pieces = sp.encode(sentence, out_type=str)
    # The project's longest output is len(source) + max_extra_len tokens with the EOS forced
    # last (its source counts the EOS); CTranslate2 stops at its limit without an EOS.
    result = translator.translate_batch(
      [pieces], beam_size=beam_size, length_penalty=0.0,
      min_decoding_length=0,  # CTranslate2's default 1 forbids an empty output
      max_decoding_length=len(pieces) + max_extra_len,
    )
    outputs.append(sp.piece_to_id(result[0].hypotheses[0]))
  return outputs


@pytest.mark.parametrize("beam_size", [1, 4])
def test_ctranslate2_given_pieces_alone_equals_project_decoding(exported, beam_size):
  workdir, out = exported
  config = _config()
  restored = infer.restore(config, workdir, average=1)
  sources = [restored.tokenizer.encode(s) for s in SENTENCES]
  assert all(src[-1] == 1 for src in sources)  # the project's sources end in EOS
  ours = _project_outputs(restored, config, sources, beam_size)
  theirs = _ct2_outputs(out, SENTENCES, beam_size, config.decode.max_extra_len)
  if beam_size == 1:
    assert theirs == ours  # greedy: the same argmax at every step, up to the length limit
  else:
    # At the length limit the searches differ by design: the project forces an EOS and ranks
    # the hypotheses with its log probability, CTranslate2 stops without one. Elsewhere the
    # beams agree.
    ended = [i for i, src in enumerate(sources)
             if max(len(ours[i]), len(theirs[i])) < len(src) + config.decode.max_extra_len - 1]
    assert len(ended) >= len(sources) // 2, (ours, theirs)
    assert [theirs[i] for i in ended] == [ours[i] for i in ended]
  assert len({tuple(o) for o in ours}) > 1  # not one output for every input


@pytest.mark.parametrize("variant", [
  {"pre_layer_norm": True, "scan_layers": True},
  {"positional": "learned", "share_embeddings": False},
])
def test_variants_greedy_random_weights(tmp_path, variant):
  """Pre-LN, learned positions, untied embeddings and scanned layers map too (greedy)."""
  mc = dataclasses.replace(model_config(numbers.get_config("tiny")), **variant)
  params = build_model(mc).init(jax.random.key(1), jnp.ones((1, 4), jnp.int32),
                                jnp.ones((1, 4), jnp.int32))["params"]
  export.export_ctranslate2(params, mc, str(tmp_path / "m"))
  vocab = export.synthetic_vocabulary(mc.vocab_size)
  src = np.random.default_rng(0).integers(3, mc.vocab_size, size=(4, 9)).astype(np.int32)
  src[:, -1] = 1
  decode = jax.jit(lambda p, x: translate.decode_tokens(p, x, mc, beam_size=1, alpha=0.0,
                                                         max_extra_len=5, max_len=14))
  ours = np.asarray(decode(params, jnp.asarray(src)))
  # CTranslate2 gets the tokens without the EOS: the exported config appends it.
  result = ctranslate2.Translator(str(tmp_path / "m"), intra_threads=1).translate_batch(
    [[vocab[i] for i in row[:-1]] for row in src], beam_size=1, min_decoding_length=0,
    max_decoding_length=13)
  theirs = [[vocab.index(t) for t in r.hypotheses[0]] for r in result]
  assert theirs == [_until_eos(row) for row in ours.tolist()]


@pytest.mark.parametrize("fields, field", [
  ({"kind": "lstm"}, "model.kind"),
  ({"d_kv": 4}, "model.d_kv"),
])
def test_unsupported_variants_are_refused(tmp_path, fields, field):
  mc = ModelConfig(vocab_size=16, num_layers=1, d_model=32, d_ff=64, num_heads=4, max_len=16,
                   **fields)
  with pytest.raises(ConfigError, match=field) as info:
    export.export_ctranslate2({}, mc, str(tmp_path / "m"))
  assert "\n" not in str(info.value)
  assert not (tmp_path / "m").exists()


def test_non_empty_output_is_refused(tmp_path):
  (tmp_path / "keep.txt").write_text("x")
  mc = model_config(numbers.get_config("tiny"))
  with pytest.raises(UserError, match="not empty"):
    export.export_ctranslate2({}, mc, str(tmp_path))
  assert os.listdir(tmp_path) == ["keep.txt"]


def test_cli_refuses_with_one_line_and_status_2(exported):
  workdir, out = exported
  before = {name: os.path.getmtime(os.path.join(out, name)) for name in os.listdir(out)}
  proc = _main(*TINY, f"--workdir={workdir}", "--mode=export", "--format=ctranslate2",
               f"--output={out}")
  assert proc.returncode == 2, _tail(proc)
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert errors == [f"error: --output={out} is not empty: give a new or empty directory"]
  assert "Traceback" not in proc.stderr
  assert {name: os.path.getmtime(os.path.join(out, name)) for name in os.listdir(out)} == before
