"""Several corpora in one run (transformer/data/mixture.py): weights, tags, the mixture split,
the French numbers, and a multilingual run end to end."""

import json
import os
import random

import numpy as np
import pytest
from num2words import num2words

from configs import common, multilingual
from configs import numbers as numbers_config
from tests.test_train import run_main
from transformer.data import bucketing, mixture, numbers
from transformer.data.errors import DataError
from transformer.data.token_cache import TokenizedSplit
from transformer.data.tokenizer import Tokenizer
from transformer.errors import ConfigError, UserError


def split_of(n: int, first: int, seed: int) -> TokenizedSplit:
  """n pairs whose first source id is `first` (to tell corpora apart), lengths 3..12."""
  rng = np.random.default_rng(seed)
  src = [[first, *rng.integers(10, 50, size=rng.integers(2, 11)).tolist(), 1] for _ in range(n)]
  tgt = [[*rng.integers(10, 50, size=rng.integers(2, 11)).tolist(), 1] for _ in range(n)]
  return TokenizedSplit.from_sequences(src, tgt)


# ----------------------------------------------------------------------------- config


def two_corpora(**fr):
  config = numbers_config.get_config("tiny")
  config.data.tag = ">>de<<"
  config.data.corpora.fr = common.corpus("numbers", target_lang="fr", tag=">>fr<<", **fr)
  return config


def test_single_corpus_configs_are_not_mixtures():
  """The configs of one corpus take the pipeline's single-corpus path, unchanged."""
  from configs import text, wmt

  for config in (numbers_config.get_config(), text.get_config(), wmt.get_config()):
    assert not mixture.is_mixture(config) and mixture.tags(config) == []
  assert mixture.is_mixture(multilingual.get_config("tiny"))
  assert mixture.tags(multilingual.get_config("tiny")) == [">>de<<", ">>fr<<"]


@pytest.mark.parametrize("change, field", [
  (lambda c: setattr(c.data.corpora.fr, "weight", 0.0), "data.corpora.fr.weight"),
  (lambda c: setattr(c.data.corpora.fr, "weight", -1.0), "data.corpora.fr.weight"),
  (lambda c: setattr(c.data, "weight", 0), "data.weight"),
  (lambda c: setattr(c.data.corpora.fr, "tag", ">>de<<"), "data.corpora.fr.tag"),
  (lambda c: setattr(c.data.corpora.fr, "tag", ">> fr"), "data.corpora.fr.tag"),
  (lambda c: setattr(c.data, "tag", ""), "data.tag: not set"),
  (lambda c: setattr(c.data.corpora.fr, "tag", ""), "data.corpora.fr.tag: not set"),
])
def test_bad_corpora_name_the_field(change, field):
  config = two_corpora()
  change(config)
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    mixture.corpora_of(config)


def test_unknown_entry_field_and_name():
  config = two_corpora()
  with config.data.corpora.fr.unlocked():
    config.data.corpora.fr.wieght = 2.0
  with pytest.raises(ConfigError, match=r"data\.corpora\.fr\.wieght: no such field"):
    mixture.corpora_of(config)
  with pytest.raises(ValueError, match="no such field 'wieght'"):
    common.corpus("text", wieght=2.0)


def test_same_pair_needs_no_tags():
  """Back-translation: synthetic pairs of the same direction, untagged, are allowed."""
  config = numbers_config.get_config("tiny")
  config.data.corpora.bt = common.corpus("numbers", weight=2.5)
  names = [(c.name, c.weight, c.tag) for c in mixture.corpora_of(config)]
  assert names == [("main", 1.0, ""), ("bt", 2.5, "")]


# ----------------------------------------------------------------------------- the mixture split


def test_mixture_split_composition_and_tags(tmp_path):
  """Each corpus appears weight times (a fixed sample for the fraction), tagged sources start
  with the tag id, and the split on disk equals the one in memory, reused on a second call."""
  a, b = split_of(50, 7, 0), split_of(40, 8, 1)
  parts = [(a, 2.0, None), (b, 0.5, 5)]
  memory = mixture.mixture_split(parts, seed=3, directory=None)
  disk = mixture.mixture_split(parts, seed=3, directory=str(tmp_path))
  again = mixture.mixture_split(parts, seed=3, directory=str(tmp_path))
  assert len(memory) == 2 * 50 + 20
  for s in (disk, again):
    for key in ("source", "source_offsets", "target", "target_offsets"):
      np.testing.assert_array_equal(np.asarray(getattr(s, key)), getattr(memory, key))
  first = memory.source[memory.source_offsets[:-1]]
  assert (first[:100] == 7).all() and (first[100:] == 5).all()
  second = memory.source[memory.source_offsets[100:-1] + 1]
  assert (second == 8).all()  # the tag in front of b's own first id
  # Every pair of `a` exactly twice; 20 distinct pairs of `b`.
  idx = mixture.compose(parts, seed=3)
  assert np.array_equal(np.bincount(idx[0], minlength=50), np.full(50, 2))
  assert len(set(idx[1].tolist())) == 20
  # Another seed samples another half of `b`; the same seed the same.
  assert not np.array_equal(mixture.compose(parts, seed=4)[1], idx[1])


