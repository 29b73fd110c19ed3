"""Any parallel corpus: TFDS translation builders by name (mock data), the user's own text files,
and the checks that run before any work."""

import gzip
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import numbers as numbers_config
from configs import text as text_config
from configs import wmt as wmt_config
from tests.test_train import REPO, read_metrics, run_main
from transformer.data import corpora
from transformer.data import numbers as nb
from transformer.data.errors import DataError
from transformer.data.text_io import scan
from transformer.nn.model import ModelConfig
from transformer.nn.model_family import param_count
from transformer.training.validate import validate

# --- TFDS builders by name ----------------------------------------------------------------------


def shrunk(config, steps=1):
  """`config`'s corpus, languages and splits with configs/wmt.py:tiny's sizes: one CPU step."""
  tiny = wmt_config.get_config("tiny")
  for field in ("vocab_size", "spm_train_sentences", "tokens_per_batch", "max_source_len",
                "max_target_len", "bucket_lengths", "packed_source_len", "packed_target_len",
                "eval_batch_size"):
    config.data[field] = tiny.data[field]
  dropout = config.model.dropout_rate
  config.model = tiny.model
  config.model.dropout_rate = dropout
  for field in ("optimizer", "decode"):
    config[field] = tiny[field]
  config.num_train_steps = steps
  config.checkpoint_every_steps = config.log_every_steps = steps
  config.evals.valid_loss.every_steps = steps
  config.evals.valid_translation.every_steps = 0
  config.keep_checkpoints = 2
  config.average_last_checkpoints = 0
  config.evals.valid_translation.sentences = 4
  return config


def train_under_mock(config, workdir, num_examples=64):
  from transformer.training.train import train_and_evaluate

  with tfds.testing.mock_data(num_examples=num_examples):
    return train_and_evaluate(config, str(workdir))


@pytest.mark.parametrize("dataset,src,tgt", [
  ("ted_hrlr_translate/pt_to_en", "pt", "en"),  # a TED builder: Portuguese -> English
  ("para_crawl/enfr", "en", "fr"),  # ParaCrawl: a training split only, sliced below
])
def test_tfds_builders_by_name_train_under_mock_data(tmp_path, dataset, src, tgt):
  config = shrunk(wmt_config.get_config("tiny"))
  config.dataset, config.data.source_lang, config.data.target_lang = dataset, src, tgt
  if dataset.startswith("para_crawl"):
    config.data.train_split = "train[100:]"
    config.data.eval_split = "train[:50]"
    config.data.test_split = "train[50:100]"
  validate(config, 8)
  result = train_under_mock(config, tmp_path)
  assert result["step"] == 1 and "test/bleu" in result
  # The metrics are those the config's evaluators list (the WMT configs: tokenized BLEU too).
  listed = config.evals.test_translation.metrics.split(",")
  assert {k for k in result if k.startswith("test/")} == {f"test/{m}" for m in listed}
  keys = set().union(*read_metrics(str(tmp_path)))
  assert {"train/loss", "eval/loss", "test/bleu"} <= keys


@pytest.mark.parametrize("variant", ["fr_base", "fr_big"])
def test_english_french_configs_validate_and_train_a_step(tmp_path, variant):
  config = wmt_config.get_config(variant)
  assert config.dataset == "wmt14_translate/fr-en" and config.data.target_lang == "fr"
  assert config.data.vocab_size == config.model.vocab_size == 32000  # section 5.1
  assert config.model.dropout_rate == 0.1  # section 6.1, also for big
  validate(config, 8)
  result = train_under_mock(shrunk(config), tmp_path)
  assert result["step"] == 1 and "test/bleu_tokenized" in result


def test_english_french_parameter_counts():
  """The sizes the README gives: Table 3's base and big with a 32,000-piece shared vocabulary."""
  count = lambda v: param_count(ModelConfig(**wmt_config.get_config(v).model))
  base, big, de_base = count("fr_base"), count("fr_big"), count("base")
  # Only the shared embedding differs from English-German: (37000 - 32000) x d_model.
  assert de_base - base == 5000 * 512
  assert 55e6 < base < 65e6 and 200e6 < big < 220e6


