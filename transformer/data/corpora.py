"""Which parallel corpus a config names, opened as a reader of (source, target) pairs.

`config.dataset` is one of:
  * 'numbers': the embedded English-German corpus, generated offline into text files
    (data/numbers.py) and read like the user's own; the same corpus as a TFDS dataset is
    'numbers_translate/<variant>' (data/numbers_tfds.py);
  * 'text': the user's own plain-text files (`data.train_files`, `data.eval_files`,
    `data.test_files`; see data/text_io.py and configs/text.py);
  * a TFDS builder name with its config, e.g. 'wmt14_translate/fr-en', 'wmt19_translate/de-en',
    'ted_hrlr_translate/pt_to_en', 'para_crawl/ende' ('wmt14' is short for
    'wmt14_translate/de-en'), read in the direction `data.source_lang` -> `data.target_lang`
    whatever the builder's feature layout (`tfds_io.text_features`), from the TFDS split
    strings `data.train_split`, `data.eval_split`, `data.test_split` (slices allowed).

Everything is checked here, before any work: an unknown builder or config, a language or a
split the builder does not have, a missing file, files whose line counts differ. Each is one
`DataError` line naming the field and listing what exists.
"""

from __future__ import annotations

import difflib
from typing import Any

from transformer.data.errors import DataError
from transformer.data.text_io import SplitFiles, TextReader
from transformer.data.tfds_io import (
  SplitReader,
  data_dir_of,
  import_tensorflow,
  require_prepared,
  split_exists,
  text_features,
)

SHORT_NAMES = {"wmt14": "wmt14_translate/de-en"}
# The pipeline's splits and the config fields that pick them.
SPLIT_FIELDS = {"train": "train_split", "validation": "eval_split", "test": "test_split"}
TEXT_FIELDS = {"train": "train_files", "validation": "eval_files", "test": "test_files"}

Reader = SplitReader | TextReader


def tfds_name(dataset: str) -> str:
  """The TFDS builder name of `config.dataset` (short names expanded)."""
  return SHORT_NAMES.get(dataset, dataset)


def open_corpus(config: Any) -> Reader:
  """The corpus of `config.dataset`, in the direction data.source_lang -> data.target_lang.

  'numbers' writes the embedded corpus into the data dir if it is not there yet (offline;
  a few seconds for the default 200k pairs, well under 1 s for `data.numbers_variant='tiny'`;
  concurrent processes write it once). A TFDS corpus must be prepared in the data dir
  (`DataError` at once if not), unless `data.download` allows TFDS to download and prepare it;
  `numbers_translate/<variant>` is prepared offline.
  """
  src, tgt = config.data.source_lang, config.data.target_lang
  if src == tgt:
    raise DataError(f"data.source_lang and data.target_lang are both {src!r}")
  if config.dataset == "numbers":
    return _numbers(config, src, tgt)
  if config.dataset == "text":
    return _text(config, src, tgt)
  return _tfds(config, src, tgt)


def _numbers(config: Any, src: str, tgt: str) -> TextReader:
  from transformer.data import numbers

  variant = config.data.get("numbers_variant", "default")
  if variant not in numbers.VARIANTS:
    raise DataError(f"data.numbers_variant must be one of {sorted(numbers.VARIANTS)}, "
                    f"got {variant!r}")
  name = f"numbers/{variant}/{numbers.VERSION}"
  for field, lang in (("data.source_lang", src), ("data.target_lang", tgt)):
    if lang not in numbers.LANGUAGES:
      raise DataError(f"{field}={lang!r}: {name} has no such language; it has "
                      f"{', '.join(numbers.LANGUAGES)}")
  for split, field in SPLIT_FIELDS.items():
    if str(config.data.get(field, split)) != split:
      raise DataError(f"data.{field}={config.data.get(field)!r}: {name} has the splits "
                      f"{', '.join(numbers.SPLITS)}; for slices read it through TFDS "
                      f"(--config.dataset=numbers_translate/{variant})")
  files = numbers.write_corpus(data_dir_of(config), variant, (src, tgt))
  splits = {split: SplitFiles(files[split][src], files[split][tgt], ("dataset='numbers'",) * 2)
            for split in SPLIT_FIELDS}
  return TextReader(splits, src, tgt, corpus=name)


