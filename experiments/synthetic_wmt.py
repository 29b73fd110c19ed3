"""Writes the synthetic WMT14 en-de stand-in as `wmt14_translate/de-en` into a TFDS data dir.

    python -m experiments.synthetic_wmt --data_dir=/tmp/synth_wmt \
        [--train_size=4508785 --validation_size=3000 --test_size=3003 --seed=0]

Then train or evaluate with `--config.data_dir=/tmp/synth_wmt` (offline, no download). Does
nothing if the dataset is already there. Prints the build time, the size on disk and the
examples and shards of each split. See transformer/data/synthetic_wmt.py for what the data is.
"""

from __future__ import annotations

import os
import time

from absl import app, flags

from transformer.data import synthetic_wmt
from transformer.errors import parse_flags

_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data dir to write into.", required=True)
_TRAIN_SIZE = flags.DEFINE_integer(
  "train_size", synthetic_wmt.DEFAULT_SIZES["train"], "Training pairs."
)
_VALIDATION_SIZE = flags.DEFINE_integer(
  "validation_size", synthetic_wmt.DEFAULT_SIZES["validation"], "Validation pairs."
)
_TEST_SIZE = flags.DEFINE_integer("test_size", synthetic_wmt.DEFAULT_SIZES["test"], "Test pairs.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the lexicon and of every sentence.")


def _dir_bytes(path: str) -> int:
  return sum(
    os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files
  )


def main(argv: list[str]) -> None:
  del argv
  import tensorflow_datasets as tfds

  data_dir = os.path.expanduser(_DATA_DIR.value)
  builder = tfds.builder(synthetic_wmt.DATASET, data_dir=data_dir)
  if (builder.data_path / "dataset_info.json").exists():
    print(f"already there, nothing written: {builder.data_dir}")
  else:
    start = time.perf_counter()
    synthetic_wmt.build_synthetic_wmt14(
      data_dir,
      train_size=_TRAIN_SIZE.value,
      validation_size=_VALIDATION_SIZE.value,
      test_size=_TEST_SIZE.value,
      seed=_SEED.value,
    )
    print(f"built in {time.perf_counter() - start:.1f} s: {builder.data_dir}")
  builder = tfds.builder(synthetic_wmt.DATASET, data_dir=data_dir)
  for name, split in builder.info.splits.items():
    print(f"  {name}: {split.num_examples} examples, {split.num_shards} shards")
  size = _dir_bytes(os.fspath(builder.data_dir))
  print(f"on disk: {size / 2**20:.1f} MiB ({size} bytes)")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
