"""The tokenized training split as flat arrays, written once and memory-mapped on every start.

A split of n pairs is four arrays: the source ids of every example back to back (each ending in
EOS), their offsets `[n + 1]`, and the same for the target side. Ids are uint16 when the
vocabulary fits (WMT's 37,000 does), else int32.

On disk (`<cache root>/train-<key>/`): `source.bin`, `target.bin` (raw ids), `source_offsets.npy`,
`target_offsets.npy`, and `meta.json`, written last: a directory with `meta.json` is complete.
The key is a hash of everything the contents depend on: the dataset's name, version, direction
and `dataset_info.json` (so another corpus of the same name does not match), the split, and the
vocabulary's SHA-256. Length limits are not part of it: the cache holds every example, and
`TrainBatches` filters by length when it maps the arrays, so changing a limit reuses the cache.

Where: `config.data.cache_dir`, else `<workdir>/cache`. A cache in an object store cannot be
memory-mapped, so it is copied once into a local directory (`storage.local_cache_root()`) and
mapped there; a new VM after a preemption copies it instead of tokenizing again.

Concurrency: process 0 builds; other processes of the run wait for `meta.json` and map the
result. Builds go into a temporary directory that is renamed into place, under an `flock`, so
independent runs that share a cache directory build it once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from absl import logging
from etils import epath

from transformer import storage
from transformer import workdir as workdir_lib
from transformer.data.errors import DataError
from transformer.data.tfds_io import Chunk
from transformer.data.tokenizer import SOURCE, Tokenizer

FORMAT = 1
_FILES = ("source.bin", "target.bin", "source_offsets.npy", "target_offsets.npy")


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
  """Token ids of n (source, target) pairs, flat.

  Attributes:
    source: [sum of source lengths] ids, example i at source[source_offsets[i]:
      source_offsets[i + 1]], ending in EOS.
    source_offsets: [n + 1] int64.
    target, target_offsets: the same for the target side.
    directory: the local cache directory the arrays are mapped from; None in memory. Files
      derived from the split (`plan_cache`) go there.
  """

  source: np.ndarray
  source_offsets: np.ndarray
  target: np.ndarray
  target_offsets: np.ndarray
  directory: str | None = None

  def __len__(self) -> int:
    return len(self.source_offsets) - 1

  def source_lengths(self) -> np.ndarray:
    return np.diff(self.source_offsets)

  def target_lengths(self) -> np.ndarray:
    return np.diff(self.target_offsets)

  @classmethod
  def from_sequences(cls, source: Sequence[Sequence[int]],
                     target: Sequence[Sequence[int]]) -> TokenizedSplit:
    """From per-example id sequences (e.g. tests, or a small split tokenized in memory)."""
    if len(source) != len(target):
      raise ValueError(f"{len(source)} source but {len(target)} target sequences")
    src, src_off = _flatten(source)
    tgt, tgt_off = _flatten(target)
    return cls(src, src_off, tgt, tgt_off)


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  lengths = np.fromiter((len(s) for s in seqs), np.int64, count=len(seqs))
  offsets = np.zeros(len(seqs) + 1, np.int64)
  np.cumsum(lengths, out=offsets[1:])
  flat = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, count=int(offsets[-1]))
  return flat, offsets


def id_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def encode_chunk(tokenizer: Tokenizer, texts: list[bytes], dtype: np.dtype, side: str = SOURCE
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Flat ids (each text's ids then EOS) and [len(texts)] lengths of one chunk of texts on one
  `side` of the translation (tokenizer.SOURCE or TARGET)."""
  # SentencePiece encodes the chunk on all cores.
  ids = tokenizer.encode_batch(texts, side=side)
  lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
  flat = np.fromiter(itertools.chain.from_iterable(ids), dtype, count=int(lengths.sum()))
  return flat, lengths


def write_split(directory: str, chunks: Iterable[Chunk], tokenizer: Tokenizer,
                total: int | None = None) -> int:
  """Tokenizes `chunks` straight into the files of a split in the local `directory`.

  Memory is bounded by one chunk: ids go to the files as they are made. Returns the number of
  pairs; `meta.json` is not written here.
  """
  dtype = id_dtype(tokenizer.vocab_size)
  lengths: dict[str, list[np.ndarray]] = {"source": [], "target": []}
  n, start, last_log = 0, time.time(), time.time()
  with open(os.path.join(directory, "source.bin"), "wb") as fs, \
       open(os.path.join(directory, "target.bin"), "wb") as ft:
    for src, tgt in chunks:
      for side, texts, f in (("source", src, fs), ("target", tgt, ft)):
        flat, lens = encode_chunk(tokenizer, texts, dtype, side)
        f.write(flat.tobytes())
        lengths[side].append(lens)
      n += len(src)
      if time.time() - last_log > 30:
        last_log = time.time()
        logging.info("tokenized %s%s pairs (%.0f/s)", f"{n:,}",
                     f" of {total:,}" if total else "", n / (last_log - start))
  for side in ("source", "target"):
    lens = np.concatenate(lengths[side]) if lengths[side] else np.zeros(0, np.int64)
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    np.save(os.path.join(directory, f"{side}_offsets.npy"), offsets)
  return n


