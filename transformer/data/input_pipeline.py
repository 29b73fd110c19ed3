"""Input pipeline: TFDS translation pairs -> SentencePiece ids -> fixed-shape batches.

Reading uses TFDS/tf.data on the host only (TensorFlow never sees a GPU); everything after
that is NumPy. The training split is streamed once to sample the vocabulary's training text,
once more to tokenize it into a cache of flat arrays (`token_cache`), and on every later start
the cache is memory-mapped: no training sentence is held as a Python string. Training batch
`step` is a pure function of `(config.seed, step)`, the same whether the ids come from the cache
or from a fresh tokenization, and independent of the number of devices.

Batches are dicts of int32 arrays `inputs` and `targets`, both `[rows, L]`, where `L` is one of
`config.data.bucket_lengths` (the smallest that holds both sides of every example in the batch)
and padding is 0. Padding rows (to keep shapes fixed) are all zeros, so a loss that ignores
token 0 ignores them. Every sequence ends with EOS (1).

With `config.data.packing`, training batches are packed instead (`packing.PackedBatches`):
rows of fixed lengths `packed_source_len` / `packed_target_len` that hold several pairs each,
with segment and position keys; see transformer/data/packing.py. Evaluation batches are never
packed.

Lengths (in tokens, EOS included):
  * training examples longer than `max_source_len` / `max_target_len`, or with a side longer
    than the largest bucket, are dropped;
  * evaluation examples are never dropped: a side longer than its limit (or than the largest
    bucket) is truncated, keeping EOS as its last token. Score BLEU against the untruncated
    reference strings (see `eval_batches`'s `indices`).

Config fields read: `dataset`, `data_dir`, `seed`, and in `data`: `source_lang`, `target_lang`,
`download` (optional, default False), `numbers_variant` (optional, 'default' or 'tiny'),
`vocab_size`, `spm_train_sentences`, `max_source_len`, `max_target_len`, `tokens_per_batch`,
`bucket_lengths`, `eval_batch_size`, `cache_dir` (optional), `packing` (optional, default
False), `packed_source_len` and `packed_target_len` (when packing).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from transformer.data import bucketing, corpora, mixture, token_cache, vocabulary
from transformer.data.batch_rows import padded_rows, process_rows
from transformer.data.bucketing import TrainBatches
from transformer.data.corpora import Reader
from transformer.data.marian_tokenizer import MarianTokenizer
from transformer.data.packing import PackedBatches
from transformer.data.token_cache import TokenizedSplit
from transformer.data.tokenizer import SOURCE, TARGET, Tokenizer, truncate

SPLITS = ("train", "validation", "test")

Batch = dict[str, np.ndarray]


def open_reader(config: Any) -> Reader | mixture.MixtureReader:
  """The corpus of `config.dataset`, or the corpora of a mixture (`mixture.open_mixture`),
  checked before any work (see `corpora.open_corpus`)."""
  if mixture.is_mixture(config):
    return mixture.open_mixture(config)
  return corpora.open_corpus(config)


def load_splits(config: Any) -> dict[str, list[tuple[str, str]]]:
  """All three splits as (source, target) strings, in file order: for small corpora only.

  Training reads the training split through `build_pipeline`, which never holds it as strings.
  """
  reader = open_reader(config)
  return {split: reader.read_pairs(split) for split in SPLITS}


def tokenize_pairs(
  tokenizer: Tokenizer | MarianTokenizer, pairs: Sequence[tuple[str, str]], chunk: int = 65536
) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Encodes (source, target) strings into two lists of int32 id arrays ending in EOS."""
  src: list[np.ndarray] = []
  tgt: list[np.ndarray] = []
  for start in range(0, len(pairs), chunk):  # Chunks bound the Python lists alive at once.
    part = pairs[start : start + chunk]
    for out, index, side in ((src, 0, SOURCE), (tgt, 1, TARGET)):
      ids = tokenizer.encode_batch([p[index] for p in part], side=side)
      out.extend(np.asarray(x, np.int32) for x in ids)
  return src, tgt


