"""Tests of the data layer: generated corpus, tokenizer, WMT loading, batching."""

import os
import time

import ml_collections
import numpy as np
import pytest
from num2words import num2words

from transformer.data import bucketing, vocabulary
from transformer.data import input_pipeline as ip
from transformer.data import numbers as nb
from transformer.data.errors import DataError
from transformer.data.tfds_io import SplitReader
from transformer.data.token_cache import TokenizedSplit
from transformer.data.tokenizer import EOS_ID, Tokenizer, truncate


class PairsReader:
  """The interface of `tfds_io.SplitReader` over in-memory pairs."""

  def __init__(self, train, name="pairs"):
    self.train = list(train)
    self.name = name
    self.source_key, self.target_key = "en", "de"

  def fingerprint(self):
    return f"{self.name}|{len(self.train)}"

  def num_examples(self, split):
    return len(self.train)

  def chunks(self, split, size=64):
    for i in range(0, len(self.train), size):
      part = self.train[i : i + size]
      yield [s.encode() for s, _ in part], [t.encode() for _, t in part]

  def read_pairs(self, split):
    return list(self.train)


def make_config(**data) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.dataset = "numbers"
  config.data_dir = None
  config.seed = 7
  config.data = ml_collections.ConfigDict(
    dict(
      source_lang="en",
      target_lang="de",
      download=False,
      vocab_size=300,
      spm_train_sentences=500,
      max_source_len=40,
      max_target_len=40,
      tokens_per_batch=512,
      bucket_lengths=[8, 16, 32, 48],
      eval_batch_size=10,
      numbers_variant="tiny",
    ) | data
  )
  return config


# --- generated corpus ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def numbers_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("tfds"))
  nb.write_corpus(d, "tiny")
  return d


def test_words_match_num2words():
  assert nb.english(347) == "three hundred and forty-seven"
  assert nb.german(347) == "dreihundertsiebenundvierzig"
  assert nb.german(1001) == "eintausendeins"
  assert nb.german(101_000) == "einhunderteintausend"  # num2words writes "...einstausend".
  rng = np.random.default_rng(0)
  for n in [0, 1, 999, 1000, 1100, 21_000, 999_999, *rng.integers(0, 10**6, 200).tolist()]:
    assert nb.english(n) == num2words(n)
    high = n // 1000
    if not (high > 100 and high % 100 == 1):
      assert nb.german(n) == num2words(n, lang="de")


def test_corpus_is_deterministic(numbers_dir, tmp_path):
  nb.write_corpus(str(tmp_path), "tiny")
  for split in ("train", "test"):
    assert nb.load_numbers(split, numbers_dir, "tiny") == nb.load_numbers(
      split, str(tmp_path), "tiny"
    )


def test_corpus_content_and_disjoint_splits(numbers_dir):
  cfg = nb.VARIANTS["tiny"]
  used = {}
  for split in nb.SPLITS:
    groups = nb.sentence_numbers(split, cfg.size(split), cfg.seed)
    assert all(1 <= len(g) <= nb.MAX_NUMBERS_PER_SENTENCE for g in groups)
    used[split] = {n for g in groups for n in g}
    expected = [
      (" and then ".join(map(nb.english, g)), " und dann ".join(map(nb.german, g))) for g in groups
    ]
    assert nb.load_numbers(split, numbers_dir, "tiny") == [
      expected[i] for i in nb.stored_order(split, len(expected))]
  assert not used["train"] & used["test"]
  assert not used["train"] & used["validation"]
  assert not used["validation"] & used["test"]
  # Held-out numbers are compositions of words seen in training, never new atoms.
  assert min(used["test"] | used["validation"]) >= nb.ALWAYS_TRAIN
  assert min(used["train"]) < 10  # Biased to small numbers, yet reaching large ones.
  assert max(used["train"]) > 100_000


