"""The main program's commands, run by the data experiments (back-translation, distillation) as
a user would run them, each recorded for the report.

Each step is one `python -m transformer.main ...` command line in a child process; a training
run whose workdir finished is not run again, and a translation whose output exists is kept, so
an experiment interrupted at any point goes on where it stopped. The numbers corpus's files
(transformer/data/numbers.py) give the experiments a real pair corpus and monolingual text
offline.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Commands:
  """Runs the main program's commands and keeps each command line (`lines`) and its seconds
  (`seconds`, by label) for the report."""

  def __init__(self, log: Callable[[str], None] = print):
    self.log = log
    self.lines: list[str] = []
    self.seconds: dict[str, float] = {}

  def run(self, label: str, args: Sequence[str], done: bool = False) -> None:
    """`python -m transformer.main ARGS` (unless `done`), recorded under `label`."""
    self.lines.append(f"# {label}\npython -m transformer.main " + " ".join(
      shlex.quote(a) for a in args))
    if done:
      self.log(f"[{label}] done before, kept")
      return
    self.log(f"[{label}] running")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "transformer.main", *args], cwd=REPO,
                          capture_output=True, text=True)
    self.seconds[label] = time.time() - t0
    if proc.returncode != 0:
      raise RuntimeError(f"{label} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    self.log(f"[{label}] {self.seconds[label]:.0f} s")

  def train(self, label: str, workdir: str, args: Sequence[str]) -> None:
    """A training run (skipped when its workdir has finished: its test metrics are written)."""
    self.run(label, [*args, f"--workdir={workdir}"], done=final_metrics(workdir) is not None)

  def translate(self, label: str, workdir: str, source: str, output: str,
                args: Sequence[str] = ()) -> None:
    """`--mode=translate` of a file (skipped when the output exists: translate writes it
    whole, at the end)."""
    self.run(label, ["--mode=translate", f"--workdir={workdir}", f"--input={source}",
                     f"--output={output}", *args], done=os.path.exists(output))


def final_metrics(workdir: str) -> dict[str, Any] | None:
  """The metrics record of a finished run's final evaluation (the one with test/bleu), or
  None."""
  from transformer.metrics import read_metrics

  finals = [r for r in read_metrics(workdir) if "test/bleu" in r]
  return finals[-1] if finals else None


def test_translations(workdir: str) -> list[str]:
  """The translations of the test split by a finished run's final evaluation."""
  from transformer.training.evaluators import translations_path

  step = final_metrics(workdir)["step"]
  return translations_path(workdir, "test", step).read_text(encoding="utf-8").splitlines()


def write_lines(path: str, lines: Sequence[str]) -> str:
  """`lines` into `path` (kept if it exists with the same lines); returns `path`."""
  text = "".join(line + "\n" for line in lines)
  if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
  return path


def numbers_split(split: str, languages: Sequence[str] = ("en", "de"),
                  variant: str = "default") -> dict[str, list[str]]:
  """A split of the numbers corpus as its files hold it: language -> lines."""
  from transformer.data import numbers
  from transformer.data.tfds_io import data_dir_of

  files = numbers.write_corpus(data_dir_of({}), variant, tuple(languages))
  return {lang: open(files[split][lang], encoding="utf-8").read().splitlines()
          for lang in languages}


def numbers_files(data: str, splits: dict[str, dict[str, list[str]]], train_name: str,
                  pairs: int) -> dict[str, str]:
  """The experiment's corpus files in `data`: the first `pairs` training pairs as
  `{train_name}.{en,de}`, and the validation and test splits whole as `valid.*` and `test.*`.
  Returns 'train.en', 'valid.de', ... -> path (the keys `text_args` reads)."""
  files = {f"train.{lang}": write_lines(os.path.join(data, f"{train_name}.{lang}"),
                                        splits["train"][lang][:pairs]) for lang in ("en", "de")}
  for name, split in (("valid", "validation"), ("test", "test")):
    for lang in ("en", "de"):
      files[f"{name}.{lang}"] = write_lines(os.path.join(data, f"{name}.{lang}"),
                                            splits[split][lang])
  return files


def text_args(config: str, src: str, tgt: str, files: dict[str, str], steps: int,
              vocab_size: int) -> list[str]:
  """The flags of a configs/text.py-style run on `numbers_files`' files."""
  return [f"--config={config}",
          f"--config.data.train_files.{src}={files['train.' + src]}",
          f"--config.data.train_files.{tgt}={files['train.' + tgt]}",
          f"--config.data.eval_files.{src}={files['valid.' + src]}",
          f"--config.data.eval_files.{tgt}={files['valid.' + tgt]}",
          f"--config.data.test_files.{src}={files['test.' + src]}",
          f"--config.data.test_files.{tgt}={files['test.' + tgt]}",
          f"--config.data.vocab_size={vocab_size}", f"--config.num_train_steps={steps}"]
