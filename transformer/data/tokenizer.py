"""A SentencePiece subword vocabulary shared by the source and the target language.

Ids follow the project contract: 0 is padding, 1 is end-of-sentence (appended by `encode`),
2 is unknown; there is no beginning-of-sentence id (the decoder input is the target shifted
right, with 0 in front).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_model

from transformer import storage
from transformer.data.errors import DataError

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
# The side of the translation a text is on: a vocabulary with one model per language
# (OPUS-MT's, data/marian_tokenizer.py) encodes each side with its own; this one ignores it.
SOURCE, TARGET = "source", "target"
SIDES = (SOURCE, TARGET)


def truncate(ids: Sequence[int] | np.ndarray, limit: int) -> Sequence[int] | np.ndarray:
  """`ids` (a list or an array, ending in EOS) cut to at most `limit` ids, EOS kept last, so a
  truncated sentence still ends as every sentence does; `ids` itself when it fits. Returns the
  same kind (list or array, of the same dtype) as `ids`."""
  if len(ids) <= limit:
    return ids
  if isinstance(ids, np.ndarray):
    return np.concatenate([ids[:limit - 1], np.array([EOS_ID], ids.dtype)])
  return [*ids[:limit - 1], EOS_ID]


class VocabSizeError(DataError):
  """The training text cannot support the requested vocabulary size."""

  def __init__(self, message: str, max_size: int):
    super().__init__(message)
    self.max_size = max_size


class Tokenizer:
  """Encodes text to ids ending in EOS and decodes ids back to text."""

  def __init__(self, processor: spm.SentencePieceProcessor, path: str = "<memory>",
               sha256: str = ""):
    self._sp = processor
    self.path = path
    self.sha256 = sha256  # of the model file: checkpoints and the token cache are keyed by it

  @classmethod
  def train(
    cls,
    texts: Iterable[str],
    model_prefix: str,
    vocab_size: int,
    *,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 0,
    max_sentence_length: int = 4192,
    num_threads: int | None = None,
    seed: int = 0,
    user_defined_symbols: Sequence[str] = (),
  ) -> Tokenizer:
    """Trains a vocabulary on `texts` and writes `<model_prefix>.model` (and `.vocab`).

    The files are written into a local temporary directory and then put in place with
    `storage.write_atomic` (the `.vocab` first, the `.model` last), so a crash never leaves a
    half-written model behind; `model_prefix` may be remote (`gs://...`).

    Args:
      texts: training sentences; the first `input_sentence_size` are used (in order: the
        caller samples, so that training is deterministic).
      model_prefix: output path without extension; its directory is created if needed.
      vocab_size: the exact number of ids; `VocabSizeError` if the text cannot support that
        many pieces.
      model_type: 'unigram' or 'bpe'.
      character_coverage: fraction of characters covered by the vocabulary.
      input_sentence_size: cap on the number of training sentences (0: no cap; else > 100).
      max_sentence_length: longer sentences (in bytes) are skipped by SentencePiece.
      num_threads: trainer threads (default: all CPUs).
      seed: SentencePiece's random seed (it also shuffles nothing: input order is kept).
      user_defined_symbols: pieces that text is always cut at and never splits (a corpus's
        tags, transformer/data/mixture.py); ids 3, 4, ... in this order.

    Returns:
      The trained tokenizer, loaded from the final file.
    """
    model_prefix = os.fspath(model_prefix)
    spm.SetRandomGeneratorSeed(seed)
    tmp_dir = tempfile.mkdtemp(prefix=".spm-tmp-")
    try:
      tmp_prefix = os.path.join(tmp_dir, "spm")
      try:
        spm.SentencePieceTrainer.train(
          sentence_iterator=iter(texts),
          model_prefix=tmp_prefix,
          vocab_size=vocab_size,
          model_type=model_type,
          character_coverage=character_coverage,
          input_sentence_size=input_sentence_size,
          shuffle_input_sentence=False,
          max_sentence_length=max_sentence_length,
          num_threads=num_threads or os.cpu_count() or 1,
          hard_vocab_limit=True,
          pad_id=PAD_ID,
          eos_id=EOS_ID,
          unk_id=UNK_ID,
          bos_id=-1,
          minloglevel=2,
          **({"user_defined_symbols": list(user_defined_symbols)}
             if user_defined_symbols else {}),
        )
      except RuntimeError as e:
        found = re.search(r"Vocabulary size too high .*<= (\d+)", str(e))
        if found is None:
          raise
        raise VocabSizeError(
          f"cannot train {vocab_size} pieces for {model_prefix}.model: the text supports at "
          f"most {found.group(1)}",
          int(found.group(1)),
        ) from None
      # The model records its (random) temporary prefix: store only the final name instead, so
      # that equal inputs give byte-identical files in any directory (and share a token cache).
      proto = sp_model.ModelProto()
      with open(tmp_prefix + ".model", "rb") as f:
        proto.ParseFromString(f.read())
      proto.trainer_spec.model_prefix = os.path.basename(model_prefix)
      with open(tmp_prefix + ".model", "wb") as f:
        f.write(proto.SerializeToString())
      # Vocab first: the .model file appearing is what marks a finished vocabulary.
      for ext in (".vocab", ".model"):
        with open(tmp_prefix + ext, "rb") as f:
          storage.write_atomic(model_prefix + ext, f.read())
    finally:
      shutil.rmtree(tmp_dir, ignore_errors=True)
    return cls.load(model_prefix + ".model")

  @classmethod
  def load(cls, path: str | os.PathLike) -> Tokenizer:
    """Loads a `.model` file; raises `DataError` naming `path` if it is missing or damaged."""
    try:
      data = storage.as_path(path).read_bytes()
      proto = sp_model.ModelProto()
      proto.ParseFromString(data)
      # A file cut at a field boundary still parses: check that all of it is there (the
      # trainer and normalizer specs are written after the pieces).
      spec, norm = proto.trainer_spec, proto.normalizer_spec
      if not (proto.HasField("trainer_spec") and proto.HasField("normalizer_spec")):
        raise ValueError("truncated file")
      if len(proto.pieces) != spec.vocab_size or not (
        norm.precompiled_charsmap or norm.name == "identity"
      ):
        raise ValueError("truncated file")
      sp = spm.SentencePieceProcessor()
      sp.LoadFromSerializedProto(data)
    except Exception as e:  # OSError, DecodeError, RuntimeError, ValueError.
      reason = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise DataError(f"cannot read SentencePiece model {path}: {reason}") from None
    if sp.pad_id() != PAD_ID or sp.eos_id() != EOS_ID:
      raise DataError(
        f"SentencePiece model {path} has pad_id={sp.pad_id()}, eos_id={sp.eos_id()}; "
        f"expected {PAD_ID} and {EOS_ID}"
      )
    return cls(sp, os.fspath(path), hashlib.sha256(data).hexdigest())

  @property
  def vocab_size(self) -> int:
    """Number of ids, including pad, EOS and unknown."""
    return self._sp.get_piece_size()

  def id_to_piece(self, i: int) -> str:
    """The piece of id `i` (`<pad>`, `</s>`, `<unk>` for 0, 1, 2)."""
    return self._sp.id_to_piece(i)

  def piece_id(self, piece: str) -> int:
    """The id of `piece` (UNK_ID when the vocabulary lacks it)."""
    return self._sp.piece_to_id(piece)

  def piece_kind(self, piece: str) -> str | None:
    """'user_defined' (a piece text is always cut at, e.g. a tag), 'control', 'unknown' or
    'normal'; None when the vocabulary lacks `piece`."""
    i = self._sp.piece_to_id(piece)
    if i == UNK_ID and piece != self._sp.id_to_piece(UNK_ID):
      return None
    if self._sp.is_unknown(i):
      return "unknown"
    if self._sp.is_control(i):
      return "control"
    # SentencePiece's Python API has no test for USER_DEFINED: read the model's piece type.
    return "user_defined" if i in self._user_defined() else "normal"

  def _user_defined(self) -> frozenset[int]:
    if not hasattr(self, "_user_ids"):
      proto = sp_model.ModelProto()
      proto.ParseFromString(self._sp.serialized_model_proto())
      kind = sp_model.ModelProto.SentencePiece.USER_DEFINED
      self._user_ids = frozenset(i for i, p in enumerate(proto.pieces) if p.type == kind)
    return self._user_ids

  def encode(self, text: str, side: str = SOURCE) -> list[int]:
    """Ids of `text` followed by EOS (1); never contains 0. One model serves both `side`s."""
    return self._sp.encode(text) + [EOS_ID]

  def encode_batch(self, texts: Sequence[str | bytes], num_threads: int = -1,
                   side: str = SOURCE) -> list[list[int]]:
    """`encode` of each text (SentencePiece runs the batch on several threads)."""
    ids = self._sp.encode(list(texts), num_threads=num_threads)
    for x in ids:
      x.append(EOS_ID)
    return ids

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Text of `ids` up to the first EOS; padding (0) and out-of-vocabulary ids are ignored.

    Args:
      ids: [length] ints, e.g. one row of a model's output.
    """
    out = []
    size = self.vocab_size
    for i in np.asarray(ids).reshape(-1).tolist():
      if i == EOS_ID:
        break
      if PAD_ID < i < size:
        out.append(i)
    return self._sp.decode(out)