def test_fast_reader_matches_tfds_reader(numbers_dir):
  import tensorflow_datasets as tfds

  from transformer.data import numbers_tfds

  builder = numbers_tfds.build_numbers(numbers_dir, "tiny")
  slow = [(ex["en"].decode(), ex["de"].decode())
          for ex in tfds.as_numpy(builder.as_dataset(split="train", shuffle_files=False))]
  reader = SplitReader(builder, "en", "de")
  assert reader.read_pairs("train") == slow
  assert sum(len(s) for s, _ in reader.chunks("train", 300)) == reader.num_examples("train")
  # Both forms of the corpus hold the same pairs in the same order.
  for split in nb.SPLITS:
    assert SplitReader(builder, "de", "en").read_pairs(split) == [
      (d, e) for e, d in nb.load_numbers(split, numbers_dir, "tiny")]


def test_load_splits_numbers_direction(numbers_dir):
  config = make_config()
  config.data_dir = numbers_dir
  splits = ip.load_splits(config)
  assert {k: len(v) for k, v in splits.items()} == {"train": 2000, "validation": 200, "test": 200}
  assert splits["validation"] == nb.load_numbers("validation", numbers_dir, "tiny")  # (en, de)
  config.data.source_lang, config.data.target_lang = "de", "en"
  assert ip.load_splits(config)["test"] == [(d, e) for e, d in splits["test"]]


def test_bad_language_pair_or_variant_is_data_error():
  with pytest.raises(DataError, match="source_lang"):
    ip.load_splits(make_config(source_lang="es"))
  with pytest.raises(DataError, match="numbers_variant"):
    ip.load_splits(make_config(numbers_variant="huge"))


# --- tokenizer ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def texts():
  return [s for pair in nb.generate("train", 500) for s in pair]


@pytest.fixture(scope="module")
def tokenizer(texts, tmp_path_factory):
  return Tokenizer.train(texts, str(tmp_path_factory.mktemp("spm") / "spm"), 300)


def test_tokenizer_round_trip_and_eos(tokenizer, texts):
  assert tokenizer.vocab_size == 300
  for text in texts[:100]:
    ids = tokenizer.encode(text)
    assert ids[-1] == EOS_ID and EOS_ID not in ids[:-1] and 0 not in ids
    assert tokenizer.decode(ids) == text
  batch = tokenizer.encode_batch(texts[:5])
  assert batch == [tokenizer.encode(t) for t in texts[:5]]
  first, second = tokenizer.encode(texts[0]), tokenizer.encode(texts[1])
  assert tokenizer.decode(first + second) == texts[0]  # Stops at the first EOS.
  assert tokenizer.decode([0, *first[:-1], 0, 0]) == texts[0]  # Padding ignored.
  assert tokenizer.decode(np.array(first + [0] * 3)) == texts[0]


def test_truncate_keeps_eos_last_and_the_kind_of_its_input():
  ids = [5, 6, 7, 8, EOS_ID]
  assert truncate(ids, 3) == [5, 6, EOS_ID]
  assert truncate(ids, 5) is ids and truncate(ids, 9) is ids
  arr = np.array(ids, np.int32)
  cut = truncate(arr, 2)
  assert cut.dtype == np.int32 and cut.tolist() == [5, EOS_ID]


def test_tokenizer_training_is_deterministic_and_atomic(texts, tmp_path):
  a = Tokenizer.train(texts, str(tmp_path / "a" / "spm"), 300)
  b = Tokenizer.train(texts, str(tmp_path / "b" / "spm"), 300)
  assert a.encode(texts[3]) == b.encode(texts[3])
  pieces = lambda t: [t._sp.id_to_piece(i) for i in range(t.vocab_size)]
  assert pieces(a) == pieces(b)
  assert sorted(os.listdir(tmp_path / "a")) == ["spm.model", "spm.vocab"]  # No temp left.


