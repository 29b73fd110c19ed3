"""Several corpora in one run: each with a weight and an optional tag token on its sources.

A config names its corpora as

    config.dataset, config.data.*              the main corpus ('main'), as for any run;
    config.data.weight, config.data.tag        its weight and tag (1.0 and '': none);
    config.data.corpora.NAME = corpus(...)     more corpora (configs/common.py `corpus`): each a
                                               `dataset` the project reads (text files, a TFDS
                                               builder and split, the numbers corpus), its own
                                               data fields, a `weight` and a `tag`.

Weights are upsampling factors: one epoch of the mixture holds each corpus's training pairs
`weight` times; a fractional part takes a fixed sample of that share of its pairs, drawn from
`config.seed`, the same in every epoch. So corpus c's share of the training examples is
w_c n_c / sum_k w_k n_k (n_c: its pairs within the length limits), exactly over each epoch, and
a weight of 10 on 5,000 real pairs beside 50,000 synthetic ones (weight 1) gives half and half.

A tag (e.g. '<BT>' for back-translation, Caswell et al. 2019; '>>fr<<' for the target language
of a multilingual model, Johnson et al. 2017) is one token put in front of every source
sentence of its corpus: in training, in the corpus's validation and test, and in translation
(`decode.tag`, or the tag at the start of an input line; `SourceEncoder`). A new vocabulary
holds the tags as user-defined symbols, which SentencePiece never splits and never produces
from text; a vocabulary taken from elsewhere (`init_from`) must hold them so.

The batches stay a pure function of (seed, step): the mixture is one tokenized split
(`token_cache.TokenizedSplit`) built from the corpora's own token caches (one per corpus, keyed
by its contents and the vocabulary, so another run that lists the same corpus with the same
vocabulary reuses it) and kept beside them, keyed by what it is made of. Bucketing, packing,
epoch plans and exact resume work on it unchanged, across corpora.

A config without `data.corpora` and without `data.tag` is a single corpus, read exactly as
before (`is_mixture`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from transformer import storage
from transformer.data import corpora
from transformer.data.errors import DataError
from transformer.data.tfds_io import Chunk
from transformer.data.token_cache import TokenizedSplit, map_split
from transformer.errors import ConfigError, show

MAIN = "main"
FORMAT = 1
# The fields of a corpus entry besides the data fields it may set (`DATA_FIELDS`).
ENTRY_FIELDS = ("dataset", "weight", "tag")
# The data fields a corpus entry may set for itself; unset (None) ones are the main corpus's.
DATA_FIELDS = ("source_lang", "target_lang", "train_files", "eval_files", "test_files",
               "heldout_pairs", "train_split", "eval_split", "test_split", "numbers_variant")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class Corpus:
  """One corpus of a run: its name, the config that reads it (`corpora.open_corpus`), its
  weight (an upsampling factor) and its tag ('' for none)."""

  name: str
  config: Any = dataclasses.field(repr=False)
  weight: float
  tag: str

  @property
  def field(self) -> str:
    """The config path that names this corpus in messages."""
    return "data" if self.name == MAIN else f"data.corpora.{self.name}"

  @property
  def pair(self) -> tuple[str, str]:
    return self.config.data.source_lang, self.config.data.target_lang


def is_mixture(config: Any) -> bool:
  """Whether the config lists more corpora than the main one, or tags its sources."""
  return bool(config.data.get("corpora")) or bool(config.data.get("tag"))


def split_key(corpus: str, split: str) -> str:
  """The key of a corpus's evaluation split in the pipeline's batches and references: the
  split's name for the main corpus, 'NAME/split' for another."""
  return split if corpus in ("", MAIN) else f"{corpus}/{split}"


def _check_tag(tag: Any, field: str) -> str:
  if not isinstance(tag, str):
    raise ConfigError(f"{field}={show(tag)}: a tag is a string, e.g. '<BT>' or '>>fr<<'")
  if tag and (tag != tag.strip() or any(c.isspace() for c in tag)):
    raise ConfigError(f"{field}={tag!r}: a tag is one token, without spaces")
  return tag


