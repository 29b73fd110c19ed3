"""Writes tests/fixtures/marian_tiny/: a tiny random OPUS-MT (Marian) model directory and what
Hugging Face transformers computes with it, the reference of tests/test_marian.py.

Runs in its own virtual environment (torch, transformers 5, sentencepiece; never the project's):

    python -m venv /tmp/marian-venv && /tmp/marian-venv/bin/pip install -r requirements-marian.txt
    /tmp/marian-venv/bin/python scripts/make_marian_fixture.py

Nothing is downloaded. Everything is seeded, so a re-run with the pinned versions writes the
same files:

  1. a few hundred generated sentence pairs (a made-up English-like source language and a
     German-like target language) train two SentencePiece models, `source.spm` and
     `target.spm`, as OPUS-MT has;
  2. `vocab.json` joins their pieces as Marian's vocabulary does (`</s>` 0, `<unk>` 1, the
     pieces, a language code `>>de<<`, `<pad>` last), except for a few source pieces left out
     on purpose: MarianTokenizer maps those to `<unk>`, and so must the project's tokenizer;
  3. a MarianMTModel (2 + 2 layers, d_model 32, swish, a non-zero `final_logits_bias`) with
     random weights, drawn wider than transformers' initialisation so that the model's choices
     are clear-cut (the script checks every greedy step's margin), saved with
     `save_pretrained` (`model.safetensors`), and its state dict once more with `torch.save`
     (`pytorch_model.bin`), for the importer's torch path;
  4. `expected.json`: the tokenizer's ids of a few sentences on both sides, the log-softmax
     of a teacher-forced batch, and `generate`'s greedy and beam-4 outputs (ids and text) with
     the pad id forbidden (`bad_words_ids`, as OPUS-MT's configs have it) and EOS forced at
     `max_length` = source length + MAX_EXTRA_LEN + 1 (the decoder start token counts), which
     is the project's `decode.max_extra_len` = MAX_EXTRA_LEN. Beam search runs with
     `length_penalty=0.0, early_stopping="never"`: plain sums of log-probabilities, as the
     project's beam search with `decode.alpha=0`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile

import numpy as np
import sentencepiece as spm
import torch
import transformers
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

SEED = 0
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                   "fixtures", "marian_tiny")
MAX_EXTRA_LEN = 12
# Source pieces that vocab.json leaves out (MarianTokenizer encodes them as <unk>).
DROPPED_PIECES = 3
# The smallest gap between the best and the second-best logit that a greedy step may have:
# float32 sums in another order (XLA against torch) move logits by ~1e-6.
MIN_MARGIN = 1e-3
# Scale of the random weights: transformers' init_std (0.02) makes every output nearly
# uniform, and then the ranking of tokens is decided by rounding.
WEIGHT_STD = 0.25

SOURCE_WORDS = ("the a one two three red green blue small big old new house car tree river "
                "bird dog cat sees takes finds has wants near under over and with quickly "
                "slowly today").split()
TARGET_WORDS = ("das ein eins zwei drei rot gruen blau klein gross alt neu Haus Auto Baum "
                "Fluss Vogel Hund Katze sieht nimmt findet hat will nahe unter ueber und mit "
                "schnell langsam heute").split()

SOURCES = [
  "the small dog sees a red car.",
  "three old birds take the green tree today",
  ">>de<< a big house near the river",
  "the cat has one blue € car",
]
TARGETS = [
  "der kleine Hund sieht ein rotes Auto.",
  "drei alte Voegel nehmen den gruenen Baum heute",
  "ein grosses Haus nahe dem Fluss",
  "die Katze hat ein blaues Auto",
]


def sentences(words: tuple[str, ...], rng: random.Random, n: int) -> list[str]:
  out = []
  for _ in range(n):
    sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
    out.append(sentence + rng.choice(["", ".", "!", "?"]))
  return out


def train_spm(texts: list[str], path: str, vocab_size: int) -> None:
  spm.SetRandomGeneratorSeed(SEED)
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(texts), model_prefix=path, vocab_size=vocab_size,
    model_type="unigram", character_coverage=1.0, num_threads=1, minloglevel=2,
    shuffle_input_sentence=False)


def pieces_of(path: str) -> list[str]:
  sp = spm.SentencePieceProcessor(model_file=path)
  return [sp.id_to_piece(i) for i in range(sp.get_piece_size())
          if not (sp.is_unknown(i) or sp.is_control(i))]


def build_tokenizer(work: str) -> MarianTokenizer:
  rng = random.Random(SEED)
  train_spm(sentences(SOURCE_WORDS, rng, 400), os.path.join(work, "source"), 96)
  train_spm(sentences(TARGET_WORDS, rng, 400), os.path.join(work, "target"), 96)
  source, target = pieces_of(f"{work}/source.model"), pieces_of(f"{work}/target.model")
  # Dropped from the joint vocabulary: the longest source pieces (whole words, so that a few
  # test sentences meet them).
  dropped = set(sorted(source, key=lambda p: (-len(p), p))[:DROPPED_PIECES])
  joint = [p for p in source if p not in dropped]
  joint += [p for p in target if p not in joint]
  vocab = ["</s>", "<unk>", *joint, ">>de<<", "<pad>"]
  with open(f"{work}/vocab.json", "w") as f:
    json.dump({piece: i for i, piece in enumerate(vocab)}, f, ensure_ascii=False, indent=1)
  print(f"vocabulary: {len(vocab)} pieces; left out of it: {sorted(dropped)}")
  return MarianTokenizer(f"{work}/source.model", f"{work}/target.model", f"{work}/vocab.json",
                         source_lang="en", target_lang="de")


def build_model(tokenizer: MarianTokenizer) -> MarianMTModel:
  vocab = len(tokenizer.get_vocab())
  pad = tokenizer.pad_token_id
  config = MarianConfig(
    vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
    decoder_ffn_dim=64, max_position_embeddings=128, activation_function="swish",
    scale_embedding=True, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
    decoder_start_token_id=pad, forced_eos_token_id=tokenizer.eos_token_id)
  model = MarianMTModel(config)
  generator = torch.Generator().manual_seed(SEED)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("layer_norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
      else:
        p.copy_(WEIGHT_STD * torch.randn(p.shape, generator=generator))
    model.final_logits_bias.copy_(0.5 * torch.randn(model.final_logits_bias.shape,
                                                    generator=generator))
  model.generation_config = GenerationConfig(
    bad_words_ids=[[pad]], forced_eos_token_id=tokenizer.eos_token_id,
    decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
    num_beams=4, max_length=64)
  return model.eval()


def rounded(x: np.ndarray) -> list:
  return np.vectorize(lambda v: float(f"{v:.7g}"))(x).tolist()


def greedy_margin(model: MarianMTModel, ids: torch.Tensor, output: torch.Tensor) -> float:
  """The smallest gap between the chosen and the next logit over the steps of a greedy output
  (the forced final EOS excluded)."""
  pad = model.config.pad_token_id
  logits = model(input_ids=ids, decoder_input_ids=output[:, :-1]).logits[0]
  logits[:, pad] = -float("inf")
  top2 = torch.topk(logits, 2, dim=-1).values
  return float((top2[:, 0] - top2[:, 1]).min())


def expected(model: MarianMTModel, tokenizer: MarianTokenizer) -> dict:
  pad = model.config.pad_token_id
  source_ids = [tokenizer(s).input_ids for s in SOURCES]
  target_ids = [tokenizer(text_target=t).input_ids for t in TARGETS]
  batch = tokenizer(SOURCES, text_target=TARGETS, padding=True, return_tensors="pt")
  with torch.no_grad():
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   labels=batch.labels).logits
  log_probs = torch.log_softmax(logits.double(), dim=-1).float().numpy()
  out = {
    "transformers": transformers.__version__, "torch": torch.__version__,
    "sources": SOURCES, "targets": TARGETS,
    "source_ids": source_ids, "target_ids": target_ids,
    # [pair, target position, vocabulary], the positions of each target's ids (EOS included).
    "teacher_forced_log_probs": [rounded(log_probs[i, : len(t)])
                                 for i, t in enumerate(target_ids)],
    "max_extra_len": MAX_EXTRA_LEN, "greedy": [], "beam4": [],
  }
  margins = []
  for ids in source_ids:
    ids = torch.tensor([ids])
    common = dict(max_length=ids.shape[1] + MAX_EXTRA_LEN + 1, bad_words_ids=[[pad]],
                  do_sample=False)
    with torch.no_grad():
      greedy = model.generate(ids, num_beams=1, **common)
      beam = model.generate(ids, num_beams=4, length_penalty=0.0, early_stopping="never",
                            output_scores=True, return_dict_in_generate=True, **common)
      margins.append(greedy_margin(model, ids, greedy))
    out["greedy"].append({"ids": greedy[0].tolist(),
                          "text": tokenizer.decode(greedy[0], skip_special_tokens=True)})
    out["beam4"].append({"ids": beam.sequences[0].tolist(),
                         "text": tokenizer.decode(beam.sequences[0], skip_special_tokens=True),
                         "score": float(beam.sequences_scores[0])})
  print(f"smallest greedy margin: {min(margins):.4f}")
  if min(margins) < MIN_MARGIN:
    raise SystemExit(f"a greedy step has a margin of {min(margins):.2e} < {MIN_MARGIN}: the "
                     "outputs would not be well defined; change SEED or the sentences")
  return out


def main() -> None:
  random.seed(SEED)
  np.random.seed(SEED)
  torch.manual_seed(SEED)
  work = tempfile.mkdtemp(prefix="marian-fixture-")
  try:
    tokenizer = build_tokenizer(work)
    model = build_model(tokenizer)
    shutil.rmtree(OUT, ignore_errors=True)
    tokenizer.save_pretrained(OUT)
    model.save_pretrained(OUT)
    torch.save(model.state_dict(), os.path.join(OUT, "pytorch_model.bin"))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
      json.dump(expected(model, tokenizer), f, indent=1, ensure_ascii=False)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  for name in sorted(os.listdir(OUT)):
    print(f"{name}: {os.path.getsize(os.path.join(OUT, name)):,} bytes")


if __name__ == "__main__":
  main()