def test_damaged_model_is_data_error(tokenizer, tmp_path):
  path = tmp_path / "broken.model"
  path.write_bytes(open(tokenizer.path, "rb").read()[:100])
  with pytest.raises(DataError, match=str(path)) as info:
    Tokenizer.load(str(path))
  assert "\n" not in str(info.value)
  with pytest.raises(DataError, match="missing.model"):
    Tokenizer.load(str(tmp_path / "missing.model"))


def test_get_tokenizer_trains_once_then_reuses(tmp_path):
  pairs = list(nb.generate("train", 300))
  config = make_config()
  tok = vocabulary.get_tokenizer(config, str(tmp_path), PairsReader(pairs))
  path = tmp_path / "vocab" / "spm.model"
  stamp = path.stat().st_mtime_ns
  again = vocabulary.get_tokenizer(config, str(tmp_path), None)  # Reused: needs no training data.
  assert path.stat().st_mtime_ns == stamp
  assert again.encode(pairs[0][1]) == tok.encode(pairs[0][1])
  with pytest.raises(DataError, match="vocab_size"):  # The stored vocabulary has 300 ids.
    vocabulary.get_tokenizer(make_config(vocab_size=250), str(tmp_path), PairsReader(pairs))


def test_get_tokenizer_vocab_too_large_is_data_error(tmp_path):
  pairs = list(nb.generate("train", 20))
  with pytest.raises(DataError, match=r"config.data.vocab_size=5000 .* at most \d+"):
    vocabulary.get_tokenizer(make_config(vocab_size=5000), str(tmp_path), PairsReader(pairs))
  assert not (tmp_path / "vocab" / "spm.model").exists()
  vocab = tmp_path / "vocab"
  assert not vocab.exists() or os.listdir(vocab) == []  # No temporary files left behind.


# --- training batches ---------------------------------------------------------------------------


def synthetic_ids(n=600, seed=0):
  """Examples whose ids are recognisable: source i is [3 + i % 97, ...] of random length."""
  rng = np.random.default_rng(seed)
  src, tgt = [], []
  for i in range(n):
    ls, lt = rng.integers(1, 50, size=2)
    src.append(np.array([3 + i % 97] * (ls - 1) + [EOS_ID], np.int32))
    tgt.append(np.array([100 + i % 89] * (lt - 1) + [EOS_ID], np.int32))
  return src, tgt


def train_batches(src, tgt, config, **kw):
  return bucketing.TrainBatches(TokenizedSplit.from_sequences(src, tgt), config, **kw)


def padded(ids, length):
  out = np.zeros(length, np.int32)
  out[: len(ids)] = ids
  return out


def test_train_batches_are_pure_functions_of_seed_and_step():
  src, tgt = synthetic_ids()
  config = make_config()
  a = train_batches(src, tgt, config, batch_multiple=8)
  b = train_batches(src, tgt, config, batch_multiple=8)
  steps = list(range(2 * a.steps_per_epoch + 3))
  got_a = [a.batch(s) for s in steps]
  got_b = {s: b.batch(s) for s in reversed(steps)}  # Another access order, e.g. a resume.
  for s in steps:
    np.testing.assert_array_equal(got_a[s]["inputs"], got_b[s]["inputs"])
    np.testing.assert_array_equal(got_a[s]["targets"], got_b[s]["targets"])
  other = train_batches(src, tgt, make_config(), batch_multiple=8)
  other.seed = 8
  assert any(
    other.batch(s)["inputs"].shape != a.batch(s)["inputs"].shape
    or (other.batch(s)["inputs"] != a.batch(s)["inputs"]).any()
    for s in range(5)
  )


