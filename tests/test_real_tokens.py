"""benchmarks.real_tokens: the message-catalogue corpus, the runs' plans and figures, one line for
a missing catalogue directory, and the command end to end (no speed asserted)."""

import hashlib
import json
import os
import struct
import subprocess
import sys

import pytest

from benchmarks import messages
from benchmarks import real_tokens as rt
from configs import numbers as numbers_config
from configs import text as text_config
from tests.test_train import FAST_COMPILE, REPO
from transformer.errors import ConfigError

UTF8 = b"Content-Type: text/plain; charset=UTF-8\n"


def write_mo(path, messages, header=UTF8):
  """A GNU message catalogue: `messages` {msgid: msgstr} (str keys, or (singular, plural)
  tuples for plural forms with a list of translations), with `header` as the '' entry."""
  entries = [(b"", header)]
  for key, value in messages.items():
    if isinstance(key, tuple):
      entries.append(("\0".join(key).encode(), "\0".join(value).encode()))
    else:
      entries.append((key.encode(), value.encode()))
  entries.sort()
  n = len(entries)
  ids_at, strs_at = 28, 28 + 8 * n
  data_at = strs_at + 8 * n
  table, blob = [], b""
  for column in (0, 1):
    for entry in entries:
      table.append((len(entry[column]), data_at + len(blob)))
      blob += entry[column] + b"\0"
  head = struct.pack("<7I", 0x950412DE, 0, n, ids_at, strs_at, 0, data_at)
  with open(path, "wb") as f:
    f.write(head + b"".join(struct.pack("<2I", *t) for t in table) + blob)


def test_catalogues_give_plain_one_line_pairs_of_3_to_20_words(tmp_path):
  write_mo(tmp_path / "a.mo", {
    "Cannot open the file": "Die Datei kann nicht geöffnet werden",
    "Cannot open %s": "%s kann nicht geöffnet werden",  # placeholder
    "Show {name} here": "{name} hier anzeigen",  # placeholder
    "Two\nlines of text": "Zwei\nZeilen Text",  # not one line
    "Done with the work\n": "Fertig mit der Arbeit\n",  # one line, stripped
    "Name\tSize\tDate here": "Name\tGröße\tDatum hier",  # a tab
    "Too short": "Zu kurz gesagt",  # 2 words
    "Words " * 21: "Wörter " * 21,  # 21 words
    "Open  the   window now": "Das  Fenster jetzt öffnen",  # whitespace collapsed
    ("One file was removed", "Many files were removed"): ["Eine Datei entfernt",
                                                           "Dateien entfernt"],
  })
  write_mo(tmp_path / "b.mo", {"Cannot open the file": "Kann die Datei nicht öffnen",  # dup
                               "Save all the documents": "Alle Dokumente speichern"})
  write_mo(tmp_path / "c.mo", {"Keep this one please": "Bitte dieses behalten"},
           header=b"Last-Translator: J\xe4ger\nContent-Type: text/plain; charset=ISO-8859-1\n")
  pairs, counts = messages.catalogue_pairs(str(tmp_path))
  assert pairs == [("Cannot open the file", "Die Datei kann nicht geöffnet werden"),
                   ("Done with the work", "Fertig mit der Arbeit"),
                   ("Open the window now", "Das Fenster jetzt öffnen"),
                   ("Save all the documents", "Alle Dokumente speichern")]
  assert counts == {"catalogues": 2, "unreadable": 1}

  desc = messages.write_messages(str(tmp_path), str(tmp_path / "out"), max_pairs=2, seed=3)
  en = (tmp_path / "out" / "train.en").read_text().splitlines()
  de = (tmp_path / "out" / "train.de").read_text().splitlines()
  assert len(en) == len(de) == desc["pairs"] == 2
  assert set(zip(en, de, strict=True)) <= set(pairs)  # line-aligned
  for lang in ("en", "de"):
    data = (tmp_path / "out" / f"train.{lang}").read_bytes()
    assert desc["files"][lang]["sha256"] == hashlib.sha256(data).hexdigest()
  assert desc["mean_words_en"] == sum(len(s.split()) for s in en) / 2
  again = messages.write_messages(str(tmp_path), str(tmp_path / "again"), max_pairs=2, seed=3)
  assert again["files"]["en"]["sha256"] == desc["files"]["en"]["sha256"]  # a seeded shuffle
  french = messages.write_messages(str(tmp_path), str(tmp_path / "fr"), 2, seed=3, lang="fr")
  assert (tmp_path / "fr" / "train.fr").read_text().splitlines() == de  # named by its language
  assert french["files"]["fr"]["sha256"] == desc["files"]["de"]["sha256"]