def map_split(directory: str) -> TokenizedSplit:
  """Memory-maps a complete local cache directory."""
  meta = json.loads(open(os.path.join(directory, "meta.json")).read())
  dtype = np.dtype(meta["dtype"])
  arrays = {}
  for side in ("source", "target"):
    path = os.path.join(directory, f"{side}.bin")
    size = os.path.getsize(path) // dtype.itemsize
    arrays[side] = (np.memmap(path, dtype, mode="r", shape=(size,)) if size
                    else np.zeros(0, dtype))
    arrays[f"{side}_offsets"] = np.load(os.path.join(directory, f"{side}_offsets.npy"),
                                        mmap_mode="r")
  split = TokenizedSplit(**arrays, directory=directory)
  if len(split) != meta["num_examples"] or split.source_offsets[-1] != len(split.source):
    raise DataError(f"token cache {directory} is inconsistent with its meta.json; delete it")
  return split


def cache_key(fingerprint: str, split: str, vocab_sha256: str) -> str:
  text = json.dumps({"format": FORMAT, "data": fingerprint, "split": split,
                     "vocab": vocab_sha256}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_root(config: Any, workdir: str) -> epath.Path:
  """`data.cache_dir`, else the workdir's `cache/`."""
  if config.data.get("cache_dir"):
    return storage.as_path(config.data.cache_dir)
  return workdir_lib.paths(workdir).cache


def _complete(directory: epath.Path) -> bool:
  return (directory / "meta.json").exists()


def load_or_build(reader: Any, split: str, tokenizer: Tokenizer, root: epath.Path, *,
                  builder: bool = True, wait_timeout: float = 4 * 3600) -> TokenizedSplit:
  """The tokenized `split` of `reader` (a `tfds_io.SplitReader`), from the cache or built.

  Args:
    reader: the split's source of text chunks; only read when the cache must be built.
    split: e.g. 'train'.
    tokenizer: the vocabulary; its file's SHA-256 is part of the key.
    root: cache root directory, local or remote.
    builder: whether this process may build (process 0); others wait for the result.
    wait_timeout: seconds a non-building process waits for the cache.
  """
  vocab_sha = tokenizer.sha256
  name = f"{split}-{cache_key(reader.fingerprint(), split, vocab_sha)}"
  canonical = root / name
  remote = storage.is_remote(root)
  local = os.path.join(storage.local_cache_root(), name) if remote else os.fspath(canonical)
  if not os.path.exists(os.path.join(local, "meta.json")):
    if not builder:
      logging.info("waiting for process 0 to write the token cache %s", canonical)
      storage.wait_for(canonical / "meta.json", wait_timeout, "the token cache")
    with storage.local_file_lock(local + ".lock"):
      if not os.path.exists(os.path.join(local, "meta.json")):
        tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(local))
        try:
          if remote and _complete(canonical):
            logging.info("copying the token cache %s to %s", canonical, local)
            for f in (*_FILES, "meta.json"):
              _copy_to_local(canonical / f, os.path.join(tmp, f))
          else:
            _build(reader, split, tokenizer, tmp, name, vocab_sha)
          os.chmod(tmp, 0o755)  # mkdtemp makes it private
          os.rename(tmp, local)
        except BaseException:
          shutil.rmtree(tmp, ignore_errors=True)
          raise
  if remote and builder and not _complete(canonical):
    logging.info("uploading the token cache to %s", canonical)
    for f in (*_FILES, "meta.json"):  # meta.json last: it marks the copy complete
      _copy_from_local(os.path.join(local, f), canonical / f)
  return map_split(local)


def _build(reader: Any, split: str, tokenizer: Tokenizer, directory: str, name: str,
           vocab_sha: str) -> None:
  total = reader.num_examples(split)
  logging.info("tokenizing %s %s into the token cache %s", reader.name, split, name)
  start = time.time()
  n = write_split(directory, reader.chunks(split), tokenizer, total)
  meta = {"format": FORMAT, "dataset": reader.name, "split": split, "num_examples": n,
          "vocab_sha256": vocab_sha, "dtype": id_dtype(tokenizer.vocab_size).name,
          "source_key": reader.source_key, "target_key": reader.target_key}
  with open(os.path.join(directory, "meta.json"), "w") as f:
    json.dump(meta, f)
  logging.info("tokenized %s pairs in %.0f s", f"{n:,}", time.time() - start)


def _copy_to_local(src: epath.Path, dst: str) -> None:
  with src.open("rb") as fin, open(dst, "wb") as fout:
    shutil.copyfileobj(fin, fout, length=16 << 20)


def _copy_from_local(src: str, dst: epath.Path) -> None:
  dst.parent.mkdir(parents=True, exist_ok=True)
  with open(src, "rb") as fin, dst.open("wb") as fout:
    shutil.copyfileobj(fin, fout, length=16 << 20)