def train_batches(split: TokenizedSplit, config: Any, *, batch_multiple: int = 1,
                  process_index: int = 0, process_count: int = 1,
                  buckets: Sequence[int] | None = None) -> TrainBatches | PackedBatches:
  """The training batches `config.data.packing` asks for: packed, or bucketed."""
  if config.data.get("packing", False):
    return PackedBatches(split, config, batch_multiple=batch_multiple,
                         process_index=process_index, process_count=process_count)
  return TrainBatches(split, config, batch_multiple=batch_multiple, process_index=process_index,
                      process_count=process_count, buckets=buckets)


def eval_batches(
  pairs_ids: Sequence[tuple[np.ndarray | Sequence[int], np.ndarray | Sequence[int]]],
  config: Any,
  batch_multiple: int,
  *,
  process_index: int = 0,
  process_count: int = 1,
  buckets: Sequence[int] | None = None,
) -> list[Batch]:
  """Fixed-shape evaluation batches covering every example exactly once.

  Examples are sorted by length (so batches are padded little), truncated to the length limits
  (EOS kept last), and cut into batches of B = eval_batch_size rounded up to a multiple of
  `batch_multiple`; the last batch is filled with all-zero rows.

  Args:
    pairs_ids: (source ids, target ids) per example, ending in EOS.
    config: reads `data.{eval_batch_size, bucket_lengths, max_source_len, max_target_len}`.
    batch_multiple: as for `TrainBatches`; a multiple of `process_count`.
    process_index, process_count: this process gets rows [i * B / P, (i + 1) * B / P).
    buckets: the bucket lengths (e.g. the training batches'); default: the config's, or for
      'auto' powers of two.

  Returns:
    A list of {'inputs': [B_local, L] int32, 'targets': [B_local, L] int32,
    'indices': [B_local] int32}, where `indices` is each row's position in `pairs_ids` (-1 for
    a padding row) and L is the smallest bucket length that holds the batch.
  """
  buckets = list(buckets) if buckets else bucketing.default_buckets(config)
  rows = padded_rows(int(config.data.eval_batch_size), batch_multiple, process_count)
  src_limit = min(int(config.data.max_source_len), buckets[-1])
  tgt_limit = min(int(config.data.max_target_len), buckets[-1])
  src = [truncate(np.asarray(s, np.int32), src_limit) for s, _ in pairs_ids]
  tgt = [truncate(np.asarray(t, np.int32), tgt_limit) for _, t in pairs_ids]
  longest = np.array([max(len(s), len(t)) for s, t in zip(src, tgt, strict=True)], np.int64)
  order = np.argsort(longest, kind="stable")
  first, local = process_rows(rows, process_index, process_count)
  out = []
  for start in range(0, len(order), rows):
    chunk = order[start : start + rows]
    length = buckets[int(np.searchsorted(buckets, longest[chunk].max(), side="left"))]
    mine = chunk[first : first + local]
    batch = {
      "inputs": np.zeros((local, length), np.int32),
      "targets": np.zeros((local, length), np.int32),
      "indices": np.full(local, -1, np.int32),
    }
    for r, e in enumerate(mine.tolist()):
      batch["inputs"][r, : len(src[e])] = src[e]
      batch["targets"][r, : len(tgt[e])] = tgt[e]
      batch["indices"][r] = e
    out.append(batch)
  return out


@dataclasses.dataclass
class Pipeline:
  """Everything training needs from the data layer (see `build_pipeline`)."""

  tokenizer: Tokenizer
  train: TrainBatches | PackedBatches
  # Bucket lengths of evaluation and decoding (and of bucketed training batches): the config's,
  # or derived from the training split for 'auto'.
  buckets: list[int]
  eval: dict[str, list[Batch]]  # 'validation' and 'test' batches (this process's rows).
  references: dict[str, list[tuple[str, str]]]  # 'validation' and 'test' (source, target).
  # corpus name -> the id of its tag, for a mixture's tagged corpora (transformer/data/mixture.py).
  tag_ids: dict[str, int] = dataclasses.field(default_factory=dict)