def test_the_buckets_run_sets_wmt_buckets_and_the_default_run_keeps_the_config():
  numbers, messages = numbers_config.get_config(), text_config.get_config("en-de,small")
  messages.data.heldout_pairs = 20  # as --messages.data.heldout_pairs=20 does
  plans = rt.plan_runs({"numbers": ("configs/numbers.py", numbers, {}),
                        "messages": ("configs/text.py:en-de,small", messages,
                                     {"data.heldout_pairs": "20"})},
                       steps=40, rounds=1, log_every=10, root="/tmp/rt")
  for corpus in ("numbers", "messages"):
    _, buckets, b_args = plans[corpus, "buckets"]
    _, default, d_args = plans[corpus, "default"]
    assert not buckets.data.packing and list(buckets.data.bucket_lengths) == rt.WMT_BUCKETS
    assert "--config.data.packing=False" in b_args
    assert "--config.data.bucket_lengths=[16,24,32,48,64,96,128,192,256]" in b_args
    assert buckets.model.max_len == 256 and "--config.model.max_len=256" in b_args
    assert default.data.packing and not any("packing" in a or "bucket" in a for a in d_args)
    for cfg, args in ((buckets, b_args), (default, d_args)):
      assert cfg.num_train_steps == 40 and "--config.num_train_steps=40" in args
      assert cfg.log_every_steps == 10 and "--config.compilation_cache_dir=" in args
  assert plans["messages", "default"][1].data.vocab_size == 2000  # DEFAULTS
  assert "--config.data.heldout_pairs=20" in plans["messages", "default"][2]
  assert "--config.data.train_files.en=/tmp/rt/messages/train.en" in plans["messages",
                                                                              "default"][2]
  # The command line's value wins over DEFAULTS; a field the runs set is refused.
  plans = rt.plan_runs({"messages": ("configs/text.py:en-de,small", messages,
                                     {"data.vocab_size": "500"})}, 40, 1, 10, "/tmp/rt")
  assert "--config.data.vocab_size=2000" not in plans["messages", "default"][2]
  with pytest.raises(ConfigError, match=r"--numbers\.num_train_steps"):
    rt.plan_runs({"numbers": ("configs/numbers.py", numbers, {"num_train_steps": "5"})},
                 40, 1, 10, "/tmp/rt")
  with pytest.raises(ConfigError, match="--steps=15: must be >= 20"):
    rt.plan_runs({"numbers": ("configs/numbers.py", numbers, {})}, 15, 1, 10, "/tmp/rt")


def test_a_runs_figures_come_from_its_metrics():
  records = [
    {"step": 2, "train/steps_per_s": 1.0, "train/tokens_per_s": 100.0,
     "train/real_token_fraction": 0.5, "startup/seconds": 40.0, "startup/compile_s": 9.5,
     "startup/batch_shapes": "[(32, 64, 42)]"},
    {"step": 6, "train/steps_per_s": 2.0, "train/tokens_per_s": 300.0,
     "train/real_token_fraction": 0.75},
    {"step": 10, "train/steps_per_s": 4.0, "train/tokens_per_s": 500.0,
     "train/real_token_fraction": 1.0},
    {"step": 10, "eval/perplexity": 3.0, "eval/bleu": 11.0, "test/bleu": 12.5},
  ]
  s = rt.run_summary(records)
  # Windows: 2 steps in 2 s (200 real of 400), 4 in 2 s (600 of 800), 4 in 1 s (500 of 500).
  assert s["real_tokens_per_s"] == pytest.approx((600 + 500) / 3)
  assert s["real_fraction"] == pytest.approx(1300 / 1700)
  assert s["to_first_step_s"] == 40.0 and s["compile_s"] == 9.5
  assert s["first_window_step_s"] == pytest.approx(1.0)
  assert s["later_step_s"] == pytest.approx(3 / 8)
  assert s["test_bleu"] == 12.5 and s["batch_shapes"] == "[(32, 64, 42)]"
  with pytest.raises(RuntimeError, match="1 log windows"):
    rt.run_summary(records[:1] + records[3:])
  with pytest.raises(RuntimeError, match="startup/seconds"):
    rt.run_summary([{k: v for k, v in r.items() if not k.startswith("startup/")}
                    for r in records])