def test_mixture_shares_over_training_steps():
  """Over many steps of bucketed batches, each corpus's share of the examples is its weight's
  (w_c n_c / sum w n): exact over whole epochs, and within 6 standard deviations of a
  hypergeometric draw over part of one. The plan is fixed by the seed: this cannot fail by
  chance."""
  a, b, c = split_of(300, 7, 0), split_of(100, 8, 1), split_of(200, 9, 2)
  weights = (1.0, 3.0, 0.5)
  split = mixture.mixture_split([(a, weights[0], None), (b, weights[1], None),
                                 (c, weights[2], None)], seed=0, directory=None)
  config = numbers_config.get_config("tiny")
  config.data.bucket_lengths = [8, 16]
  config.data.tokens_per_batch = 64
  batches = bucketing.TrainBatches(split, config)
  expect = np.array([300 * 1.0, 100 * 3.0, 200 * 0.5])
  share = expect / expect.sum()
  bounds = np.cumsum(expect).astype(int)

  def counts(steps):
    idx = np.concatenate([batches.indices(s) for s in steps])
    idx = idx[idx >= 0]
    return np.bincount(np.searchsorted(bounds, idx, side="right"), minlength=3)

  assert batches.num_examples == len(split)  # every example fits
  whole = counts(range(2 * batches.steps_per_epoch))
  np.testing.assert_array_equal(whole, 2 * expect.astype(int))
  part = counts(range(batches.steps_per_epoch // 3))
  n, total = part.sum(), len(split)
  sd = np.sqrt(n * share * (1 - share) * (total - n) / (total - 1))
  assert (np.abs(part - n * share) <= 6 * sd).all(), (part, n * share, sd)


# ----------------------------------------------------------------------------- tags


def test_tags_are_user_defined_pieces_and_checked(tmp_path):
  texts = [f"one two three {i}" for i in range(200)] + [f"eins zwei {i}" for i in range(200)]
  tok = Tokenizer.train(texts, str(tmp_path / "spm"), 40, user_defined_symbols=[">>de<<"])
  assert tok.piece_kind(">>de<<") == "user_defined"
  assert mixture.tag_id(tok, ">>de<<", "data.tag") == tok.piece_id(">>de<<")
  plain = Tokenizer.train(texts, str(tmp_path / "plain"), 40)
  normal = next(tok.id_to_piece(i) for i in range(3, 40) if tok.piece_kind(tok.id_to_piece(i))
                == "normal")
  with pytest.raises(DataError, match=r"data\.tag='.*': collides with an ordinary piece"):
    mixture.tag_id(tok, normal, "data.tag")
  with pytest.raises(DataError, match=r"data\.corpora\.fr\.tag='>>fr<<': the vocabulary .* no "
                     "such piece"):
    mixture.tag_id(plain, ">>fr<<", "data.corpora.fr.tag")
  with pytest.raises(DataError, match="occurs in the training text"):
    mixture.check_tags_absent([b"a >>de<< b"], [">>de<<"], "data.tag")

  encoder = mixture.SourceEncoder(tok, [">>de<<"], default="")
  assert encoder.encode(">>de<< one two") == [tok.piece_id(">>de<<"), *tok.encode("one two")]
  assert encoder.encode("one two") == tok.encode("one two")
  assert mixture.SourceEncoder(tok, [">>de<<"], ">>de<<").encode("one") == [
    tok.piece_id(">>de<<"), *tok.encode("one")]
  with pytest.raises(UserError, match="'>>es<<' is not one the model was trained with"):
    encoder.encode(">>es<< one")
  with pytest.raises(ConfigError, match=r"decode\.tag='>>es<<': the model was not trained"):
    mixture.SourceEncoder(tok, [">>de<<"], ">>es<<")


# ----------------------------------------------------------------------------- French numbers


def test_french_numbers_match_num2words_and_hold_out_the_same_numbers(tmp_path):
  rng = random.Random(0)
  for n in [0, 1, 80, 1000, 1001, 80000, 200000, 201000, 999999] + [
      rng.randrange(1_000_000) for _ in range(2000)]:
    assert numbers.french(n) == num2words(n, lang="fr"), n
  files = numbers.write_corpus(str(tmp_path), "tiny", ("en", "fr"))
  for split in numbers.SPLITS:
    en, fr = (open(files[split][lang], encoding="utf-8").read().splitlines()
              for lang in ("en", "fr"))
    assert len(en) == len(fr) == numbers.VARIANTS["tiny"].size(split)
  # Line i of French is the French of line i of English: the same numbers, so the same split.
  groups = numbers.sentence_numbers("test", numbers.VARIANTS["tiny"].size("test"))
  order = numbers.stored_order("test", len(groups))
  expect = [numbers.FR_JOINER.join(map(numbers.french, groups[i])) for i in order]
  assert open(files["test"]["fr"], encoding="utf-8").read().splitlines() == expect
  assert all(numbers.split_of(np.array(g)).tolist() == [2] * len(g) for g in groups)


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_multilingual_run_translates_into_either_language(tmp_path):
  """configs/multilingual.py:tiny trains one model on en-de and en-fr, reports both directions,
  and translates into the language of the tag; a tag it never saw is one line, exit 2,
  nothing written."""
  workdir = str(tmp_path / "ml")
  proc = run_main("--config=configs/multilingual.py:tiny", f"--workdir={workdir}",
                  timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  final = {k for r in records for k in r}
  for metric in ("test/bleu", "test_fr/bleu", "eval_fr/bleu", "eval/bleu"):
    assert metric in final, metric
  assert "corpus fr: 2,000 pairs x weight 1" in proc.stderr
  source = tmp_path / "in.txt"
  source.write_text("twelve\n>>de<< twelve\n")
  out = tmp_path / "out.txt"
  proc = run_main("--mode=translate", f"--workdir={workdir}", f"--input={source}",
                  f"--output={out}", "--config.decode.tag=>>fr<<", "--output_format=jsonl")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert len(out.read_text().splitlines()) == 2
  for args in (["--config.decode.tag=>>es<<"], []):
    bad = tmp_path / "bad.txt"
    bad.write_text("twelve\n>>es<< twelve\n")
    proc = run_main("--mode=translate", f"--workdir={workdir}", f"--input={bad}",
                    f"--output={tmp_path / 'bad.out'}", *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "'>>es<<'" in proc.stderr.strip().splitlines()[-1]
    assert not any(p.name.startswith("bad.out") for p in tmp_path.iterdir())


def test_bad_corpus_files_name_the_corpus(tmp_path):
  """A corpus's missing file and files of unequal length: one line naming the corpus, exit 2,
  before anything is written."""
  src, tgt = tmp_path / "bt.en", tmp_path / "bt.de"
  src.write_text("a\nb\nc\n")
  tgt.write_text("x\ny\n")
  config_file = tmp_path / "bt.py"
  config_file.write_text(
    "from configs import common, numbers\n"
    "def get_config(arg=None):\n"
    "  c = numbers.get_config('tiny')\n"
    f"  c.data.corpora.bt = common.corpus('text', train_files={{'en': {str(src)!r}, "
    f"'de': {str(tgt)!r}}}, heldout_pairs=0, tag='<BT>')\n"
    "  return c\n")
  for files, message in (({}, "has 3 lines but"),
                         ({"en": str(tmp_path / "none.en")}, "none.en")):
    args = [f"--config.data.corpora.bt.train_files.{k}={v}" for k, v in files.items()]
    workdir = tmp_path / "w"
    proc = run_main(f"--config={config_file}", f"--workdir={workdir}", *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: data.corpora.bt: ") and message in last, last
    assert not workdir.exists()


# ----------------------------------------------------------------------------- the pipeline


def backtranslation_config(tmp_path, tag="<BT>", weight=1.0):
  """configs/backtranslation.py on small files: 300 real pairs, 900 synthetic ones."""
  from configs import backtranslation

  files = numbers.write_corpus(str(tmp_path / "tfds"), "tiny")
  en = open(files["train"]["en"], encoding="utf-8").read().splitlines()
  de = open(files["train"]["de"], encoding="utf-8").read().splitlines()
  paths = {}
  for name, lines in (("real.en", en[:300]), ("real.de", de[:300]), ("synth.en", en[300:1200]),
                      ("synth.de", de[300:1200])):
    paths[name] = tmp_path / name
    if not paths[name].exists():
      paths[name].write_text("".join(x + "\n" for x in lines), encoding="utf-8")
  config = backtranslation.get_config("en-de,small")
  config.data.train_files.en, config.data.train_files.de = str(paths["real.en"]), str(
    paths["real.de"])
  config.data.heldout_pairs = 50
  config.data.corpora.synthetic.train_files.en = str(paths["synth.en"])
  config.data.corpora.synthetic.train_files.de = str(paths["synth.de"])
  config.data.corpora.synthetic.tag = tag
  config.data.corpora.synthetic.weight = weight
  config.data.vocab_size = config.model.vocab_size = 200
  config.data.packing = False
  config.data.bucket_lengths = [16, 32, 64]
  config.data.cache_dir = str(tmp_path / "cache")
  return config


def test_tagged_backtranslation_pipeline_and_shared_caches(tmp_path):
  """The synthetic sources (and only they) start with the tag in the training split; the
  evaluation splits are the real corpus's; a second run listing the same corpora with another
  weight reuses both token caches and only composes a new mixture."""
  from transformer.data import input_pipeline as ip

  config = backtranslation_config(tmp_path)
  pipe = ip.build_pipeline(config, str(tmp_path / "w1"), batch_multiple=1)
  tag = pipe.tokenizer.piece_id("<BT>")
  assert pipe.tag_ids == {"synthetic": tag}
  split = pipe.train.split
  first = np.asarray(split.source)[np.asarray(split.source_offsets[:-1])]
  assert len(split) == 200 + 900  # 300 real minus 2 x 50 held out, and the synthetic pairs
  assert (first[:200] != tag).all() and (first[200:] == tag).all()
  text = pipe.tokenizer.decode(split.source[split.source_offsets[200]:split.source_offsets[201]])
  assert text.startswith("<BT> ") and "<BT>" not in text[4:]
  assert sorted(pipe.references) == ["synthetic/test", "synthetic/validation", "test",
                                     "validation"]
  assert len(pipe.references["validation"]) == 50 and pipe.references["synthetic/test"] == []
  caches = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith("train-")
                  and not p.name.endswith(".lock"))
  assert len(caches) == 2
  # Another run, the real pairs upsampled: the same vocabulary (the same sample), so the same
  # token caches; a new mixture of 2 x 200 + 900 pairs.
  import shutil

  shutil.copytree(tmp_path / "w1" / "vocab", tmp_path / "w2" / "vocab")
  config.data.weight = 2.0
  again = ip.build_pipeline(config, str(tmp_path / "w2"), batch_multiple=1)
  assert len(again.train.split) == 2 * 200 + 900
  assert caches == sorted(p.name for p in (tmp_path / "cache").iterdir()
                          if p.name.startswith("train-") and not p.name.endswith(".lock"))
  assert len([p for p in (tmp_path / "cache").iterdir() if p.name.startswith("mixture-")
              and not p.name.endswith(".lock")]) == 2
  # The same batches for the same (seed, step), from a fresh start on the written caches.
  third = ip.build_pipeline(config, str(tmp_path / "w2"), batch_multiple=1)
  for step in (0, 7, 31):
    for key in ("inputs", "targets"):
      np.testing.assert_array_equal(again.train.batch(step)[key], third.train.batch(step)[key])


def test_a_tag_the_init_from_vocabulary_lacks_is_refused_before_any_write(tiny_trained,
                                                                           tmp_path):
  """Fine-tuning keeps the source's vocabulary: a tag that is not one of its pieces is one line
  naming the tag's field, exit 2, and the new workdir is not created."""
  workdir = tmp_path / "ft"
  proc = run_main("--config=configs/multilingual.py:tiny", f"--workdir={workdir}",
                  f"--config.init_from={tiny_trained[0]}")
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert "data.tag='>>de<<'" in last and "no such piece" in last, last
  assert not workdir.exists()


def test_mixture_split_packs_across_corpora():
  """Packed rows take pairs of every corpus of a mixture, tags in front of the tagged ones."""
  from transformer.data.packing import PackedBatches

  a, b = split_of(200, 7, 0), split_of(200, 8, 1)
  split = mixture.mixture_split([(a, 1.0, None), (b, 1.0, 5)], seed=0, directory=None)
  config = numbers_config.get_config("tiny")
  config.data.packing = True
  config.data.packed_source_len = config.data.packed_target_len = 32
  config.data.tokens_per_batch = 256
  batches = PackedBatches(split, config)
  firsts = set()
  for step in range(batches.steps_per_epoch):
    inputs = batches.batch(step)["inputs"]
    firsts |= set(np.unique(inputs).tolist()) & {5, 7}
  assert firsts == {5, 7}
