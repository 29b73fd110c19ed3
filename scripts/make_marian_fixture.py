"""Writes tests/fixtures/marian_tiny/: a tiny random OPUS-MT (Marian) model directory and what
Hugging Face transformers computes with it, the reference of tests/test_marian.py; with
`--export`, what transformers computes with tests/fixtures/marian_export/ (a model exported
by the project, scripts/make_marian_export_fixture.py), into its expected.json.

Runs in its own virtual environment (torch, transformers 5, sentencepiece; never the project's):

    python -m venv /tmp/marian-venv && /tmp/marian-venv/bin/pip install -r requirements-marian.txt
    /tmp/marian-venv/bin/python scripts/make_marian_fixture.py

Nothing is downloaded. Everything is seeded, so a re-run with the pinned versions writes the
same files:

  1. a few hundred generated sentence pairs (English-like sources, their word-by-word
     German-like translations) train two SentencePiece models, `source.spm` and `target.spm`,
     as OPUS-MT has;
  2. `vocab.json` joins their pieces as Marian's vocabulary does (`</s>` 0, `<unk>` 1, the
     pieces, a language code `>>de<<`, `<pad>` last), except for a few source pieces left out
     on purpose: MarianTokenizer maps those to `<unk>`, and so must the project's tokenizer;
  3. a MarianMTModel (2 + 2 layers, d_model 32, swish) trained for a few hundred steps on the
     pairs, so that its outputs vary and mostly end with their own EOS (a model with random
     weights repeats one token), then given a random `final_logits_bias` whose `<pad>` entry
     is as high as the model's typical best logit: `<pad>` would win many greedy steps if it
     were not forbidden. It is saved with `save_pretrained` (`model.safetensors`), and its
     state dict once more with `torch.save` (`pytorch_model.bin`, as transformers writes it
     without safetensors), for the importer's torch path. The script checks every greedy
     step's margin between the best and the second-best token;
  4. `expected.json`: the tokenizer's ids of a few sentences on both sides, the log-softmax
     of a teacher-forced batch, and `generate`'s greedy and beam-4 outputs (ids and text) with
     the pad id forbidden (`bad_words_ids`, as OPUS-MT's configs have it) and EOS forced at
     `max_length` = source length + MAX_EXTRA_LEN + 1 (the decoder start token counts), which
     is the project's `decode.max_extra_len` = MAX_EXTRA_LEN. Beam search runs with
     `length_penalty=0.0, early_stopping="never"`: plain sums of log-probabilities, as the
     project's beam search with `decode.alpha=0`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile

import numpy as np
import sentencepiece as spm
import torch
import transformers
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

SEED = 0
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                   "fixtures", "marian_tiny")
MAX_EXTRA_LEN = 2
# Source pieces that vocab.json leaves out (MarianTokenizer encodes them as <unk>).
DROPPED_PIECES = 3
# The smallest gap between the best and the second-best logit that a greedy step may have:
# float32 sums in another order (XLA against torch) move logits by ~1e-6.
MIN_MARGIN = 1e-3
TRAIN_STEPS, BATCH, LEARNING_RATE = 300, 32, 3e-3

SOURCE_WORDS = ("the a one two three red green blue small big old new house car tree river "
                "bird dog cat sees takes finds has wants near under over and with quickly "
                "slowly today").split()
TARGET_WORDS = ("das ein eins zwei drei rot gruen blau klein gross alt neu Haus Auto Baum "
                "Fluss Vogel Hund Katze sieht nimmt findet hat will nahe unter ueber und mit "
                "schnell langsam heute").split()

SOURCES = [
  "the small dog sees a red car.",
  "three old birds take the green tree today and the cat finds a big house near the river",
  ">>de<< a big house near the river",
  "the cat has one blue € car quickly",
  "a dog",
]
TARGETS = [
  "das klein Hund sieht ein rot Auto.",
  "drei alt Vogel nimmt das gruen Baum heute",
  "ein gross Haus nahe das Fluss",
  "die Katze hat ein blaues Auto",
  "ein Hund",
]


def pairs(rng: random.Random, n: int) -> list[tuple[str, str]]:
  """Sentences of the source words and their word-by-word translations."""
  out = []
  for _ in range(n):
    words = [rng.randrange(len(SOURCE_WORDS)) for _ in range(rng.randint(2, 12))]
    end = rng.choice(["", ".", "!", "?"])
    out.append((" ".join(SOURCE_WORDS[w] for w in words) + end,
                " ".join(TARGET_WORDS[w] for w in words) + end))
  return out


def train_spm(texts: list[str], path: str, vocab_size: int) -> None:
  spm.SetRandomGeneratorSeed(SEED)
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(texts), model_prefix=path, vocab_size=vocab_size,
    model_type="unigram", character_coverage=1.0, num_threads=1, minloglevel=2,
    hard_vocab_limit=False,
    # No Unicode normalisation table (~240 KB a model): keeps the fixture small.
    normalization_rule_name="identity",
    shuffle_input_sentence=False)


def pieces_of(path: str) -> list[str]:
  sp = spm.SentencePieceProcessor(model_file=path)
  return [sp.id_to_piece(i) for i in range(sp.get_piece_size())
          if not (sp.is_unknown(i) or sp.is_control(i))]


def build_tokenizer(work: str, corpus: list[tuple[str, str]]) -> MarianTokenizer:
  # Relative prefixes: a model records its prefix, and a temporary path would differ per run.
  with contextlib.chdir(work):
    train_spm([s for s, _ in corpus], "source", 64)
    train_spm([t for _, t in corpus], "target", 64)
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


def build_model(tokenizer: MarianTokenizer, corpus: list[tuple[str, str]]) -> MarianMTModel:
  vocab = len(tokenizer.get_vocab())
  pad = tokenizer.pad_token_id
  config = MarianConfig(
    vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
    decoder_ffn_dim=64, max_position_embeddings=512, activation_function="swish",
    scale_embedding=True, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
    decoder_start_token_id=pad, forced_eos_token_id=tokenizer.eos_token_id)
  model = MarianMTModel(config)
  optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
  rng = random.Random(SEED)
  model.train()
  for step in range(TRAIN_STEPS):
    batch = rng.sample(corpus, BATCH)
    encoded = tokenizer([s for s, _ in batch], text_target=[t for _, t in batch],
                        padding=True, return_tensors="pt")
    labels = encoded.labels.masked_fill(encoded.labels == pad, -100)  # no loss on padding
    loss = model(input_ids=encoded.input_ids, attention_mask=encoded.attention_mask,
                 labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 100 == 0 or step == TRAIN_STEPS - 1:
      print(f"step {step}: loss {loss.item():.3f}")
  model.eval()
  generator = torch.Generator().manual_seed(SEED)
  with torch.no_grad():
    model.final_logits_bias.copy_(0.2 * torch.randn(model.final_logits_bias.shape,
                                                    generator=generator))
    # <pad>'s bias is raised until <pad> would beat the token greedy search chooses on the
    # test sentences at 30% of their steps, were it not forbidden. Greedy search with <pad>
    # forbidden does not depend on that bias.
    lead = []  # how far the chosen token's logit is ahead of <pad>'s without its bias
    for text in SOURCES:
      ids = torch.tensor([tokenizer(text).input_ids])
      output = model.generate(ids, num_beams=1, do_sample=False, bad_words_ids=[[pad]],
                              max_length=ids.shape[1] + MAX_EXTRA_LEN + 1)
      logits = model(input_ids=ids, decoder_input_ids=output[:, :-1]).logits[0]
      unbiased_pad = logits[:, pad] - model.final_logits_bias[0, pad]
      lead.append(logits.gather(-1, output[0, 1:, None])[:, 0] - unbiased_pad)
    model.final_logits_bias[0, pad] = torch.quantile(torch.cat(lead), 0.3)
  model.generation_config = GenerationConfig(
    bad_words_ids=[[pad]], forced_eos_token_id=tokenizer.eos_token_id,
    decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
    num_beams=4, max_length=64)
  return model


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


EXPORT = os.path.join(os.path.dirname(OUT), "marian_export")
# Sentences of the numbers task the exported model was trained on (English -> German).
EXPORT_SOURCES = ["three hundred and five", "forty-two", "seven thousand and twelve",
                  "nine hundred and ninety-nine", "sixty-one"]
EXPORT_TARGETS = ["dreihundertfünf", "zweiundvierzig", "siebentausendzwölf",
                  "neunhundertneunundneunzig", "einundsechzig"]
EXPORT_MAX_EXTRA_LEN = 5


def expected_of_export() -> dict:
  """Loads the export as a user of transformers does and records its tokenization,
  teacher-forced log-softmax and greedy outputs (pad forbidden, EOS forced at the length
  limit), with every greedy step's margin checked."""
  model = MarianMTModel.from_pretrained(EXPORT).eval()
  tokenizer = MarianTokenizer.from_pretrained(EXPORT)
  pad = model.config.pad_token_id
  source_ids = [tokenizer(s).input_ids for s in EXPORT_SOURCES]
  target_ids = [tokenizer(text_target=t).input_ids for t in EXPORT_TARGETS]
  batch = tokenizer(EXPORT_SOURCES, text_target=EXPORT_TARGETS, padding=True,
                    return_tensors="pt")
  with torch.no_grad():
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   labels=batch.labels).logits
  log_probs = torch.log_softmax(logits.double(), dim=-1).float().numpy()
  out = {"transformers": transformers.__version__, "torch": torch.__version__,
         "sources": EXPORT_SOURCES, "targets": EXPORT_TARGETS, "source_ids": source_ids,
         "target_ids": target_ids, "max_extra_len": EXPORT_MAX_EXTRA_LEN,
         "teacher_forced_log_probs": [rounded(log_probs[i, : len(t)])
                                      for i, t in enumerate(target_ids)], "greedy": []}
  margins = []
  for ids in source_ids:
    ids = torch.tensor([ids])
    with torch.no_grad():
      greedy = model.generate(ids, num_beams=1, do_sample=False, bad_words_ids=[[pad]],
                              max_length=ids.shape[1] + EXPORT_MAX_EXTRA_LEN + 1)
      margins.append(greedy_margin(model, ids, greedy))
    out["greedy"].append({"ids": greedy[0].tolist(),
                          "text": tokenizer.decode(greedy[0], skip_special_tokens=True)})
  print(f"smallest greedy margin: {min(margins):.4f}")
  if min(margins) < MIN_MARGIN:
    raise SystemExit(f"a greedy step has a margin of {min(margins):.2e} < {MIN_MARGIN}: "
                     "choose other sentences")
  return out