def test_train_batches_shapes_budget_and_epoch_coverage():
  src, tgt = synthetic_ids()
  config = make_config()
  tb = train_batches(src, tgt, config, batch_multiple=8)
  lengths = [(len(s), len(t)) for s, t in zip(src, tgt, strict=True)]
  kept = [i for i, (ls, lt) in enumerate(lengths) if ls <= 40 and lt <= 40]
  assert tb.num_examples == len(kept) and tb.num_dropped == len(src) - len(kept) > 0
  shapes = set(tb.shapes())
  assert all(rows % 8 == 0 for rows, _ in shapes)
  for epoch in range(2):
    seen = []
    for step in range(epoch * tb.steps_per_epoch, (epoch + 1) * tb.steps_per_epoch):
      batch, idx = tb.batch(step), tb.indices(step)
      assert batch["inputs"].dtype == np.int32
      assert batch["inputs"].shape == batch["targets"].shape
      assert batch["inputs"].shape in shapes
      length = batch["inputs"].shape[1]
      for row, i in enumerate(idx.tolist()):
        if i < 0:  # Padding row.
          assert not batch["inputs"][row].any() and not batch["targets"][row].any()
          continue
        np.testing.assert_array_equal(batch["inputs"][row], padded(src[i], length))
        np.testing.assert_array_equal(batch["targets"][row], padded(tgt[i], length))
        # The smallest bucket that holds the example.
        assert length == min(b for b in config.data.bucket_lengths if b >= max(lengths[i]))
      # At most tokens_per_batch positions of real examples per side.
      assert (idx >= 0).sum() * length <= config.data.tokens_per_batch
      seen.extend(i for i in idx.tolist() if i >= 0)
    assert sorted(seen) == kept  # Every kept example exactly once per epoch.
  first = np.concatenate([tb.indices(s) for s in range(tb.steps_per_epoch)])
  second = np.concatenate([tb.indices(tb.steps_per_epoch + s) for s in range(tb.steps_per_epoch)])
  assert (first != second).any()  # Each epoch has its own order.


def test_train_batches_process_shards_concatenate_to_global_batch():
  src, tgt = synthetic_ids(300)
  config = make_config()
  full = train_batches(src, tgt, config, batch_multiple=8)
  shards = [
    train_batches(src, tgt, config, batch_multiple=8, process_index=p, process_count=4)
    for p in range(4)
  ]
  for step in range(full.steps_per_epoch + 2):
    for key in ("inputs", "targets"):
      parts = [s.batch(step)[key] for s in shards]
      np.testing.assert_array_equal(np.concatenate(parts), full.batch(step)[key])


def test_train_batches_minimum_batch_and_errors():
  src, tgt = synthetic_ids(50)
  tb = train_batches(src, tgt, make_config(tokens_per_batch=64), batch_multiple=8)
  assert all(b == 8 for b, _ in tb.shapes())  # Never fewer than batch_multiple rows.
  with pytest.raises(ValueError, match="batch_multiple"):
    train_batches(src, tgt, make_config(), batch_multiple=6, process_count=4)
  with pytest.raises(DataError):
    train_batches(src, tgt, make_config(max_source_len=0), batch_multiple=8)


def test_train_batches_do_not_depend_on_the_devices():
  """The plan is a function of (seed, step): more devices only add all-zero rows."""
  src, tgt = synthetic_ids(300)
  config = make_config()
  one = train_batches(src, tgt, config, batch_multiple=1)
  eight = train_batches(src, tgt, config, batch_multiple=8)
  halves = [train_batches(src, tgt, config, batch_multiple=8, process_index=p, process_count=2)
            for p in range(2)]
  assert one.steps_per_epoch == eight.steps_per_epoch
  for step in range(one.steps_per_epoch + 3):
    a, b = one.batch(step), eight.batch(step)
    n = len(a["inputs"])
    assert len(b["inputs"]) % 8 == 0 and len(b["inputs"]) - n < 8
    for key in ("inputs", "targets"):
      np.testing.assert_array_equal(b[key][:n], a[key])
      assert not b[key][n:].any()  # Padding rows, not other examples.
      np.testing.assert_array_equal(np.concatenate([h.batch(step)[key] for h in halves]), b[key])


