"""Your own parallel corpus as plain text: line-aligned files per language, or one TSV file.

A split is either two line-aligned files (line i of the source file translates line i of the
target file) or one file of `source<TAB>target` lines. Files may be gzip'ed (detected by their
first bytes) and local or in an object store (`gs://...`, through `etils.epath`). Reading
streams: a split is never held in memory, except the small evaluation splits by `read_pairs`.

`TextReader` has the interface of `tfds_io.SplitReader` (`name`, `fingerprint`,
`num_examples`, `chunks`, `read_pairs`), so everything downstream (vocabulary, token cache,
batches, exact resume, BLEU) is the same code as for a TFDS corpus.

On opening, every file is read once at C speed (`scan`): its size, a BLAKE2b hash of its bytes
and its number of lines. That catches a missing or unreadable file and files whose line counts
differ before any work, and gives the fingerprint that keys the token cache and the vocabulary:
an edited file never reuses a stale cache, an unchanged one is never tokenized again.

Pairs with an empty or whitespace-only side are skipped (and counted in the log). When no
validation or test files are given, the last `heldout` pairs of the training files are the
validation split and the `heldout` before them the test split; training uses the rest.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import zlib
from collections.abc import Iterator
from typing import IO

from absl import logging

from transformer import storage
from transformer.data.errors import DataError
from transformer.data.tfds_io import CHUNK, Chunk, decode_pairs

_BLOCK = 16 << 20
_GZIP_MAGIC = b"\x1f\x8b"


@dataclasses.dataclass(frozen=True)
class FileScan:
  """What one pass over a file's bytes tells: size, content hash, lines, compression."""

  path: str
  size: int
  blake2b: str
  lines: int
  gzipped: bool


def _open(path: str, field: str) -> IO[bytes]:
  p = storage.as_path(path)
  try:
    if not p.exists():
      raise DataError(f"{field}: {path} does not exist")
    return p.open("rb")
  except DataError:
    raise
  except OSError as e:
    raise DataError(f"{field}: cannot read {path}: {e.strerror or e}") from None


def scan(path: str, field: str) -> FileScan:
  """Size, BLAKE2b of the bytes as stored, and the number of lines (of the text, unzipped).

  A last line without a final newline counts as a line. Raises `DataError` naming `field` and
  the path if the file is missing, unreadable or a corrupt gzip file.
  """
  h = hashlib.blake2b(digest_size=16)
  size = lines = 0
  last = b"\n"
  unzip = None
  with _open(path, field) as f:
    try:
      while block := f.read(_BLOCK):
        if unzip is None:
          unzip = zlib.decompressobj(wbits=31) if block.startswith(_GZIP_MAGIC) else False
        h.update(block)
        size += len(block)
        text = unzip.decompress(block) if unzip else block
        if text:
          lines += text.count(b"\n")
          last = text[-1:]
      if unzip:
        tail = unzip.flush()
        lines += tail.count(b"\n")
        last = tail[-1:] or last
    except zlib.error as e:
      raise DataError(f"{field}: {path} is not a valid gzip file ({e})") from None
    except OSError as e:
      raise DataError(f"{field}: cannot read {path}: {e.strerror or e}") from None
  if last != b"\n":
    lines += 1
  return FileScan(path, size, h.hexdigest(), lines, bool(unzip))


def _lines(path: str, field: str) -> Iterator[bytes]:
  """The file's lines as bytes without the line ending."""
  with _open(path, field) as raw:
    head = raw.read(2)
    raw.seek(0)
    f: IO[bytes] = gzip.GzipFile(fileobj=raw) if head == _GZIP_MAGIC else raw
    for line in f:
      yield line.rstrip(b"\r\n")


@dataclasses.dataclass(frozen=True)
class SplitFiles:
  """One split: `source` and `target` line-aligned files, or one TSV file (`target` None).

  `fields` name the config fields the paths came from (for errors); `first`, `stop` select raw
  lines [first, stop) of the files (`stop` None: to the end).
  """

  source: str
  target: str | None
  fields: tuple[str, str]
  first: int = 0
  stop: int | None = None