def _check_weight(weight: Any, field: str) -> float:
  if isinstance(weight, bool) or not isinstance(weight, int | float):
    raise ConfigError(f"{field}={show(weight)}: a weight is a number > 0")
  w = float(weight)
  if not math.isfinite(w) or w <= 0:
    raise ConfigError(f"{field}={show(weight)}: a weight is a number > 0 (an upsampling factor; "
                      "leave a corpus out instead of giving it 0)")
  return w


def corpora_of(config: Any) -> list[Corpus]:
  """The run's corpora, main first, each checked (`ConfigError` naming the field): a name, its
  fields, a weight > 0, tags of one token and distinct, and tags on every corpus when their
  language pairs differ (else a model could not tell which target language to produce)."""
  main = Corpus(MAIN, config, _check_weight(config.data.get("weight", 1.0), "data.weight"),
                _check_tag(config.data.get("tag", "") or "", "data.tag"))
  out = [main]
  entries = config.data.get("corpora") or {}
  if not hasattr(entries, "items"):
    raise ConfigError(f"data.corpora={show(entries)}: a mapping of corpus names to corpora "
                      "(configs/common.py `corpus`)")
  for name, entry in sorted(dict(entries).items()):
    field = f"data.corpora.{name}"
    if not _NAME.match(name) or name == MAIN:
      raise ConfigError(f"{field}: a corpus name is a letter then letters, digits or _, and "
                        f"not {MAIN!r} (the main corpus's)")
    if not hasattr(entry, "items"):
      raise ConfigError(f"{field}={show(entry)}: a corpus is a ConfigDict of fields "
                        "(configs/common.py `corpus`)")
    entry = dict(entry.items())
    unknown = sorted(set(entry) - set(ENTRY_FIELDS) - set(DATA_FIELDS))
    if unknown:
      raise ConfigError(f"{field}.{unknown[0]}: no such field; a corpus has "
                        f"{', '.join(ENTRY_FIELDS + DATA_FIELDS)}")
    if not entry.get("dataset"):
      raise ConfigError(f"{field}.dataset: not set; name what the corpus reads ('text', "
                        "'numbers' or a TFDS builder)")
    sub = config.copy_and_resolve_references()
    with sub.unlocked():
      sub.dataset = entry["dataset"]
      for key in DATA_FIELDS:
        value = entry.get(key)
        if value is not None:
          sub.data[key] = value.to_dict() if hasattr(value, "to_dict") else value
    out.append(Corpus(name, sub, _check_weight(entry.get("weight", 1.0), f"{field}.weight"),
                      _check_tag(entry.get("tag", "") or "", f"{field}.tag")))
  seen: dict[str, Corpus] = {}
  for c in out:
    if c.tag in seen:
      raise ConfigError(f"{c.field}.tag={c.tag!r}: {seen[c.tag].field} has the same tag; tags "
                        "must differ")
    if c.tag:
      seen[c.tag] = c
  for c in out[1:]:
    if c.pair != main.pair and not (c.tag and main.tag):
      untagged = c if not c.tag else main
      raise ConfigError(
        f"{untagged.field}.tag: not set, but {c.field} translates {'-'.join(c.pair)} and the "
        f"main corpus {'-'.join(main.pair)}: corpora of different language pairs each need a "
        "tag (e.g. '>>fr<<'), which chooses the direction")
  return out


def tags(config: Any) -> list[str]:
  """The tags of the run's corpora (main first), without the empty ones."""
  if not is_mixture(config):
    return []
  return [c.tag for c in corpora_of(config) if c.tag]