def test_token_cache_is_built_once_mapped_and_keyed_by_the_vocabulary(tmp_path):
  from transformer.data import token_cache

  pairs = list(nb.generate("train", 400))
  config = make_config()
  tok = vocabulary.get_tokenizer(config, str(tmp_path / "w"), PairsReader(pairs))
  root = token_cache.cache_root(config, str(tmp_path / "w"))
  split = token_cache.load_or_build(PairsReader(pairs), "train", tok, root)
  assert isinstance(split.source, np.memmap) and split.source.dtype == np.uint16
  (built,) = [p for p in root.iterdir() if p.is_dir()]
  stamp = os.stat(built / "meta.json").st_mtime_ns

  class Unreadable(PairsReader):
    def chunks(self, split, size=64):
      raise AssertionError("the cache should have been used")

  again = token_cache.load_or_build(Unreadable(pairs), "train", tok, root)
  fresh = TokenizedSplit.from_sequences(*ip.tokenize_pairs(tok, pairs))
  for got in (split, again):
    for field in ("source", "source_offsets", "target", "target_offsets"):
      np.testing.assert_array_equal(getattr(got, field), getattr(fresh, field))
  assert os.stat(built / "meta.json").st_mtime_ns == stamp
  # Batches from the cache equal batches from a fresh tokenization.
  a = bucketing.TrainBatches(again, config, batch_multiple=8)
  b = bucketing.TrainBatches(fresh, config, batch_multiple=8)
  for step in range(a.steps_per_epoch + 2):
    np.testing.assert_array_equal(a.batch(step)["inputs"], b.batch(step)["inputs"])
    np.testing.assert_array_equal(a.batch(step)["targets"], b.batch(step)["targets"])
  # Another vocabulary or another corpus never reuses the cache.
  other = Tokenizer.train([s for p in pairs for s in p], str(tmp_path / "other" / "spm"), 200)
  token_cache.load_or_build(PairsReader(pairs), "train", other, root)
  token_cache.load_or_build(PairsReader(pairs[:-1]), "train", tok, root)
  assert len([p for p in root.iterdir() if p.is_dir()]) == 3


# --- evaluation batches -------------------------------------------------------------------------


def test_eval_batches_cover_everything_with_fixed_rows():
  src, tgt = synthetic_ids(95)
  pairs = list(zip(src, tgt, strict=True))
  config = make_config(eval_batch_size=10, max_target_len=20)
  batches = ip.eval_batches(pairs, config, batch_multiple=8)
  assert all(b["inputs"].shape[0] == 16 for b in batches)  # 10 rounded up to 8's multiple.
  idx = np.concatenate([b["indices"] for b in batches])
  assert sorted(i for i in idx.tolist() if i >= 0) == list(range(len(pairs)))
  for b in batches:
    assert b["inputs"].shape == b["targets"].shape
    assert b["inputs"].shape[1] in config.data.bucket_lengths
    for row, i in enumerate(b["indices"].tolist()):
      if i < 0:
        assert not b["inputs"][row].any() and not b["targets"][row].any()
        continue
      got_s = b["inputs"][row][b["inputs"][row] != 0]
      got_t = b["targets"][row][b["targets"][row] != 0]
      np.testing.assert_array_equal(got_s[:-1], src[i][: len(got_s) - 1])
      assert got_s[-1] == EOS_ID and len(got_s) == min(len(src[i]), 40)
      np.testing.assert_array_equal(got_t[:-1], tgt[i][: len(got_t) - 1])
      assert got_t[-1] == EOS_ID and len(got_t) == min(len(tgt[i]), 20)  # Truncated, EOS kept.
  shards = [ip.eval_batches(pairs, config, 8, process_index=p, process_count=2) for p in range(2)]
  for g, b0, b1 in zip(batches, *shards, strict=True):
    np.testing.assert_array_equal(np.concatenate([b0["indices"], b1["indices"]]), g["indices"])


# --- end to end and WMT -------------------------------------------------------------------------


