"""The numbers corpus as a TFDS dataset, `numbers_translate/<variant>`: the TFDS path, offline.

The same pairs as `numbers.generate`, in the same order, prepared by TFDS (TFRecord files) and
read as any TFDS corpus is (`tfds_io.SplitReader`, tf.data): `--config.dataset=
numbers_translate/tiny` trains through TFDS on a machine that cannot download one, and the
tests check the TFDS reader against the generator. Importing this module registers the
builder with TFDS; `corpora.open_corpus` prepares it on first use, as it needs no download.
"""

from __future__ import annotations

import contextlib
import os

import tensorflow_datasets as tfds

from transformer import storage
from transformer.data import numbers

NAME = "numbers_translate"


class NumbersTranslate(tfds.core.GeneratorBasedBuilder):
  """English-to-German translation of numbers written as words (generated, no download)."""

  VERSION = tfds.core.Version(numbers.VERSION)
  RELEASE_NOTES = {
    "1.0.0": "Initial release.",
    "1.1.0": "Numbers below 100 (the atomic words) are always in train.",
  }
  BUILDER_CONFIGS = [
    tfds.core.BuilderConfig(name=name, description=f"{v.train_size:,} train, {v.validation_size:,} "
                  f"validation, {v.test_size:,} test.")
    for name, v in numbers.VARIANTS.items()
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=numbers.__doc__,
      features=tfds.features.FeaturesDict({"en": tfds.features.Text(), "de": tfds.features.Text()}),
      supervised_keys=("en", "de"),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Everything is generated locally.
    return {split: self._generate_examples(split) for split in numbers.SPLITS}

  def _generate_examples(self, split: str):
    variant = numbers.VARIANTS[self.builder_config.name]
    for i, (en, de) in enumerate(numbers.generate(split, variant.size(split), variant.seed)):
      yield i, {"en": en, "de": de}


def build_numbers(data_dir: str | None, variant: str = "default") -> NumbersTranslate:
  """Prepares `numbers_translate/<variant>` in `data_dir` (TFDS layout) unless already there.

  Needs no network. `data_dir=None` means `~/tensorflow_datasets`. Processes that start
  together on an empty data dir build it once (an `flock` on `<data_dir>/numbers_translate.lock`).

  Returns:
    The builder, prepared.
  """
  from transformer.data.tfds_io import import_tensorflow

  import_tensorflow()  # Hides GPUs from TensorFlow before TFDS uses it.
  data_dir = numbers.expand_data_dir(data_dir)
  builder = NumbersTranslate(config=variant, data_dir=data_dir)
  if builder.is_prepared():
    return builder
  lock = (contextlib.nullcontext() if storage.is_remote(data_dir)
          else storage.local_file_lock(os.path.join(data_dir, f"{NAME}.lock")))
  with lock:
    # Whoever held the lock before may have built it: look again, with a fresh builder.
    builder = NumbersTranslate(config=variant, data_dir=data_dir)
    if not builder.is_prepared():
      # Statistics over text features are slow and unused here.
      download_config = tfds.download.DownloadConfig(
        compute_stats=tfds.download.ComputeStatsMode.SKIP, try_download_gcs=False
      )
      builder.download_and_prepare(download_config=download_config)
  return builder