class MixtureReader:
  """The corpora's readers as one: the training split is all of theirs, one after the other
  (what the vocabulary is sampled from); the other splits are the main corpus's. `readers`
  maps each corpus's name to its reader."""

  def __init__(self, corpora_: Sequence[Corpus], readers: dict[str, Any]):
    self.corpora = list(corpora_)
    self.readers = readers
    main = readers[MAIN]
    self.source_key, self.target_key = main.source_key, main.target_key

  @property
  def name(self) -> str:
    return "mixture(" + ", ".join(f"{c.name}={self.readers[c.name].name}"
                                  for c in self.corpora) + ")"

  def fingerprint(self) -> str:
    """SHA-256 of the corpora's names, fingerprints and tags: the vocabulary is keyed by it
    (the weights do not change what it is sampled from)."""
    parts = [[c.name, self.readers[c.name].fingerprint(), c.tag] for c in self.corpora]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

  def num_examples(self, split: str) -> int:
    if split != "train":
      return self.readers[MAIN].num_examples(split)
    return sum(r.num_examples("train") for r in self.readers.values())

  def chunks(self, split: str) -> Iterator[Chunk]:
    if split != "train":
      yield from self.readers[MAIN].chunks(split)
      return
    for c in self.corpora:
      yield from self.readers[c.name].chunks("train")

  def read_pairs(self, split: str) -> list[tuple[str, str]]:
    return self.readers[MAIN].read_pairs(split)


def open_mixture(config: Any) -> MixtureReader:
  """Every corpus's reader, checked before any work: a `DataError` from a corpus (a missing
  file, files of unequal length, an unknown builder) names the corpus."""
  corpora_ = corpora_of(config)
  readers = {}
  for c in corpora_:
    try:
      readers[c.name] = corpora.open_corpus(c.config)
    except DataError as e:
      if c.name == MAIN:
        raise
      # The corpus's fields are data.corpora.NAME.FIELD in its config: say so.
      message = re.sub(r"\bdata\.(?=(" + "|".join(DATA_FIELDS) + r")\b)", f"{c.field}.",
                       str(e))
      raise DataError(f"{c.field}: {message}") from None
  return MixtureReader(corpora_, readers)


def tag_ids(tokenizer: Any, corpora_: Sequence[Corpus]) -> dict[str, int]:
  """corpus name -> the id of its tag (tagged corpora only), each checked against the
  vocabulary: a tag must be one of its user-defined pieces (a `DataError` if the vocabulary
  lacks it, which would split it into pieces, or has it as an ordinary piece, which text
  produces too)."""
  out = {}
  for c in corpora_:
    if c.tag:
      out[c.name] = tag_id(tokenizer, c.tag, f"{c.field}.tag")
  return out


def tag_id(tokenizer: Any, tag: str, field: str) -> int:
  """The id of `tag` in the vocabulary (see `tag_ids`)."""
  kind = tokenizer.piece_kind(tag) if hasattr(tokenizer, "piece_kind") else None
  if kind is None:
    raise DataError(f"{field}={tag!r}: the vocabulary {tokenizer.path} has no such piece; a "
                    "tag must be trained into the vocabulary (a new one is; an init_from "
                    "model's must have it)")
  if kind != "user_defined":
    raise DataError(f"{field}={tag!r}: collides with an ordinary piece of the vocabulary "
                    f"{tokenizer.path} (text produces it too); pick another tag")
  return tokenizer.piece_id(tag)


def check_tags_absent(texts: Sequence[bytes], tags_: Sequence[str], field: str) -> None:
  """`DataError` when a tag occurs in the corpora's own text (a sample of it): it would then
  not mark the corpus alone."""
  encoded = [t.encode() for t in tags_ if t]
  for text in texts:
    for tag in encoded:
      if tag in text:
        raise DataError(f"{field}: the tag {tag.decode()!r} occurs in the training text "
                        f"({text[:60].decode(errors='replace')!r}...); pick a tag the text "
                        "never contains")


