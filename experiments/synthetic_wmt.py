"""Writes a synthetic WMT14 stand-in as `wmt14_translate/de-en` or `/fr-en` into a TFDS data dir.

    python -m experiments.synthetic_wmt --data_dir=/tmp/synth_wmt \
        [--pair=de-en --train_size=4508785 --validation_size=3000 --test_size=3003 --seed=0]
    python -m experiments.synthetic_wmt --pair=fr-en --data_dir=/tmp/synth_fr  # 40,836,876 pairs

Then train or evaluate with `--config.data_dir=/tmp/synth_wmt` (offline, no download). Sizes
left out are the pair's TFDS sizes. Does nothing if the dataset is already there. Prints the
build time, the size on disk and the examples and shards of each split. See
transformer/data/synthetic_wmt.py for what the data is.
"""

from __future__ import annotations

import os
import time

from transformer.data import synthetic_wmt
from transformer.errors import fail, parse_flags


def _dir_bytes(path: str) -> int:
  return sum(
    os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files
  )


if __name__ == "__main__":
  from absl import app, flags

  _DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data dir to write into.", required=True)
  _PAIR = flags.DEFINE_enum("pair", "de-en", synthetic_wmt.PAIRS,
                            "Language pair: the TFDS config of wmt14_translate.")
  _TRAIN_SIZE = flags.DEFINE_integer(
    "train_size", None, "Training pairs (default: the pair's TFDS size, 4,508,785 or 40,836,876)."
  )
  _VALIDATION_SIZE = flags.DEFINE_integer("validation_size", None, "Validation pairs (3000).")
  _TEST_SIZE = flags.DEFINE_integer("test_size", None, "Test pairs (3003).")
  _SEED = flags.DEFINE_integer("seed", 0, "Seed of the lexicon and of every sentence.")

  def main(argv: list[str]) -> None:
    del argv
    import tensorflow_datasets as tfds

    for flag in (_TRAIN_SIZE, _VALIDATION_SIZE, _TEST_SIZE):
      if flag.value is not None and flag.value < 1:
        fail(f"--{flag.name}={flag.value}: every split needs at least one example")
    data_dir = os.path.expanduser(_DATA_DIR.value)
    name = synthetic_wmt.dataset_name(_PAIR.value)
    builder = tfds.builder(name, data_dir=data_dir)
    if (builder.data_path / "dataset_info.json").exists():
      print(f"already there, nothing written: {builder.data_dir}")
    else:
      start = time.perf_counter()
      synthetic_wmt.build_synthetic_wmt14(
        data_dir,
        pair=_PAIR.value,
        train_size=_TRAIN_SIZE.value,
        validation_size=_VALIDATION_SIZE.value,
        test_size=_TEST_SIZE.value,
        seed=_SEED.value,
      )
      print(f"built in {time.perf_counter() - start:.1f} s: {builder.data_dir}")
    builder = tfds.builder(name, data_dir=data_dir)
    for split_name, split in builder.info.splits.items():
      print(f"  {split_name}: {split.num_examples} examples, {split.num_shards} shards")
    size = _dir_bytes(os.fspath(builder.data_dir))
    print(f"on disk: {size / 2**20:.1f} MiB ({size} bytes)")

  app.run(main, flags_parser=parse_flags)