def split_files(value: Any, field: str, src: str, tgt: str) -> SplitFiles | None:
  """A split's files from its config field: a TSV path, or a mapping language -> path."""
  if not value:
    return None
  if isinstance(value, str):
    return SplitFiles(value, None, (field, field))
  paths = {k: v for k, v in dict(value).items() if v}
  if not paths:
    return None
  for lang in (src, tgt):
    if lang not in paths:
      given = ", ".join(f"{field}.{k}" for k in paths)
      raise DataError(f"{field}.{lang}: not set, but {lang!r} is a side of the translation "
                      f"(data.source_lang={src!r}, data.target_lang={tgt!r}); set: {given}")
  return SplitFiles(paths[src], paths[tgt], (f"{field}.{src}", f"{field}.{tgt}"))


def _text(config: Any, src: str, tgt: str) -> TextReader:
  splits = {split: split_files(config.data.get(field), f"data.{field}", src, tgt)
            for split, field in TEXT_FIELDS.items()}
  return TextReader(splits, src, tgt, heldout=int(config.data.get("heldout_pairs", 500)))


def _builder(name: str, data_dir: str) -> Any:
  import tensorflow_datasets as tfds

  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    base = name.split("/")[0].split(":")[0]
    known = tfds.list_builders(with_community_datasets=False)
    close = difflib.get_close_matches(base, known, n=5, cutoff=0.6)
    translation = [b for b in known if "translate" in b or b in ("para_crawl", "opus")]
    raise DataError(
      f"dataset={name!r}: TFDS has no builder {base!r}"
      + (f" (close: {', '.join(close)})" if close else "")
      + f"; translation builders: {', '.join(translation)}"
    ) from None
  except ValueError as e:
    if "BuilderConfig" not in str(e):
      raise
    base, _, cfg = name.partition("/")
    configs = [c.name for c in tfds.builder_cls(base.split(":")[0]).BUILDER_CONFIGS]
    raise DataError(f"dataset={name!r}: {base} has no config {cfg!r}; its configs: "
                    f"{', '.join(configs)}") from None


def _tfds(config: Any, src: str, tgt: str) -> SplitReader:
  import_tensorflow()
  name = tfds_name(config.dataset)
  data_dir = data_dir_of(config)
  if name.split("/")[0].split(":")[0] == "numbers_translate":  # offline: prepared on first use
    from transformer.data import numbers_tfds

    variant = name.partition("/")[2].split(":")[0] or "default"
    if variant in numbers_tfds.NumbersTranslate.builder_configs:
      numbers_tfds.build_numbers(data_dir, variant)
  builder = _builder(name, data_dir)
  # Offline, a download retries for minutes: only try it when the user asks.
  if config.data.get("download", False) and not builder.is_prepared():
    builder.download_and_prepare()
  return _reader(builder, name, data_dir, config, src, tgt)


def _reader(builder: Any, name: str, data_dir: str, config: Any, src: str,
            tgt: str) -> SplitReader:
  """A reader of a TFDS builder's languages and splits, each checked against the builder."""
  features = text_features(builder.info.features)
  for field, lang in (("data.source_lang", src), ("data.target_lang", tgt)):
    if lang not in features:
      raise DataError(f"{field}={lang!r}: {name} has no such language; it has "
                      f"{', '.join(features) or 'no text features'}")
  splits = {split: str(config.data.get(field, split)) for split, field in SPLIT_FIELDS.items()}
  known = dict(builder.info.splits)  # empty when TFDS knows nothing of the data yet
  for split, field in SPLIT_FIELDS.items():
    if known and not split_exists(splits[split], known):
      raise DataError(f"data.{field}={splits[split]!r}: {name} has the splits "
                      f"{', '.join(known)} (slices like 'train[:1%]' are allowed)")
  require_prepared(builder, name, data_dir, splits["train"])
  custom = {k: v for k, v in splits.items() if v != k}  # default names keep the cache keys
  return SplitReader(builder, features[src], features[tgt], custom or None)