def test_build_pipeline_on_numbers(numbers_dir, tmp_path):
  config = make_config(max_source_len=64, max_target_len=64, bucket_lengths=[16, 32, 64])
  config.data_dir = numbers_dir
  pipe = ip.build_pipeline(config, str(tmp_path), batch_multiple=8)
  assert pipe.train.num_examples > 0.9 * 2000
  batch = pipe.train.batch(0)
  assert batch["inputs"].shape in set(pipe.train.shapes())
  b = pipe.eval["test"][0]
  row = int(np.flatnonzero(b["indices"] >= 0)[0])
  src, tgt = pipe.references["test"][b["indices"][row]]
  assert pipe.tokenizer.decode(b["inputs"][row]) == src
  assert pipe.tokenizer.decode(b["targets"][row]) == tgt


def wmt_config(data_dir, **data):
  config = make_config(**data)
  config.dataset = "wmt14"
  config.data_dir = str(data_dir)
  return config


def test_wmt14_loads_under_mock_data_in_en_de_direction(tmp_path):
  import tensorflow_datasets as tfds

  with tfds.testing.mock_data(num_examples=6):
    ds = tfds.builder("wmt14_translate/de-en").as_dataset(split="validation")
    raw = [(ex["en"].decode(), ex["de"].decode()) for ex in tfds.as_numpy(ds)]
    splits = ip.load_splits(wmt_config(tmp_path))
    reverse = ip.load_splits(wmt_config(tmp_path, source_lang="de", target_lang="en"))
  assert {k: len(v) for k, v in splits.items()} == {"train": 6, "validation": 6, "test": 6}
  assert splits["validation"] == raw  # (en, de): the files' (de, en) swapped.
  assert reverse["validation"] == [(d, e) for e, d in raw]


def test_wmt14_missing_offline_fails_at_once(tmp_path):
  start = time.monotonic()
  with pytest.raises(DataError, match="wmt14_translate/de-en is not prepared") as info:
    ip.load_splits(wmt_config(tmp_path / "empty"))
  assert time.monotonic() - start < 10
  message = str(info.value)
  assert "\n" not in message and "tfds build" in message and str(tmp_path / "empty") in message


# --- bucket lengths derived from the corpus, packing by default ----------------------------------


def _padded(buckets, longest):
  """Positions of the examples padded to their buckets (each the smallest that holds it)."""
  return int(np.asarray(buckets)[np.searchsorted(buckets, longest)].sum())


