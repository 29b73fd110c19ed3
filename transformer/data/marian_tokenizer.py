"""OPUS-MT's vocabulary: a SentencePiece model per language over one joint table of ids.

A Marian model directory in Hugging Face's layout holds `source.spm` (the pieces of source
sentences), `target.spm` (of target sentences) and `vocab.json`, which gives every piece the
model's id: `</s>` 0, `<unk>` 1, ..., `<pad>` V - 1. The project's ids are padding 0, EOS 1,
unknown 2 (data/tokenizer.py), so the ids are rotated by one:

    our_id = (marian_id + 1) % V

which takes `<pad>` to 0, `</s>` to 1 and `<unk>` to 2 and keeps every other piece in order
(transformer/interop/marian.py rolls the embedding rows and the logits bias the same way).

Text is encoded as transformers' MarianTokenizer (5.x) encodes it: the special tokens `</s>`,
`<unk>`, `<pad>` written in the text stay single tokens; in each stretch between them a leading
language code `>>xx<<` is one token and the rest is cut into pieces by the side's SentencePiece
model; each piece takes its vocab.json id (`<unk>` for a piece vocab.json lacks); EOS ends the
sentence. Decoding is MarianTokenizer's `decode(ids, skip_special_tokens=True)`: the special ids
(padding, EOS, unknown) are dropped and the pieces joined by the source model, which
MarianTokenizer uses for both sides when the vocabulary is joint. The Moses punctuation
normalisation MarianTokenizer may set up is not applied by its encoding, and not here either.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

from transformer import storage
from transformer.data.errors import DataError
from transformer.data.tokenizer import EOS_ID, PAD_ID, SIDES, SOURCE, UNK_ID

SOURCE_SPM, TARGET_SPM, VOCAB, TOKENIZER_CONFIG = (
  "source.spm", "target.spm", "vocab.json", "tokenizer_config.json")
# What a workdir keeps (tokenizer_config.json is optional: it only says how text is cleaned up).
FILES = (SOURCE_SPM, TARGET_SPM, VOCAB)
EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
SPIECE_UNDERLINE = "\u2581"


def rotate(marian_id: int | np.ndarray, vocab_size: int) -> int | np.ndarray:
  """A Marian id (or array of them) -> the project's id: (marian_id + 1) % V."""
  return (marian_id + 1) % vocab_size


def check_vocabulary(table: object, where: str) -> list[str]:
  """The pieces of a vocab.json table (piece -> id) in Marian id order; `DataError` naming
  `where` unless the ids are 0..V-1, each once, with `</s>` 0, `<unk>` 1 and `<pad>` V - 1."""
  if not isinstance(table, dict) or not all(
      isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
      for k, v in table.items()):
    raise DataError(f"{where}: must be a JSON object of pieces to integer ids")
  size = len(table)
  pieces: list[str | None] = [None] * size
  for piece, i in table.items():
    if not 0 <= i < size or pieces[i] is not None:
      raise DataError(f"{where}: the ids must be 0..{size - 1}, each once; {piece!r} has {i}")
    pieces[i] = piece
  for piece, want in ((EOS, 0), (UNK, 1), (PAD, size - 1)):
    if table.get(piece) != want:
      raise DataError(f"{where}: {piece!r} must have id {want} (Marian's layout), "
                      f"has {table.get(piece)!r}")
  return pieces  # type: ignore[return-value]


def _processor(data: bytes, where: str) -> spm.SentencePieceProcessor:
  try:
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(data)
  except Exception as e:  # noqa: BLE001 - RuntimeError or a protobuf error
    reason = (str(e).splitlines() or [type(e).__name__])[0]
    raise DataError(f"cannot read SentencePiece model {where}: {reason}") from None
  return sp