class NestedTranslate(tfds.core.GeneratorBasedBuilder):
  """Two text features nested in a dict beside other features: another layout than
  `Translation`."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
      "id": tfds.features.Scalar(dtype=np.int64),
      "pair": tfds.features.FeaturesDict({"src_en": tfds.features.Text(),
                                          "tgt_de": tfds.features.Text()}),
    }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(30), "dev": self._generate_examples(5)}

  def _generate_examples(self, n):
    for i in range(n):
      yield i, {"id": i, "pair": {"src_en": f"one {i}", "tgt_de": f"eins {i}"}}


def test_nested_text_features_and_split_strings(tmp_path):
  from transformer.data.tfds_io import SplitReader, text_features

  builder = NestedTranslate(data_dir=str(tmp_path))
  builder.download_and_prepare()
  features = text_features(builder.info.features)
  assert features == {"src_en": "pair/src_en", "tgt_de": "pair/tgt_de"}
  reader = SplitReader(builder, features["src_en"], features["tgt_de"],
                       {"train": "train[:10]", "validation": "dev", "test": "train[10:12]"})
  assert reader.num_examples("train") == 10
  pairs = reader.read_pairs("test")
  assert len(pairs) == 2 and all(s.replace("one", "eins") == t for s, t in pairs)
  assert sum(len(s) for s, _ in reader.chunks("validation", 2)) == 5


def numbers_tiny(**fields):
  config = numbers_config.get_config("tiny")
  for k, v in fields.items():
    (config if k == "dataset" else config.data)[k] = v
  return config


def test_split_strings_slice_a_prepared_corpus():
  # The numbers corpus through TFDS, prepared offline on first use.
  reader = corpora.open_corpus(numbers_tiny(dataset="numbers_translate/tiny",
                                            train_split="train[:25%]", test_split="test[:10]"))
  full = corpora.open_corpus(numbers_tiny(dataset="numbers_translate/tiny"))
  assert reader.num_examples("train") == full.num_examples("train") // 4
  assert reader.read_pairs("test") == full.read_pairs("test")[:10]
  assert reader.fingerprint() != full.fingerprint()  # a slice is other data for the caches


@pytest.mark.parametrize("change,message", [
  (dict(dataset="wmt14_translat/de-en"), "no builder 'wmt14_translat' (close: wmt14_translate"),
  (dict(dataset="wmt14_translate/xx-en"), "wmt14_translate has no config 'xx-en'; its configs:"),
  (dict(source_lang="pt"), "data.source_lang='pt': wmt14_translate/de-en has no such language; "
                           "it has de, en"),
])
def test_bad_tfds_builder_config_or_language_is_one_line(change, message):
  config = wmt_config.get_config("tiny")
  for k, v in change.items():
    (config if k == "dataset" else config.data)[k] = v
  with tfds.testing.mock_data(num_examples=4), pytest.raises(DataError) as e:
    corpora.open_corpus(config)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_a_split_the_builder_does_not_have_lists_its_splits():
  with pytest.raises(DataError, match=r"data.eval_split='dev': numbers_translate/tiny has "
                                      r"the splits train, validation, test"):
    corpora.open_corpus(numbers_tiny(dataset="numbers_translate/tiny", eval_split="dev"))
  with pytest.raises(DataError, match="data.target_lang='fr'"):
    corpora.open_corpus(numbers_tiny(dataset="numbers_translate/tiny", target_lang="fr"))
  # The numbers corpus as text files: its three splits and three languages, named the same way.
  with pytest.raises(DataError, match=r"data.eval_split='dev': numbers/tiny/\S+ has the splits "
                                      r"train, validation, test;.*=numbers_translate/tiny"):
    corpora.open_corpus(numbers_tiny(eval_split="dev"))
  with pytest.raises(DataError, match="data.target_lang='es': numbers/tiny/.* it has en, de, fr"):
    corpora.open_corpus(numbers_tiny(target_lang="es"))


def test_the_numbers_corpus_is_read_without_tensorflow(tmp_path):
  """The offline default starts without importing TensorFlow (several seconds)."""
  code = ("import sys; from configs import numbers; from transformer.data import corpora; "
          f"c = numbers.get_config('tiny'); c.data_dir = {str(tmp_path)!r}; "
          "r = corpora.open_corpus(c); assert r.num_examples('train') == 2000; "
          "r.read_pairs('test'); print(sorted(m for m in sys.modules if m.startswith('tensorf')))")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip() == "[]", proc.stdout


# --- your own text files ------------------------------------------------------------------------


def write_corpus(directory, n=400, skip_at=(), gz=False):
  """`n` numbers pairs as train.en / train.de (an empty English line at each of `skip_at`)."""
  pairs = list(nb.generate("train", n))
  os.makedirs(directory, exist_ok=True)
  en = [("   " if i in skip_at else e) for i, (e, _) in enumerate(pairs)]
  de = [d for _, d in pairs]
  opener = gzip.open if gz else open
  suffix = ".gz" if gz else ""
  for lang, lines in (("en", en), ("de", de)):
    with opener(os.path.join(directory, f"train.{lang}{suffix}"), "wt") as f:
      f.write("\n".join(lines) + "\n")
  return pairs


def text_cfg(directory, arg="en-de", **data):
  config = text_config.get_config(arg)
  if "tsv" in arg:
    config.data.train_files = os.path.join(directory, "train.tsv")
  else:
    config.data.train_files.en = os.path.join(directory, "train.en")
    config.data.train_files.de = os.path.join(directory, "train.de")
  config.data.heldout_pairs = 20
  for k, v in data.items():
    config.data[k] = v
  return config


def test_text_files_hold_out_validation_and_test_and_skip_empty_pairs(tmp_path):
  pairs = write_corpus(tmp_path, 400, skip_at=(3, 390))
  reader = corpora.open_corpus(text_cfg(tmp_path))
  validation = [p for i, p in enumerate(pairs) if i >= 380 and i != 390]
  assert reader.read_pairs("validation") == validation
  assert reader.read_pairs("test") == pairs[360:380]
  train = reader.read_pairs("train")
  assert train == [p for i, p in enumerate(pairs[:360]) if i != 3]
  assert reader.num_examples("train") == 359 and reader.skipped["train"] == 1
  # German -> English reads the same files the other way round.
  back = corpora.open_corpus(text_cfg(tmp_path, "de-en"))
  assert back.read_pairs("test") == [(d, e) for e, d in pairs[360:380]]


def test_tsv_gzip_and_separate_evaluation_files(tmp_path):
  pairs = write_corpus(tmp_path, 100)
  with gzip.open(tmp_path / "train.tsv", "wt") as f:  # gzip detected by content, not name
    f.writelines(f"{e}\t{d}\n" for e, d in pairs)
  dev = tmp_path / "dev"
  write_corpus(dev, 30, gz=True)
  config = text_cfg(tmp_path, "en-de,tsv")
  config.data.eval_files = str(tmp_path / "train.tsv")
  reader = corpora.open_corpus(config)
  assert reader.read_pairs("validation") == pairs  # given, not held out
  assert reader.read_pairs("test") == pairs[80:] and reader.read_pairs("train") == pairs[:80]
  config = text_cfg(dev, heldout_pairs=10)
  config.data.train_files.en = str(dev / "train.en.gz")
  config.data.train_files.de = str(dev / "train.de.gz")
  assert corpora.open_corpus(config).read_pairs("validation") == list(nb.generate("train", 30))[20:]
  (tmp_path / "bad.tsv").write_text("a\tb\nno tab here\nc\td\n")
  config = text_cfg(tmp_path, "en-de,tsv", train_files=str(tmp_path / "bad.tsv"),
                    heldout_pairs=1)
  with pytest.raises(DataError, match=r"data.train_files: line 2 of \S+bad.tsv has 0 tabs"):
    corpora.open_corpus(config).read_pairs("test")


def test_the_fingerprint_follows_the_content_not_the_path(tmp_path):
  write_corpus(tmp_path / "a", 100)
  shutil.copytree(tmp_path / "a", tmp_path / "b")
  fp = lambda d: corpora.open_corpus(text_cfg(d)).fingerprint()
  assert fp(tmp_path / "a") == fp(tmp_path / "b")
  with open(tmp_path / "b" / "train.de", "r+") as f:  # same size, other content
    text = f.read()
    f.seek(0)
    f.write(text.replace("eins", "EINS", 1))
  assert fp(tmp_path / "a") != fp(tmp_path / "b")
  assert scan(str(tmp_path / "a" / "train.en"), "x").lines == 100


def test_text_file_errors_name_the_files(tmp_path):
  write_corpus(tmp_path, 100)
  (tmp_path / "short.de").write_text("eins\nzwei\n")
  with pytest.raises(DataError) as e:
    corpora.open_corpus(text_cfg(tmp_path, train_files={"en": str(tmp_path / "train.en"),
                                                        "de": str(tmp_path / "short.de")}))
  assert str(e.value) == (f"data.train_files.en and data.train_files.de: {tmp_path}/train.en has "
                          f"100 lines but {tmp_path}/short.de has 2; the files must be "
                          "line-aligned")
  config = text_cfg(tmp_path)
  config.data.train_files.de = str(tmp_path / "missing.de")
  with pytest.raises(DataError, match=r"^data.train_files.de: \S+missing.de does not exist$"):
    corpora.open_corpus(config)
  config = text_cfg(tmp_path)
  config.data.target_lang = "fr"
  with pytest.raises(DataError, match=r"^data.train_files.fr: not set"):
    corpora.open_corpus(config)
  with pytest.raises(DataError, match="cannot give 200 held-out pairs"):
    corpora.open_corpus(text_cfg(tmp_path, heldout_pairs=200))


TEXT_TINY = [
  "--config.data.vocab_size=256", "--config.model.vocab_size=256", "--config.model.num_layers=1",
  "--config.model.d_model=32", "--config.model.d_ff=64", "--config.data.tokens_per_batch=512",
  "--config.data.packed_source_len=64", "--config.data.packed_target_len=48",
  "--config.data.heldout_pairs=30", "--config.data.spm_train_sentences=2000",
  "--config.optimizer.warmup_steps=10", "--config.num_train_steps=10",
  "--config.checkpoint_every_steps=3", "--config.evals.valid_loss.every_steps=100",
  "--config.log_every_steps=1", "--config.evals.valid_translation.sentences=8",
  "--config.decode.beam_size=2",
  "--config.decode.max_extra_len=5", "--config.keep_checkpoints=3",
  "--config.average_last_checkpoints=2",
]


def text_args(directory):
  return ["--config=configs/text.py:en-de", f"--config.data.train_files.en={directory}/train.en",
          f"--config.data.train_files.de={directory}/train.de", *TEXT_TINY]


def test_mismatched_text_files_exit_2_with_one_line_before_any_work(tmp_path):
  write_corpus(tmp_path, 50)
  (tmp_path / "short.de").write_text("eins\n")
  proc = run_main("--config=configs/text.py", f"--config.data.train_files.en={tmp_path}/train.en",
                  f"--config.data.train_files.de={tmp_path}/short.de",
                  f"--workdir={tmp_path}/w")
  assert proc.returncode == 2
  errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
  assert len(errors) == 1 and "has 50 lines but" in errors[0] and "short.de has 1" in errors[0]
  assert "Traceback" not in proc.stderr and not os.path.exists(tmp_path / "w")


def test_text_files_in_a_bucket_read_as_local_ones(gcs, tmp_path):
  from transformer import storage

  write_corpus(tmp_path, 60, gz=True)
  for lang in ("en", "de"):
    data = (tmp_path / f"train.{lang}.gz").read_bytes()
    storage.as_path(gcs.path(f"corpus/train.{lang}.gz")).write_bytes(data)
  local, remote = text_cfg(tmp_path, heldout_pairs=10), text_cfg(tmp_path, heldout_pairs=10)
  for lang in ("en", "de"):
    local.data.train_files[lang] = str(tmp_path / f"train.{lang}.gz")
    remote.data.train_files[lang] = gcs.path(f"corpus/train.{lang}.gz")
  a, b = corpora.open_corpus(local), corpora.open_corpus(remote)
  assert b.fingerprint() == a.fingerprint()
  assert b.read_pairs("train") == a.read_pairs("train") == list(nb.generate("train", 60))[:40]
  remote.data.train_files.de = gcs.path("corpus/missing.de")
  with pytest.raises(DataError, match=r"^data.train_files.de: gs://\S+/corpus/missing.de does "
                                      r"not exist$"):
    corpora.open_corpus(remote)