def main() -> None:
  torch.set_num_threads(1)  # the same sums in the same order on every run
  if "--export" in sys.argv[1:]:
    with open(os.path.join(EXPORT, "expected.json"), "w") as f:
      json.dump(expected_of_export(), f, indent=1, ensure_ascii=False)
    print(f"wrote {os.path.join(EXPORT, 'expected.json')}")
    return
  random.seed(SEED)
  np.random.seed(SEED)
  torch.manual_seed(SEED)
  work = tempfile.mkdtemp(prefix="marian-fixture-")
  try:
    corpus = pairs(random.Random(SEED), 600)
    tokenizer = build_tokenizer(work, corpus)
    model = build_model(tokenizer, corpus)
    shutil.rmtree(OUT, ignore_errors=True)
    tokenizer.save_pretrained(OUT)
    model.save_pretrained(OUT)
    # As transformers writes it without safetensors: the fixed sinusoids left out.
    state = {k: v for k, v in model.state_dict().items()
             if k not in model._keys_to_ignore_on_save}
    torch.save(state, os.path.join(OUT, "pytorch_model.bin"))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
      json.dump(expected(model, tokenizer), f, indent=1, ensure_ascii=False)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  for name in sorted(os.listdir(OUT)):
    print(f"{name}: {os.path.getsize(os.path.join(OUT, name)):,} bytes")


if __name__ == "__main__":
  main()