def compose(parts: Sequence[tuple[TokenizedSplit, float, int | None]], seed: int,
            ) -> list[np.ndarray]:
  """Per corpus, the indices of its examples in one epoch of the mixture: every example
  floor(w) times, then a fixed sample (from `seed`) of round(frac(w) n) examples."""
  out = []
  for i, (split, weight, _) in enumerate(parts):
    n = len(split)
    whole, frac = int(math.floor(weight)), weight - math.floor(weight)
    pieces = [np.arange(n, dtype=np.int64)] * whole
    extra = int(round(frac * n))
    if extra:
      rng = np.random.default_rng([seed, 0x6D6978, i])  # 'mix'
      pieces.append(np.sort(rng.choice(n, size=extra, replace=False)))
    out.append(np.concatenate(pieces) if pieces else np.zeros(0, np.int64))
  return out


def mixture_split(parts: Sequence[tuple[TokenizedSplit, float, int | None]], seed: int,
                  directory: str | None, chunk: int = 1 << 20) -> TokenizedSplit:
  """One tokenized split of the corpora's (split, weight, tag id or None) parts, `compose`d,
  with each tagged source's tag id in front: written once under `directory` (keyed by the
  parts and the seed) and memory-mapped; in memory when `directory` is None."""
  indices = compose(parts, seed)
  if directory is None:
    flat: dict[str, list[np.ndarray]] = {"source": [], "target": []}
    lengths: dict[str, list[np.ndarray]] = {"source": [], "target": []}
    for side, ids, lens in _pieces(parts, indices, chunk):
      flat[side].append(ids)
      lengths[side].append(lens)
    arrays = {}
    for side in ("source", "target"):
      arrays[side] = np.concatenate(flat[side]) if flat[side] else np.zeros(0, np.int32)
      arrays[f"{side}_offsets"] = _offsets(lengths[side])
    return TokenizedSplit(**arrays)
  key = hashlib.sha256(json.dumps(
    {"format": FORMAT, "seed": seed,
     "parts": [[os.path.basename(s.directory or ""), len(s), w, t] for s, w, t in parts]}
  ).encode()).hexdigest()[:20]
  final = os.path.join(directory, f"mixture-{key}")
  if os.path.exists(os.path.join(final, "meta.json")):
    return map_split(final)
  os.makedirs(directory, exist_ok=True)
  with storage.local_file_lock(final + ".lock"):
    if not os.path.exists(os.path.join(final, "meta.json")):
      tmp = tempfile.mkdtemp(prefix=".mixture-", dir=directory)
      try:
        _write(parts, indices, tmp, chunk)
        os.chmod(tmp, 0o755)
        os.rename(tmp, final)
      except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
  return map_split(final)


