"""benchmarks/synthetic_wmt.py, the synthetic WMT14 stand-in: TFDS layout, sizes, determinism,
length statistics."""

import itertools
import os

import numpy as np
import pytest

from benchmarks import synthetic_wmt as sw

# Most tests here build the synthetic corpus or a TFDS dataset of it: `-m 'not slow'` leaves
# the whole file out.
pytestmark = pytest.mark.slow

SIZES = {"train": 2000, "validation": 100, "test": 100}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("synthetic_wmt"))
  sw.build_synthetic_wmt14(
    d, train_size=SIZES["train"], validation_size=SIZES["validation"], test_size=SIZES["test"]
  )
  return d


def _read(builder, split):
  import tensorflow_datasets as tfds

  ds = builder.as_dataset(split=split, shuffle_files=False)
  return [(ex["de"].decode(), ex["en"].decode()) for ex in tfds.as_numpy(ds)]


def test_real_builder_reads_it(data_dir):
  import tensorflow_datasets as tfds

  builder = tfds.builder("wmt14_translate/de-en", data_dir=data_dir)
  assert builder.is_prepared()
  assert type(builder).__module__ == "tensorflow_datasets.translate.wmt14"
  assert str(builder.version) == "1.0.0"
  assert sorted(builder.info.features.keys()) == ["de", "en"]
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == SIZES
  for split, size in SIZES.items():
    pairs = _read(builder, split)
    assert len(pairs) == size
    # The files hold exactly the generated pairs (in TFDS's shuffled order).
    assert sorted(pairs) == sorted(sw.generate_pairs(split, size))


def test_layout_is_tfds_build(data_dir):
  root = os.path.join(data_dir, "wmt14_translate")
  assert sorted(os.listdir(data_dir)) == ["wmt14_translate"]  # no downloads/ left behind
  assert sorted(os.listdir(root)) == [".config", "de-en"]
  assert os.listdir(os.path.join(root, "de-en")) == ["1.0.0"]
  files = sorted(os.listdir(os.path.join(root, "de-en", "1.0.0")))
  assert files == [
    "dataset_info.json",
    "features.json",
    "wmt14_translate-test.tfrecord-00000-of-00001",
    "wmt14_translate-train.tfrecord-00000-of-00001",
    "wmt14_translate-validation.tfrecord-00000-of-00001",
  ]


def test_second_build_is_skipped(data_dir):
  info = os.path.join(data_dir, "wmt14_translate", "de-en", "1.0.0", "dataset_info.json")
  before = os.stat(info).st_mtime_ns
  sw.build_synthetic_wmt14(data_dir, train_size=10, validation_size=10, test_size=10)
  assert os.stat(info).st_mtime_ns == before


def test_generation_is_deterministic():
  first = list(itertools.islice(sw.generate_pairs("train", 5000, seed=0), 50))
  assert first == list(itertools.islice(sw.generate_pairs("train", 5000, seed=0), 50))
  # Pair i does not depend on the split's size; seeds and splits differ.
  assert first[:10] == list(sw.generate_pairs("train", 10, seed=0))
  assert first[:10] != list(sw.generate_pairs("train", 10, seed=1))
  assert first[:10] != list(sw.generate_pairs("test", 10, seed=0))


def test_capitalised_pieces():
  words = ["über", "ärger", "öl", "abc", "", "1.5", "Sie", "zug", "x"]
  pieces = sw.Pieces.of(words)
  ids = np.arange(len(words))
  assert pieces.capitalised().join(ids) == "".join(w[:1].upper() + w[1:] for w in words)
  mask = np.array([True, False] * 4 + [True])
  assert pieces.capitalised(mask).join(ids) == "".join(
    w[:1].upper() + w[1:] if m else w for w, m in zip(words, mask, strict=True)
  )


def test_child_process_generates_the_same_chunks():
  size = sw.CHUNK_SIZE + 7
  child = list(sw.child_chunks("validation", size, 0))
  assert child == list(sw.generate_chunks("validation", size, 0))
  assert [len(en) for _, en in child] == [sw.CHUNK_SIZE, 7]


def test_length_statistics_are_wmt_like():
  de, en = [], []
  for d, e in sw.generate_chunks("train", 100_000):
    de += d
    en += e
  n_en = np.array([len(s.split()) for s in en])
  n_de = np.array([len(s.split()) for s in de])
  assert 22.5 < n_en.mean() < 24.5
  assert 19 <= np.median(n_en) <= 21
  assert 0.002 < (n_en > 80).mean() < 0.02
  assert n_en.min() >= 1 and n_en.max() <= sw.MAX_WORDS
  assert 0.9 < n_de.sum() / n_en.sum() < 1.0
  assert np.corrcoef(n_en, n_de)[0, 1] > 0.9
  # Capital first letters, punctuation, umlauts on the German side only.
  assert all(s[:1].isupper() or s[:1].isdigit() for s in en[:1000])
  assert 0.03 < sum(s.count(",") for s in en) / n_en.sum() < 0.07
  text_de, text_en = "".join(de[:5000]), "".join(en[:5000])
  assert text_en.isascii()
  assert 0.005 < sum(not c.isascii() for c in text_de) / len(text_de) < 0.05
  # Zipfian: the commonest type is frequent, and there are many types.
  words = [w for s in en[:20_000] for w in s.split()]
  _, counts = np.unique(words, return_counts=True)
  assert counts.max() / len(words) > 0.02 and len(counts) > 50_000


