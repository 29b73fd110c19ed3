"""Reading translation pairs from TFDS: the helpers both the corpus builders and the pipeline use.

TensorFlow runs on the host only: `import_tensorflow` hides every GPU from it before anything
is read. Splits are read as a stream of chunks of raw UTF-8 bytes, so that a split of millions
of pairs is never held as Python strings; small splits can be read whole with `read_pairs`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

from transformer.data.errors import DataError

CHUNK = 16384  # pairs per chunk when streaming a split

Chunk = tuple[list[bytes], list[bytes]]  # (sources, targets), aligned


def import_tensorflow() -> Any:
  """Imports TensorFlow for tf.data on the host, hiding every GPU from it first."""
  import tensorflow as tf

  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:
    pass  # TF is already initialised; the first call of this function hid the GPUs.
  return tf


def data_dir_of(config: Any) -> str:
  """The TFDS data directory: `config.data_dir`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
  d = config.get("data_dir") or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
  return d if "://" in d else os.path.expanduser(d)


def text_features(features: Any, prefix: str = "") -> dict[str, str]:
  """Every text feature of a TFDS feature tree, by its own name -> its '/'-joined path.

  Covers the layouts of translation builders: a `Translation` feature keyed by language
  (`wmt14_translate`: {'de': ..., 'en': ...}), two text features side by side, or either nested
  in a dict (e.g. {'translation': Translation(...)} -> {'en': 'translation/en', ...}).
  """
  import tensorflow_datasets as tfds

  out: dict[str, str] = {}
  for key, feature in features.items():
    path = f"{prefix}{key}"
    if isinstance(feature, tfds.features.Text):
      out.setdefault(key, path)
    elif isinstance(feature, tfds.features.FeaturesDict):
      for k, v in text_features(feature, f"{path}/").items():
        out.setdefault(k, v)
  return out


def split_exists(split: str, known: Any) -> bool:
  """Whether the TFDS split string `split` (e.g. 'train[:10%]+validation') names only splits
  in `known`."""
  import re

  names = [re.sub(r"\[.*\]$", "", part.strip()) for part in split.split("+")]
  return all(name in known for name in names)