class TextReader:
  """(source, target) pairs of plain-text files, split by split, in file order.

  Args:
    splits: 'train', 'validation' and 'test' -> their files. A split without files of its own
      is cut from the end of the training files (`heldout` pairs each; see the module doc).
    source_lang, target_lang: language codes, for the name and the cache's metadata.
    heldout: pairs held out of the training files for each missing evaluation split.
    corpus: the corpus's name, before the direction in `name` (default 'text').
  """

  def __init__(self, splits: dict[str, SplitFiles | None], source_lang: str, target_lang: str,
               heldout: int = 500, corpus: str = "text"):
    self.source_key, self.target_key = source_lang, target_lang
    self.corpus = corpus
    self._counts: dict[str, int] = {}
    self._scans: dict[str, FileScan] = {}
    train = splits["train"]
    if train is None:
      raise DataError("data.train_files: not set; dataset='text' trains on your own files "
                      "(configs/text.py documents the fields)")
    n = self._check_aligned(train)
    missing = [s for s in ("validation", "test") if splits.get(s) is None]
    if missing and n - heldout * len(missing) < 1:
      raise DataError(f"{train.fields[0]}: {n:,} lines cannot give {heldout:,} held-out pairs "
                      f"each to {' and '.join(missing)}; lower data.heldout_pairs or set "
                      f"data.{'eval' if missing[0] == 'validation' else 'test'}_files")
    self.splits: dict[str, SplitFiles] = {}
    stop = n
    for name in missing:  # validation is the last `heldout` lines, test the ones before
      self.splits[name] = dataclasses.replace(train, first=stop - heldout, stop=stop)
      stop -= heldout
    self.splits["train"] = dataclasses.replace(train, stop=stop)
    for name in ("validation", "test"):
      given = splits.get(name)
      if given is not None:
        self._check_aligned(given)
        self.splits[name] = given
    self.heldout = heldout if missing else 0
    self.skipped: dict[str, int] = {}

  def _check_aligned(self, files: SplitFiles) -> int:
    """Scans the split's files; returns their line count (equal for both files, or `DataError`)."""
    src = self._scan(files.source, files.fields[0])
    if files.target is None:
      return src.lines
    tgt = self._scan(files.target, files.fields[1])
    if src.lines != tgt.lines:
      raise DataError(
        f"{files.fields[0]} and {files.fields[1]}: {files.source} has {src.lines:,} lines but "
        f"{files.target} has {tgt.lines:,}; the files must be line-aligned"
      )
    return src.lines

  def _scan(self, path: str, field: str) -> FileScan:
    if path not in self._scans:
      self._scans[path] = scan(path, field)
    return self._scans[path]

  @property
  def name(self) -> str:
    """E.g. 'text/en-de', 'numbers/tiny/1.1.0/en-de'."""
    return f"{self.corpus}/{self.source_key}-{self.target_key}"

  def fingerprint(self) -> str:
    """SHA-256 of the direction, the files' contents (size and hash, not paths) and the splits'
    line ranges: the token cache and the vocabulary are keyed by it."""
    parts = {"name": self.name, "splits": {}}
    for split, f in sorted(self.splits.items()):
      parts["splits"][split] = {
        "files": [[self._scans[p].size, self._scans[p].blake2b]
                  for p in (f.source, f.target) if p is not None],
        "tsv": f.target is None, "lines": [f.first, f.stop],
      }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

  def num_examples(self, split: str) -> int:
    """Pairs of `split` after skipping empty ones (counted by a pass over the files, once)."""
    if split not in self._counts:
      self._counts[split] = sum(len(s) for s, _ in self.chunks(split))
    return self._counts[split]

  def _pairs(self, split: str) -> Iterator[tuple[bytes, bytes]]:
    f = self.splits[split]
    if f.target is None:
      for i, line in enumerate(_lines(f.source, f.fields[0])):
        parts = line.split(b"\t")
        if len(parts) != 2:
          raise DataError(f"{f.fields[0]}: line {i + 1} of {f.source} has {len(parts) - 1} tabs; "
                          "a TSV line must be source<TAB>target")
        yield parts[0], parts[1]
    else:
      yield from zip(_lines(f.source, f.fields[0]), _lines(f.target, f.fields[1]), strict=True)

  def chunks(self, split: str, size: int = CHUNK) -> Iterator[Chunk]:
    """Streams `split` as chunks of at most `size` (source, target) UTF-8 byte strings."""
    f = self.splits[split]
    src: list[bytes] = []
    tgt: list[bytes] = []
    skipped = 0
    for i, (s, t) in enumerate(self._pairs(split)):
      if i < f.first:
        continue
      if f.stop is not None and i >= f.stop:
        break
      s, t = s.strip(), t.strip()
      if not s or not t:
        skipped += 1
        continue
      src.append(s)
      tgt.append(t)
      if len(src) == size:
        yield src, tgt
        src, tgt = [], []
    if src:
      yield src, tgt
    if self.skipped.get(split) != skipped:
      self.skipped[split] = skipped
      if skipped:
        logging.info("%s %s: skipped %s pairs with an empty or whitespace-only side", self.name,
                     split, f"{skipped:,}")

  def read_pairs(self, split: str) -> list[tuple[str, str]]:
    """All of `split` as (source, target) strings; for the small evaluation splits."""
    return decode_pairs(self.chunks(split))