FR_SIZES = {"train": 600, "validation": 50, "test": 40}


@pytest.fixture(scope="module")
def fr_data_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("synthetic_wmt_fr"))
  sw.build_synthetic_wmt14(
    d, pair="fr-en", train_size=FR_SIZES["train"], validation_size=FR_SIZES["validation"],
    test_size=FR_SIZES["test"],
  )
  return d


def test_fr_en_real_builder_reads_it(fr_data_dir):
  import tensorflow_datasets as tfds

  builder = tfds.builder("wmt14_translate/fr-en", data_dir=fr_data_dir)
  assert builder.is_prepared()
  assert type(builder).__module__ == "tensorflow_datasets.translate.wmt14"
  assert str(builder.version) == "1.0.0"
  assert sorted(builder.info.features.keys()) == ["en", "fr"]
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == FR_SIZES
  assert sorted(os.listdir(os.path.join(fr_data_dir, "wmt14_translate"))) == [".config", "fr-en"]
  for split, size in FR_SIZES.items():
    ds = builder.as_dataset(split=split, shuffle_files=False)
    pairs = [(ex["fr"].decode(), ex["en"].decode()) for ex in tfds.as_numpy(ds)]
    assert sorted(pairs) == sorted(sw.generate_pairs(split, size, pair="fr-en"))


def test_fr_en_is_deterministic_and_its_own_stream():
  first = list(sw.generate_pairs("train", 3000, seed=0, pair="fr-en"))[:50]
  assert first == list(sw.generate_pairs("train", 3000, seed=0, pair="fr-en"))[:50]
  assert first[:10] == list(sw.generate_pairs("train", 10, seed=0, pair="fr-en"))
  assert first[:10] != list(sw.generate_pairs("train", 10, seed=1, pair="fr-en"))
  assert [e for _, e in first[:10]] != [e for _, e in sw.generate_pairs("train", 10, seed=0)]
  assert sw.dataset_name("fr-en") == "wmt14_translate/fr-en"
  assert sw.SPLIT_SIZES["fr-en"] == {"train": 40_836_876, "validation": 3000, "test": 3003}
  with pytest.raises(ValueError, match="pair must be one of"):
    list(sw.generate_pairs("train", 1, pair="es-en"))


def test_fr_en_statistics_and_french_rules():
  fr, en = [], []
  for f, e in sw.generate_chunks("train", 2 * sw.CHUNK_SIZE, pair="fr-en"):
    fr += f
    en += e
  n_en = np.array([len(s.split()) for s in en])
  n_fr = np.array([len(s.split()) for s in fr])
  assert 22.5 < n_en.mean() < 24.5
  assert 1.1 < n_fr.sum() / n_en.sum() < 1.15  # WMT'14 en-fr: ~1.145 (Sutskever et al. 2014)
  assert np.corrcoef(n_en, n_fr)[0, 1] > 0.9
  text = "".join(fr[:5000])
  assert 0.01 < sum(not c.isascii() for c in text) / len(text) < 0.05
  assert all(s[:1].isupper() or s[:1].isdigit() for s in fr[:1000])
  words = [w.strip(",;:.?!").lower() for s in fr for w in s.split()]
  counts = {w: words.count(w) for w in ("le", "la", "les", "du", "des", "au", "aux", "ne", "pas")}
  assert min(counts.values()) > 100, counts
  pairs = {p for s in fr for t in [s.lower().split()] for p in zip(t[:-1], t[1:], strict=True)}
  # Contracted and elided where French does: no "de le", "à les", "le" + vowel.
  assert not pairs & {("de", "le"), ("de", "les"), ("à", "le"), ("à", "les")}
  assert not [b for a, b in pairs if a in ("le", "la", "de", "que") and b[:1] in "aeiouéh"]
  elided = [w for w in words if w[:2] in ("l'", "d'") or w[:3] == "qu'"]
  assert 0.02 < len(elided) / len(words) < 0.1
  # Names and numbers are copied (numbers with a decimal comma).
  for f, e in zip(fr[:300], en[:300], strict=True):
    for w in e.rstrip(".?!:").split():
      w = w.rstrip(",;:")
      if w[:1].isdigit():
        assert w.translate(str.maketrans(",.", ".,")) in f, (w, f)


def test_capitalised_french_letters():
  words = ["état", "à", "ça", "île", "œuvre", "÷x", "ô"]
  caps = sw.Pieces.of(words).capitalised().join(np.arange(len(words)))
  assert caps == "ÉtatÀÇaÎleœuvre÷xÔ"