class MarianTokenizer:
  """Encodes text to the project's ids (ending in EOS) and decodes them, as OPUS-MT does.

  The same interface as `tokenizer.Tokenizer` (`vocab_size`, `encode`, `encode_batch`,
  `decode`, `sha256`, `path`); `encode` and `encode_batch` take the `side` of the text.
  """

  def __init__(self, files: dict[str, bytes], path: str = "<memory>"):
    """`files`: the contents of FILES (and of TOKENIZER_CONFIG if there is one) by name;
    `path`: the directory they were read from. `DataError` names the file at fault."""
    def where(name: str) -> str:
      return os.path.join(path, name)

    self.path = path
    self._source = _processor(files[SOURCE_SPM], where(SOURCE_SPM))
    self._target = _processor(files[TARGET_SPM], where(TARGET_SPM))
    try:
      table = json.loads(files[VOCAB])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise DataError(f"{where(VOCAB)}: not JSON ({e})") from None
    self._pieces = check_vocabulary(table, where(VOCAB))
    self._ids = {piece: i for i, piece in enumerate(self._pieces)}
    settings = {}
    if TOKENIZER_CONFIG in files:
      try:
        settings = json.loads(files[TOKENIZER_CONFIG])
      except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{where(TOKENIZER_CONFIG)}: not JSON ({e})") from None
    self._clean_up = bool(settings.get("clean_up_tokenization_spaces", False))
    specials = sorted((EOS, UNK, PAD), key=len, reverse=True)
    self._special = re.compile("(" + "|".join(map(re.escape, specials)) + ")")
    # Every file by name, in a fixed order: checkpoints and the token cache are keyed by it.
    digest = hashlib.sha256()
    for name in sorted(files):
      digest.update(f"{name}\0{hashlib.sha256(files[name]).hexdigest()}\0".encode())
    self.sha256 = digest.hexdigest()
    self.files = dict(files)

  @classmethod
  def load(cls, directory: str | os.PathLike) -> MarianTokenizer:
    """Reads FILES (and TOKENIZER_CONFIG if present) from `directory`, local or remote."""
    root = storage.as_path(directory)
    files = {}
    for name in (*FILES, TOKENIZER_CONFIG):
      try:
        files[name] = (root / name).read_bytes()
      except FileNotFoundError:
        if name != TOKENIZER_CONFIG:
          raise DataError(f"{root / name} not found (an OPUS-MT vocabulary has "
                          f"{', '.join(FILES)})") from None
    return cls(files, os.fspath(directory))

  @property
  def vocab_size(self) -> int:
    """Number of ids, including padding, EOS and unknown."""
    return len(self._pieces)

  def pieces(self) -> list[str]:
    """The piece of every project id, in id order (`<pad>`, `</s>`, `<unk>`, ...)."""
    return [self._pieces[-1], *self._pieces[:-1]]

  def _stretches(self, text: str) -> list[tuple[bool, str]]:
    """`text` cut at the special tokens written in it: (is special, text) pairs, in order."""
    parts = self._special.split(text)
    return [(i % 2 == 1, p) for i, p in enumerate(parts) if p]

  def encode_batch(self, texts: Sequence[str | bytes], num_threads: int = -1,
                   side: str = SOURCE) -> list[list[int]]:
    """`encode` of each text; SentencePiece cuts all of them in one call, on several threads."""
    if side not in SIDES:
      raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    sp = self._source if side == SOURCE else self._target
    plans, stretches = [], []
    for text in texts:
      if isinstance(text, bytes):
        text = text.decode("utf-8")
      plan = []
      for special, part in self._stretches(text):
        if special:
          plan.append([part])
          continue
        code = []
        # A language code (`>>fr<<`, for multilingual targets) is one token, not cut.
        end = part.find("<<") if part.startswith(">>") else -1
        if end != -1:
          code, part = [part[: end + 2]], part[end + 2 :]
        plan.append(code)
        plan.append(len(stretches))
        stretches.append(part)
      plans.append(plan)
    cut = sp.encode(stretches, out_type=str, num_threads=num_threads) if stretches else []
    size, unk = self.vocab_size, self._ids[UNK]
    out = []
    for plan in plans:
      marian = []
      for step in plan:
        for piece in (cut[step] if isinstance(step, int) else step):
          marian.append(self._ids.get(piece, unk))
      out.append([rotate(i, size) for i in marian] + [EOS_ID])
    return out

  def encode(self, text: str | bytes, side: str = SOURCE) -> list[int]:
    """Ids of `text` (a source sentence, or a target one with side=TARGET) followed by EOS."""
    return self.encode_batch([text], num_threads=1, side=side)[0]

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Text of `ids` up to the first EOS; padding, unknown and out-of-vocabulary ids are
    dropped (MarianTokenizer's `skip_special_tokens=True`).

    Args:
      ids: [length] ints, e.g. one row of a model's output.
    """
    pieces = []
    size = self.vocab_size
    for i in np.asarray(ids).reshape(-1).tolist():
      if i == EOS_ID:
        break
      if i in (PAD_ID, UNK_ID) or not 0 <= i < size:
        continue
      pieces.append(self._pieces[(i - 1) % size])
    text = self._source.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip()
    if self._clean_up:  # transformers' clean_up_tokenization
      for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                             (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                             (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text

