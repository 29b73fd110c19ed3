"""A real parallel corpus offline: the message catalogues installed on this machine.

Every Linux machine with translated programs has them: `/usr/share/locale/<lang>/LC_MESSAGES/
*.mo`, each the English messages of one program with their translations (gettext). Read with
`gettext.GNUTranslations`, every single-line English message with its translation, both sides
MIN_WORDS to MAX_WORDS words and free of format placeholders (`%s`, `{}`), the English side
unique, shuffled with `--seed`, at most `--max_pairs` of them, becomes a line-aligned pair of
files `<out>/train.en` and `<out>/train.<lang>` that `configs/text.py:en-<lang>` trains on:

    python -m benchmarks.messages --lang=fr --out=runs/messages-en-fr/corpus

It prints their description (pairs, catalogues read, mean words per side, the files' SHA-256):
another machine has other catalogues, so a result on them names its corpus by these.
"""

from __future__ import annotations

import gettext
import glob
import hashlib
import json
import os
import random
import re
from typing import Any

MIN_WORDS, MAX_WORDS = 3, 20
# A format placeholder (printf's %, Python's and glib's braces) or a control character
# (tabs, newlines: the pair is not one line of text).
_NOT_PLAIN = re.compile(r"[%{}\x00-\x1f\x7f]")


def catalogue_dir(lang: str) -> str:
  """Where a Debian-like system keeps the catalogues of language `lang`."""
  return f"/usr/share/locale/{lang}/LC_MESSAGES"


def catalogue_pairs(directory: str) -> tuple[list[tuple[str, str]], dict[str, int]]:
  """The (English, translation) messages of the `*.mo` catalogues in `directory`, in file order.

  Keeps singular messages whose both sides, stripped, are one line of MIN_WORDS..MAX_WORDS
  words without format placeholders or tabs, with inner spaces collapsed; the first translation
  of each English message. Returns the pairs and counts: catalogues read, and those that
  cannot be (a header in another encoding). Raises DataError when `directory` holds no
  catalogue.
  """
  from transformer.data.errors import DataError

  files = sorted(glob.glob(os.path.join(directory, "*.mo")))
  if not files:
    raise DataError(f"--catalogues={directory}: no message catalogues (*.mo) there; install "
                    "some translated programs or point --catalogues at a directory of them")
  pairs: dict[str, str] = {}
  unreadable = 0
  for path in files:
    try:
      with open(path, "rb") as f:
        catalogue = gettext.GNUTranslations(f)
    except (OSError, UnicodeDecodeError, ValueError):
      unreadable += 1
      continue
    # GNUTranslations has no public way to list its messages; `_catalog` maps msgid to msgstr
    # (plural forms under (msgid, n) keys, the header under '').
    for msgid, msgstr in catalogue._catalog.items():
      if not isinstance(msgid, str):
        continue
      en, other = msgid.strip(), msgstr.strip()  # a trailing newline is still one line
      if _NOT_PLAIN.search(en + other):
        continue
      en, other = " ".join(en.split()), " ".join(other.split())
      if all(MIN_WORDS <= len(s.split()) <= MAX_WORDS for s in (en, other)):
        pairs.setdefault(en, other)
  return list(pairs.items()), {"catalogues": len(files) - unreadable, "unreadable": unreadable}


def write_messages(directory: str, out_dir: str, max_pairs: int, seed: int,
                   lang: str = "de") -> dict[str, Any]:
  """The shuffled catalogue pairs (at most `max_pairs`) as `out_dir`/train.en and
  train.`lang`; returns their description (counts, mean words per side, SHA-256 of each
  file)."""
  pairs, counts = catalogue_pairs(directory)
  random.Random(seed).shuffle(pairs)
  pairs = pairs[:max_pairs]
  os.makedirs(out_dir, exist_ok=True)
  desc: dict[str, Any] = {"catalogue_dir": directory, **counts, "pairs": len(pairs),
                          "seed": seed, "files": {}}
  for i, side in enumerate(("en", lang)):
    data = "".join(p[i] + "\n" for p in pairs).encode()
    path = os.path.join(out_dir, f"train.{side}")
    with open(path, "wb") as f:
      f.write(data)
    desc["files"][side] = {"path": path, "sha256": hashlib.sha256(data).hexdigest()}
    desc[f"mean_words_{side}"] = sum(len(p[i].split()) for p in pairs) / max(len(pairs), 1)
  return desc


if __name__ == "__main__":
  from absl import app, flags

  from transformer.errors import UserError, fail, flags_parser

  _LANG = flags.DEFINE_string("lang", "de", "The translations' language (the catalogues' "
                              "directory name: de, fr, ...).")
  _CATALOGUES = flags.DEFINE_string("catalogues", None, "Directory of the catalogues (*.mo); "
                                    "default /usr/share/locale/<lang>/LC_MESSAGES.")
  _MAX_PAIRS = flags.DEFINE_integer("max_pairs", 1_000_000, "Sentence pairs kept at most.")
  _SEED = flags.DEFINE_integer("seed", 0, "Seed of the sentence pairs' shuffle.")
  _OUT = flags.DEFINE_string("out", None, "Directory of train.en and train.<lang>.",
                             required=True)

  def main(argv: list[str]) -> None:
    if len(argv) > 1:
      fail(f"unexpected arguments {' '.join(argv[1:])!r}")
    if not re.fullmatch(r"[A-Za-z_]+", _LANG.value) or _LANG.value == "en":
      fail(f"--lang={_LANG.value}: a language code other than en (de, fr, ...)")
    try:
      desc = write_messages(_CATALOGUES.value or catalogue_dir(_LANG.value), _OUT.value,
                            _MAX_PAIRS.value, _SEED.value, _LANG.value)
    except UserError as e:
      fail(str(e))
    print(json.dumps(desc, indent=1))

  app.run(main, flags_parser=flags_parser())