def evaluation_data(config: Any, reader: Reader | mixture.MixtureReader, tokenizer: Tokenizer,
                    batch_multiple: int, *, process_index: int = 0, process_count: int = 1,
                    buckets: Sequence[int] | None = None,
                    ) -> tuple[dict[str, list[Batch]], dict[str, list[tuple[str, str]]]]:
  """Batches (this process's rows) and reference pairs of 'validation' and 'test', keyed by
  `mixture.split_key`: the split's name for the main corpus, 'NAME/split' for a mixture's
  corpus NAME (its sources after its tag)."""
  if isinstance(reader, mixture.MixtureReader):
    sources = [(c.name, reader.readers[c.name]) for c in reader.corpora]
    tags = mixture.tag_ids(tokenizer, reader.corpora)
  else:
    sources, tags = [(mixture.MAIN, reader)], {}
  evals, references = {}, {}
  for corpus, corpus_reader in sources:
    for name in ("validation", "test"):
      key = mixture.split_key(corpus, name)
      references[key] = corpus_reader.read_pairs(name)
      s, t = tokenize_pairs(tokenizer, references[key])
      if corpus in tags:
        s = [np.concatenate([np.array([tags[corpus]], np.int32), x]) for x in s]
      evals[key] = eval_batches(list(zip(s, t, strict=True)), config, batch_multiple,
                                process_index=process_index, process_count=process_count,
                                buckets=buckets)
  return evals, references


def training_split(config: Any, reader: Reader | mixture.MixtureReader, tokenizer: Tokenizer,
                   workdir: str, *, builder: bool = True) -> TokenizedSplit:
  """The tokenized training split: the corpus's token cache, or a mixture's split made from
  its corpora's caches (`mixture.mixture_split`, kept beside them)."""
  root = token_cache.cache_root(config, workdir)
  if not isinstance(reader, mixture.MixtureReader):
    return token_cache.load_or_build(reader, "train", tokenizer, root, builder=builder)
  tags = mixture.tag_ids(tokenizer, reader.corpora)
  parts = [(token_cache.load_or_build(reader.readers[c.name], "train", tokenizer, root,
                                      builder=builder), c.weight, tags.get(c.name))
           for c in reader.corpora]
  mixture.log_composition(reader.corpora, parts)
  return mixture.mixture_split(parts, int(config.seed), os.path.dirname(parts[0][0].directory))


def build_pipeline(
  config: Any,
  workdir: str,
  *,
  batch_multiple: int,
  process_index: int = 0,
  process_count: int = 1,
  reader: Reader | None = None,
) -> Pipeline:
  """`open_reader` -> `get_tokenizer` -> cached tokenized training split -> batches.

  Process 0 trains the vocabulary and builds the token cache when they are missing; other
  processes wait for them. The evaluation splits are small and read into memory.
  """
  reader = reader or open_reader(config)
  builder = process_index == 0
  tok = vocabulary.get_tokenizer(config, workdir, reader, builder=builder,
                                 tags=mixture.tags(config))
  split = training_split(config, reader, tok, workdir, builder=builder)
  buckets = bucketing.resolve_buckets(config, split)
  if bucketing.explicit_buckets(config) is None:
    logging.info("bucket lengths derived from the training split: %s", buckets)
  train = train_batches(split, config, batch_multiple=batch_multiple,
                        process_index=process_index, process_count=process_count, buckets=buckets)
  evals, references = evaluation_data(config, reader, tok, batch_multiple,
                                      process_index=process_index, process_count=process_count,
                                      buckets=buckets)
  logging.info("training pairs: %s kept, %s longer than the limits; real tokens %.1f%% of the "
               "batches", f"{train.num_examples:,}", f"{train.num_dropped:,}",
               100 * train.real_token_fraction())
  tag_ids = (mixture.tag_ids(tok, reader.corpora)
             if isinstance(reader, mixture.MixtureReader) else {})
  return Pipeline(tokenizer=tok, train=train, buckets=buckets, eval=evals,
                  references=references, tag_ids=tag_ids)