def run_command(tmp_path, *args, timeout=900):
  cmd = [sys.executable, "-m", "benchmarks.real_tokens", f"--workdir={tmp_path / 'w'}",
         f"--out={tmp_path / 'report'}", *args]
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                        env=dict(os.environ, XLA_FLAGS=FAST_COMPILE))


def test_a_missing_catalogue_directory_is_one_line_and_exit_2(tmp_path):
  proc = run_command(tmp_path, f"--catalogues={tmp_path / 'none'}", timeout=300)
  assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
  errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
  assert errors == [proc.stderr.strip().splitlines()[-1]], proc.stderr[-3000:]
  assert errors[0].startswith(f"error: --catalogues={tmp_path / 'none'}: no message catalogues")
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "w").exists() and not (tmp_path / "report.md").exists()


def write_catalogues(directory, n):
  """`n` distinct short English -> German messages in two catalogues."""
  verbs = [("open", "öffnen"), ("save", "speichern"), ("delete", "löschen"), ("copy", "kopieren"),
           ("move", "verschieben"), ("read", "lesen"), ("print", "drucken"), ("find", "finden"),
           ("close", "schließen"), ("rename", "umbenennen")]
  nouns = [("file", "die Datei"), ("folder", "den Ordner"), ("window", "das Fenster"),
           ("document", "das Dokument"), ("image", "das Bild"), ("archive", "das Archiv"),
           ("message", "die Nachricht"), ("list", "die Liste"), ("table", "die Tabelle"),
           ("page", "die Seite")]
  forms = [("Cannot {v} the {n}", "Kann {n} nicht {v}"), ("Do you want to {v} the {n}?",
                                                          "Wollen Sie {n} {v}?"),
           ("Failed to {v} the {n}", "Konnte {n} nicht {v}")]
  messages = [(e.format(v=ve, n=ne), d.format(v=vd, n=nd))
              for e, d in forms for ve, vd in verbs for ne, nd in nouns][:n]
  os.makedirs(directory)
  write_mo(directory / "one.mo", dict(messages[: n // 2]))
  write_mo(directory / "two.mo", dict(messages[n // 2:]))


TINY = ["model.num_layers=1", "model.d_model=32", "model.d_ff=64", "model.num_heads=4",
        "data.tokens_per_batch=256", "data.eval_batch_size=64",
        "evals.valid_translation.sentences=8", "decode.max_extra_len=5", "decode.beam_size=2"]


@pytest.mark.slow
def test_the_command_trains_both_layouts_and_reports_them(tmp_path):
  write_catalogues(tmp_path / "mo", 300)
  proc = run_command(tmp_path, f"--catalogues={tmp_path / 'mo'}", "--corpora=messages",
                     "--steps=4", "--log_every=2", "--rounds=1", "--max_pairs=300",
                     "--messages.data.heldout_pairs=20", "--messages.data.vocab_size=90",
                     *[f"--messages.{t}" for t in TINY])
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  out = json.loads((tmp_path / "report.json").read_text())
  assert out["messages"]["pairs"] == 300 and out["messages"]["catalogues"] == 2
  runs = out["runs"]["messages"]
  assert [r["layout"] for r in runs["buckets"]] == ["bucketed"]
  assert [r["layout"] for r in runs["default"]] == ["packed"]
  for run in runs["buckets"] + runs["default"]:
    assert 0 < run["real_fraction"] <= 1 and run["real_tokens_per_s"] > 0
    assert 0 < run["compile_s"] < run["to_first_step_s"] < run["wall_s"]
    assert 0 <= run["test_bleu"] <= 100 and run["round"] == 1
  assert out["summary"]["messages"]["ratio_real_tokens_per_s"] > 0
  md = (tmp_path / "report.md").read_text()
  assert "| messages | buckets (bucketed) |" in md and "| messages | default (packed) |" in md
  assert "**default / buckets**" in md and out["messages"]["files"]["en"]["sha256"] in md
