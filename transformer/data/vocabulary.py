"""The vocabulary of a run: trained on a seeded sample of the training pairs, or the workdir's own.

`get_tokenizer` loads `<workdir>/vocab/spm.model` (or an imported OPUS-MT model's vocabulary),
or trains it; `stored_tokenizer` only loads. The paths are the workdir's (transformer/workdir.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from transformer import storage
from transformer import workdir as workdir_lib
from transformer.data.corpora import Reader
from transformer.data.errors import DataError
from transformer.data.marian_tokenizer import MarianTokenizer
from transformer.data.mixture import check_tags_absent
from transformer.data.tokenizer import Tokenizer, VocabSizeError


def vocabulary_sample(reader: Reader, n: int, seed: int) -> Iterator[bytes]:
  """Both sides of `n` training pairs drawn without replacement with `seed`, in file order.

  The pairs are chosen by index and picked out of the stream, so the corpus is never held in
  memory.
  """
  total = reader.num_examples("train")
  n = min(n, total)
  rng = np.random.default_rng([seed, 1])
  chosen = np.sort(rng.choice(total, size=n, replace=False))
  base = 0
  for src, tgt in reader.chunks("train"):
    lo, hi = np.searchsorted(chosen, [base, base + len(src)])
    for i in (chosen[lo:hi] - base).tolist():
      yield src[i]
      yield tgt[i]
    base += len(src)
    if hi == n:
      return


def stored_tokenizer(workdir: str | os.PathLike) -> Tokenizer | MarianTokenizer | None:
  """The workdir's vocabulary, of the kind its location says (`Paths.marian_vocab` or
  `Paths.vocab`); None if it has neither."""
  files = workdir_lib.paths(workdir)
  if (files.marian_vocab / "vocab.json").exists():
    return MarianTokenizer.load(files.marian_vocab)
  if files.vocab.exists():
    return Tokenizer.load(files.vocab)
  return None


def get_tokenizer(config: Any, workdir: str, reader: Reader | None, *,
                  builder: bool = True, wait_timeout: float = 4 * 3600,
                  tags: Sequence[str] = ()) -> Tokenizer | MarianTokenizer:
  """Loads `<workdir>/vocab/spm.model`, or trains it on a sample of the training pairs; an
  imported OPUS-MT vocabulary (`Paths.marian_vocab`) is loaded instead where there is one.

  The vocabulary has exactly `config.data.vocab_size` ids (else `DataError`: a stored one of
  another size, or a training text too small for that many pieces).

  The sample is `config.data.spm_train_sentences` pairs (both sides) drawn with
  `config.seed` (`vocabulary_sample`), so training is deterministic and a resumed run reuses
  the stored vocabulary. Only a `builder` process (process 0) trains; the others wait for
  its file. An imported vocabulary was not trained on the corpus, so it is not keyed by it.

  The vocabulary is keyed by the corpus: `<workdir>/vocab/corpus.sha256` holds the reader's
  fingerprint (the files' contents for a text corpus), and a stored vocabulary of another
  corpus (e.g. an edited file) is a `DataError`, never silently reused.

  `tags` (the corpora's, transformer/data/mixture.py) become user-defined pieces of a new
  vocabulary; a tag found in the sampled text is a `DataError`.
  """
  files = workdir_lib.paths(workdir)
  if (files.marian_vocab / "vocab.json").exists():
    tok = MarianTokenizer.load(files.marian_vocab)
    if tok.vocab_size != config.data.vocab_size:
      raise DataError(f"{tok.path} has {tok.vocab_size} ids but config.data.vocab_size is "
                      f"{config.data.vocab_size}: use the workdir's config")
    return tok
  path = files.vocab
  corpus = path.parent / "corpus.sha256"
  if not builder:
    storage.wait_for(path, wait_timeout, "the vocabulary")
  fingerprint = reader.fingerprint() if reader is not None and builder else None
  if path.exists():
    tok = Tokenizer.load(path)
    if fingerprint is not None:
      if not corpus.exists():  # a workdir from before the key was kept: adopt it
        storage.write_atomic(corpus, fingerprint)
      elif corpus.read_text().strip() != fingerprint:
        raise DataError(
          f"{path} was trained on other data than {config.dataset!r} is now (a changed file or "
          "split): use a new --workdir, or delete its vocab/, cache/ and checkpoints/"
        )
  else:
    if reader is None or reader.num_examples("train") == 0:
      raise DataError("cannot train a vocabulary: the training split is empty")
    texts = vocabulary_sample(reader, int(config.data.spm_train_sentences), config.seed)
    if tags:  # checked before training: an error inside SentencePiece's reader would be lost
      texts = list(texts)
      check_tags_absent(texts, tags, "data.tag / data.corpora.NAME.tag")
    try:
      tok = Tokenizer.train(texts, os.fspath(path)[: -len(".model")], config.data.vocab_size,
                            seed=config.seed, user_defined_symbols=tags)
    except VocabSizeError as e:
      raise DataError(
        f"config.data.vocab_size={config.data.vocab_size} is too large for the "
        f"{config.dataset} training sample: SentencePiece can make at most {e.max_size} pieces"
      ) from None
    if fingerprint is not None:
      storage.write_atomic(corpus, fingerprint)
  if tok.vocab_size != config.data.vocab_size:
    raise DataError(
      f"{path} has {tok.vocab_size} ids but config.data.vocab_size is "
      f"{config.data.vocab_size}: use a new workdir or a matching vocab_size"
    )
  return tok