def test_derived_buckets_pad_least():
  """Against every choice of at most `count` rounded lengths, on random distributions."""
  import itertools

  rng = np.random.default_rng(0)
  for _ in range(25):
    longest = rng.integers(1, rng.integers(2, 90), size=rng.integers(1, 60))
    count = int(rng.integers(1, 5))
    buckets = bucketing.derive_buckets(longest, count=count, multiple=8)
    assert len(buckets) <= count and buckets == sorted(set(buckets))
    assert all(b % 8 == 0 for b in buckets) and buckets[-1] >= longest.max()
    lengths = sorted({-(-int(n) // 8) * 8 for n in longest})
    least = min(_padded(sorted(c) + [lengths[-1]], longest) for k in range(count)
                for c in itertools.combinations(lengths[:-1], k))
    assert _padded(buckets, longest) == least


def test_derived_buckets_split_a_long_tail():
  """Lengths as in WMT: most pairs short, a tail to the limit. Equal-count quantiles leave the
  tail to one bucket of the longest length; the derived buckets pad far less."""
  rng = np.random.default_rng(0)
  longest = np.clip(rng.lognormal(np.log(25), 0.6, 50_000).astype(np.int64), 2, 256)
  buckets = bucketing.derive_buckets(longest, count=8, multiple=8)
  assert len(buckets) == 8 and buckets[-1] == 256
  quantiles = sorted({-(-int(q) // 8) * 8 for q in np.quantile(
    longest, np.arange(1, 9) / 8, method="higher")})
  real = longest.sum()
  assert real / _padded(buckets, longest) > real / _padded(quantiles, longest) + 0.1


def test_auto_buckets_follow_the_training_split_and_pad_less():
  rng = np.random.default_rng(1)
  lengths = rng.integers(3, 14, size=(2000, 2))  # short sentences, as in the user's corpus
  split = TokenizedSplit.from_sequences([np.ones(n, np.int32) for n in lengths[:, 0]],
                                        [np.ones(n, np.int32) for n in lengths[:, 1]])
  fixed = bucketing.TrainBatches(split, make_config(bucket_lengths=[16, 24, 32, 48],
                                             tokens_per_batch=1024))
  auto = bucketing.TrainBatches(split, make_config(bucket_lengths="auto", tokens_per_batch=1024))
  assert auto.buckets == bucketing.resolve_buckets(make_config(bucket_lengths="auto"), split)
  assert auto.buckets[-1] == 16 and len(auto.buckets) > 1
  assert auto.real_token_fraction() > fixed.real_token_fraction() + 0.05
  assert [len(b["inputs"][0]) for b in map(auto.batch, range(5))] == [
    auto.buckets[int(auto._plan(0).bucket[i])] for i in range(5)]  # noqa: SLF001


def test_auto_buckets_are_kept_beside_the_token_cache(tmp_path, monkeypatch):
  import dataclasses

  lengths = np.random.default_rng(2).integers(3, 40, size=(500, 2))
  split = dataclasses.replace(
    TokenizedSplit.from_sequences([np.ones(n, np.int32) for n in lengths[:, 0]],
                                  [np.ones(n, np.int32) for n in lengths[:, 1]]),
    directory=str(tmp_path))
  config = make_config(bucket_lengths="auto")
  first = bucketing.resolve_buckets(config, split)
  assert first == bucketing.resolve_buckets(config, dataclasses.replace(split, directory=None))

  def never(self):
    raise AssertionError("read the corpus's lengths again")

  monkeypatch.setattr(TokenizedSplit, "source_lengths", never)
  assert bucketing.resolve_buckets(config, split) == first  # a restart reads the kept lengths
  config.data.max_source_len = 20  # other limits, other buckets: derived again
  with pytest.raises(AssertionError, match="again"):
    bucketing.resolve_buckets(config, split)


def test_bucket_lengths_field_takes_auto_or_a_list_and_nothing_else():
  from configs import numbers as numbers_config
  from transformer.errors import ConfigError
  from transformer.training.validate import validate

  config = numbers_config.get_config()
  config.data.bucket_lengths = "auto"
  validate(config, 1)
  for bad in ("big", [32, 16], 7):
    config.data.bucket_lengths = bad
    with pytest.raises(ConfigError, match="data.bucket_lengths="):
      validate(config, 1)


@pytest.mark.parametrize("path,arg", [("numbers", None), ("wmt", "base"), ("wmt", "big"),
                                      ("wmt", "fr_base"), ("wmt", "fr_big"), ("text", None),
                                      ("text", "fr-en,tsv")])
def test_every_corpus_config_packs_by_default(path, arg):
  import importlib

  config = importlib.import_module(f"configs.{path}").get_config(arg)
  assert config.data.packing is True


def test_packed_rows_of_a_short_sentence_corpus_are_almost_all_real_tokens():
  from configs import text as text_config
  from transformer.data.packing import PackedBatches

  rng = np.random.default_rng(2)
  # About 7 words a side (9 pieces with EOS); the target a noisy function of the source.
  src = np.clip(rng.lognormal(np.log(9), 0.5, 5000).astype(int), 2, 60)
  tgt = np.clip(np.round(src * 1.1 + rng.normal(0, 2, 5000)).astype(int), 2, 60)
  lengths = np.stack([src, tgt], 1)
  split = TokenizedSplit.from_sequences([np.ones(n, np.int32) for n in lengths[:, 0]],
                                        [np.ones(n, np.int32) for n in lengths[:, 1]])
  config = text_config.get_config()
  packed = PackedBatches(split, config)
  assert packed.real_token_fraction() >= 0.95