class SplitReader:
  """The (source, target) text pairs of a TFDS translation builder, in file order.

  Args:
    builder: a TFDS builder whose examples have text features `source_key` and `target_key`.
    source_key, target_key: the '/'-joined paths of the two sides' text features (the
      direction of translation), e.g. 'en' and 'de' (see `text_features`).
    splits: the TFDS split string (slices allowed: 'train[:10%]') of each of the pipeline's
      splits 'train', 'validation', 'test'; default: the same names.
  """

  def __init__(self, builder: Any, source_key: str, target_key: str,
               splits: dict[str, str] | None = None):
    self.builder = builder
    self.source_key = source_key
    self.target_key = target_key
    self.splits = dict(splits or {})
    self._counts: dict[str, int] = {}

  def tfds_split(self, split: str) -> str:
    """The TFDS split string read for the pipeline's `split`."""
    return self.splits.get(split, split)

  @property
  def name(self) -> str:
    """Dataset name, config and version, e.g. 'wmt14_translate/de-en/1.0.0'."""
    return self.builder.info.full_name

  def fingerprint(self) -> str:
    """SHA-256 of what identifies the data: its name, direction and `dataset_info.json`.

    Two corpora with the same name and version but other contents (a regenerated corpus, a
    synthetic stand-in) have different shard sizes in `dataset_info.json`, so they differ here.
    """
    h = hashlib.sha256()
    h.update(f"{self.name}|{self.source_key}->{self.target_key}".encode())
    if self.splits:  # Other slices are other data (kept out of the hash when unset, so the
      h.update(repr(sorted(self.splits.items())).encode())  # default keys stay as they were).
    if self.builder.is_prepared():
      from etils import epath

      h.update((epath.Path(self.builder.data_dir) / "dataset_info.json").read_bytes())
    else:  # tfds.testing.mock_data: random examples, counted.
      h.update(f"|unprepared|{self.num_examples('train')}".encode())
    return h.hexdigest()

  def num_examples(self, split: str) -> int:
    """Number of pairs in `split` (from the dataset info; counted when not prepared)."""
    if split not in self._counts:
      try:  # TFDS counts slices of prepared splits from their shard lengths.
        if not self.builder.is_prepared():
          raise KeyError(split)
        self._counts[split] = int(self.builder.info.splits[self.tfds_split(split)].num_examples)
      except (KeyError, ValueError):
        self._counts[split] = sum(len(s) for s, _ in self.chunks(split))
    return self._counts[split]

  def _fast_files(self, split: str) -> list[str] | None:
    """The split's TFRecord files when they can be parsed directly, else None."""
    import tensorflow_datasets as tfds

    tf = import_tensorflow()
    info = self.builder.info
    if (not self.builder.is_prepared() or info.file_format != tfds.core.FileFormat.TFRECORD
        or self.tfds_split(split) not in info.splits):  # a slice or sum goes through TFDS
      return None
    serialized = info.features.get_serialized_info()
    for k in (self.source_key, self.target_key):
      if k not in serialized or getattr(serialized[k], "dtype", None) != tf.string:
        return None
    return [os.fspath(f) for f in info.splits[self.tfds_split(split)].filepaths]

  def chunks(self, split: str, size: int = CHUNK) -> Iterator[Chunk]:
    """Streams `split` as chunks of at most `size` (source, target) UTF-8 byte strings.

    Prepared TFRecord data is parsed a whole chunk of records at a time (TFDS parses one
    example at a time, ~10k/s here, which takes minutes for WMT's 4.5M pairs), and the next
    chunk is read by tf.data's threads while the caller works on this one. Anything else
    (other file formats, `tfds.testing.mock_data`) goes through `as_dataset`.
    """
    tf = import_tensorflow()
    keys = (self.source_key, self.target_key)
    files = self._fast_files(split)
    if files is None:
      import tensorflow_datasets as tfds

      ds = self.builder.as_dataset(split=self.tfds_split(split), shuffle_files=False)
      ds = ds.map(lambda ex: {k: _get_path(ex, k) for k in keys}).batch(size)
      it = tfds.as_numpy(ds.prefetch(2))
    else:
      spec = {k: tf.io.FixedLenFeature([], tf.string) for k in keys}
      ds = tf.data.TFRecordDataset(files).batch(size)
      ds = ds.map(lambda records: tf.io.parse_example(records, spec)).prefetch(2)
      it = ds.as_numpy_iterator()
    for ex in it:
      yield ex[self.source_key].tolist(), ex[self.target_key].tolist()

  def read_pairs(self, split: str) -> list[tuple[str, str]]:
    """All of `split` as (source, target) strings; for the small evaluation splits."""
    return decode_pairs(self.chunks(split))


def _get_path(example: dict[str, Any], path: str) -> Any:
  for part in path.split("/"):
    example = example[part]
  return example


def decode_pairs(chunks: Iterator[Chunk]) -> list[tuple[str, str]]:
  """(source, target) strings of a stream of UTF-8 byte chunks."""
  pairs: list[tuple[str, str]] = []
  for src, tgt in chunks:
    pairs.extend(zip((s.decode("utf-8") for s in src), (t.decode("utf-8") for t in tgt),
                     strict=True))
  return pairs


def require_prepared(builder: Any, name: str, data_dir: str, split: str = "validation") -> None:
  """Raises `DataError` at once if `builder` has no data (mock data counts as data)."""
  if builder.is_prepared():
    return
  try:
    builder.as_dataset(split=split)  # Checks for data (and works under mock_data).
  except AssertionError:  # TFDS: "could not find data in <dir>".
    raise DataError(
      f"{name} is not prepared in {data_dir}: run `tfds build {name} "
      f"--data_dir={data_dir}` on a machine with internet, then pass "
      f"--config.data_dir={data_dir}"
    ) from None