def _pieces(parts: Sequence[tuple[TokenizedSplit, float, int | None]],
            indices: Sequence[np.ndarray], chunk: int
            ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
  """The mixture's ids in order, `chunk` examples at a time: (side, flat ids, lengths), the
  source after its corpus's tag."""
  dtype = np.result_type(*[p[0].source.dtype for p in parts])
  for (split, _, tag), idx in zip(parts, indices, strict=True):
    for lo in range(0, len(idx), chunk):
      part = idx[lo:lo + chunk]
      for side in ("source", "target"):
        ids, lens = _gather(getattr(split, side), getattr(split, f"{side}_offsets"), part,
                            tag if side == "source" else None, dtype)
        yield side, ids, lens


def _offsets(lengths: list[np.ndarray]) -> np.ndarray:
  lens = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
  offsets = np.zeros(len(lens) + 1, np.int64)
  np.cumsum(lens, out=offsets[1:])
  return offsets


def _write(parts: Sequence[tuple[TokenizedSplit, float, int | None]],
           indices: Sequence[np.ndarray], directory: str, chunk: int) -> None:
  dtype = np.result_type(*[p[0].source.dtype for p in parts])
  lengths: dict[str, list[np.ndarray]] = {"source": [], "target": []}
  with open(os.path.join(directory, "source.bin"), "wb") as fs, \
       open(os.path.join(directory, "target.bin"), "wb") as ft:
    files = {"source": fs, "target": ft}
    for side, ids, lens in _pieces(parts, indices, chunk):
      files[side].write(ids.tobytes())
      lengths[side].append(lens)
  for side in ("source", "target"):
    np.save(os.path.join(directory, f"{side}_offsets.npy"), _offsets(lengths[side]))
  with open(os.path.join(directory, "meta.json"), "w") as f:
    json.dump({"format": FORMAT, "dataset": "mixture", "split": "train",
               "num_examples": sum(len(x) for x in lengths["source"]),
               "dtype": np.dtype(dtype).name}, f)


def _gather(flat: np.ndarray, offsets: np.ndarray, examples: np.ndarray, tag: int | None,
            dtype: Any) -> tuple[np.ndarray, np.ndarray]:
  """The examples' ids back to back (each after `tag`, if any) and their lengths."""
  starts = np.asarray(offsets[examples], np.int64)
  lens = np.asarray(offsets[examples + 1], np.int64) - starts
  extra = 0 if tag is None else 1
  out_lens = lens + extra
  out = np.empty(int(out_lens.sum()), dtype)
  first = np.cumsum(out_lens) - out_lens  # where each example starts in `out`
  if extra:
    out[first] = tag
  col = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
  out[np.repeat(first + extra, lens) + col] = flat[np.repeat(starts, lens) + col]
  return out, out_lens


def log_composition(corpora_: Sequence[Corpus], parts: Sequence[tuple[TokenizedSplit, float,
                    int | None]]) -> None:
  sizes = [round(w * len(s)) for s, w, _ in parts]
  total = max(sum(sizes), 1)
  for c, (s, w, _), size in zip(corpora_, parts, sizes, strict=True):
    logging.info("corpus %s: %s pairs x weight %g = %s per epoch (%.1f%%)%s", c.name,
                 f"{len(s):,}", w, f"{size:,}", 100 * size / total,
                 f", tag {c.tag!r}" if c.tag else "")


def check_known_tag(tag: str, tags_: Sequence[str], field: str = "decode.tag") -> None:
  """`ConfigError` naming `field` unless `tag` is '' or one of the model's `tags_`."""
  if tag and tag not in tags_:
    raise ConfigError(f"{field}={tag!r}: the model was not trained with this tag; its tags: "
                      f"{', '.join(tags_) or 'none'}")


class SourceEncoder:
  """Source text -> ids, with a tag in front for a model trained on tagged corpora: the tag a
  line starts with (its first word, when it is one of the model's tags), else `default` (the
  `decode.tag` of translation), else none. A first word shaped like the model's tags but not
  one of them (`>>es<<` for a model of `>>de<<` and `>>fr<<`) is a `UserError`: the model never
  saw it.

  Args:
    tokenizer: the model's vocabulary.
    tags: the model's tags (`tags(config)`); empty: text is encoded as it is.
    default: the tag of lines without one ('' for none), one of `tags` (else `ConfigError`
      naming `field`).
  """

  def __init__(self, tokenizer: Any, tags_: Sequence[str], default: str = "",
               field: str = "decode.tag"):
    self.tokenizer = tokenizer
    check_known_tag(default, tags_, field)
    self.ids = {t: tag_id(tokenizer, t, "the model's tag") for t in tags_}
    self.default = self.ids.get(default)
    self._shapes = {(t[:2], t[-2:]) for t in self.ids if len(t) >= 4}

  def split(self, line: str) -> tuple[int | None, str]:
    """(tag id or None, the text after the tag) of a source line."""
    first, _, rest = line.strip().partition(" ")
    if first in self.ids:
      return self.ids[first], rest
    if len(first) >= 4 and (first[:2], first[-2:]) in self._shapes:
      raise DataError(f"the tag {first!r} is not one the model was trained with; its tags: "
                      f"{', '.join(self.ids)}")
    return self.default, line

  def encode(self, line: str) -> list[int]:
    """The line's ids, ending in EOS, after its tag's id."""
    tag, text = self.split(line) if self.ids else (None, line)
    ids = self.tokenizer.encode(text.strip())
    return ids if tag is None else [tag, *ids]
