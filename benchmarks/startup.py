"""Start-up and compiling of `--mode=translate`: where the seconds of one sentence and of a file
go, from a cold and from a warm compilation cache, against CTranslate2's whole process.

Each measurement is a fresh process, as a user's command is:

- `whole`: `python -m transformer.main --mode=translate --workdir=W` on one sentence from
  standard input, and on a file of `--lines` sentences (`--input`, `--output`), wall time of
  the process;
- `parts`: the same steps in a child process of this benchmark, timed one by one: importing the
  modules translation needs, restoring the parameters (`infer.restore`, or the parameters a
  former process kept: `parameter_cache`), getting every program the input needs (tracing and
  compiling them, or loading them: `compilation.Executables` and the persistent cache; the
  first search over the input less the second), then the search over the whole input with its
  programs ready (the second);
- `ctranslate2`: a process that imports CTranslate2 and SentencePiece, loads the exported model
  (`--mode=export --format=ctranslate2`) and translates the same input (`translate_file`, the
  same beam, float32, the same threads); a file under each of the corpus benchmark's
  batchings (`--ct2_batches`, default `corpus_translation.CT2_BATCHES`), the fastest counting.

Cold: an empty compilation cache directory (`--config.compilation_cache_dir`); warm: the same
directory again, as the user's next command finds it. With `--baseline=DIR`, another checkout
of the project (an earlier commit in a `git worktree`) runs the same whole processes in the
same run, for a before-and-after ratio.

    python -m benchmarks.startup --workdir=runs/numbers [--lines=20000] [--baseline=/tmp/old]

The file is `--lines` sentences of the numbers corpus's test split, or of `--input` (its first
`--lines`, read again from its start when it has fewer: `corpus_translation.write_lines_of`);
the one sentence is the file's first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _timed(cmd: list[str], stdin: str | None = None, repo: str = REPO) -> tuple[float, str]:
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=repo, input=stdin, capture_output=True, text=True)
  seconds = time.perf_counter() - t0
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr[-3000:]}")
  return seconds, proc.stdout


def whole(workdir: str, cache: str, input_path: str | None, output: str | None,
          repo: str = REPO, *, sentence: str) -> tuple[float, str]:
  """Seconds and output text of one `--mode=translate` process (`sentence` from stdin when
  no input; else the file `input_path` into `output`) of the checkout `repo`."""
  cmd = [sys.executable, "-m", "transformer.main", "--mode=translate",
         f"--workdir={os.path.abspath(workdir)}", f"--config.compilation_cache_dir={cache}"]
  if input_path is None:
    return _timed(cmd, sentence + "\n", repo)
  if os.path.exists(output):
    os.remove(output)
  seconds, _ = _timed([*cmd, f"--input={input_path}", f"--output={output}"], repo=repo)
  with open(output) as f:
    return seconds, f.read()


def kept_programs(cache: str) -> int:
  """The compiled programs the processes on the compilation cache `cache` kept
  (`compilation.Executables`): one per program a translation needed."""
  from transformer.compilation import EXECUTABLES_DIR

  path = os.path.join(cache, EXECUTABLES_DIR)
  return len(os.listdir(path)) if os.path.isdir(path) else 0


def parts(workdir: str, cache: str, input_path: str) -> dict[str, float]:
  """The steps of translation of the file `input_path` timed one by one in a child process
  (`probe`)."""
  _, out = _timed([sys.executable, "-m", "benchmarks.startup", "--probe", workdir, cache,
                   input_path])
  return json.loads(out.strip().splitlines()[-1])


def probe(workdir: str, cache: str, input_path: str) -> None:
  """In a fresh process: prints the JSON seconds of imports, restore, first and second search."""
  t0 = time.perf_counter()
  from transformer import cpu_devices, infer
  from transformer import workdir as workdir_lib
  from transformer.data.mixture import SourceEncoder, tags

  t1 = time.perf_counter()
  config = workdir_lib.load(workdir)
  with config.unlocked():
    config.compilation_cache_dir = cache
  cpu_devices.use(None, config, translating=True)  # the devices --mode=translate takes
  model = infer.restore(config, workdir)
  t2 = time.perf_counter()
  lines = open(input_path).read().splitlines()
  encoder = SourceEncoder(model.tokenizer, tags(config), config.decode.get("tag", ""))
  sources = [encoder.encode(line) for line in lines]
  # The search twice: the first gets every program the input needs (traced and compiled, or
  # loaded) as it goes, the second has them all; the programs' time is the difference.
  translator = model.translator
  translator.search_ids(model.params, sources)
  t3 = time.perf_counter()
  translator.search_ids(model.params, sources)
  t4 = time.perf_counter()
  print(json.dumps({"imports": t1 - t0, "restore": t2 - t1, "programs": (t3 - t2) - (t4 - t3),
                    "search": t4 - t3,
                    "lengths": len({translator.pad_length(len(s)) for s in sources})}))


def ctranslate2_process(model_dir: str, input_path: str | None, beam: int, threads: int,
                        max_len: int, batch: tuple[str, int], sentence: str) -> float:
  """Seconds of a process that loads CTranslate2 and the model and translates the input
  (`sentence` from stdin when none), `batch` = (batch_type, max_batch_size)."""
  from transformer.interop.export import SPM_NAME

  spm = os.path.join(model_dir, SPM_NAME)
  script = (
    "import sys, ctranslate2, sentencepiece\n"
    f"sp = sentencepiece.SentencePieceProcessor(model_file={spm!r})\n"
    f"t = ctranslate2.Translator({model_dir!r}, device='cpu', compute_type='float32', "
    f"inter_threads=1, intra_threads={threads})\n"
    "kw = dict(beam_size=%d, max_decoding_length=%d, max_batch_size=%d, batch_type=%r)\n"
    % (beam, max_len, batch[1], batch[0])
    + ("lines = [sys.stdin.readline().strip()]\n"
       "out = t.translate_batch([sp.encode(x, out_type=str) for x in lines], **kw)\n"
       "print(sp.decode(out[0].hypotheses[0]))\n" if input_path is None else
       f"t.translate_file({input_path!r}, {input_path + '.ct2'!r}, "
       "source_tokenize_fn=lambda s: sp.encode(s.strip(), out_type=str), "
       "target_detokenize_fn=lambda p: sp.decode(p), **kw)\n"))
  return _timed([sys.executable, "-c", script], sentence + "\n")[0]


def run(workdir: str, lines: int, threads: int, baseline: str | None = None,
        input_path: str | None = None,
        ct2_batches: tuple[tuple[str, int], ...] | None = None) -> dict[str, Any]:
  from benchmarks.corpus_translation import (
    CT2_BATCHES,
    batch_name,
    write_lines_of,
    write_numbers_input,
  )
  from transformer import infer
  from transformer import workdir as workdir_lib
  from transformer.interop import export

  scratch = tempfile.mkdtemp(prefix="startup-bench-")
  try:
    corpus = os.path.join(scratch, "input.txt")
    if input_path is None:
      write_numbers_input(corpus, lines)
    else:
      write_lines_of(input_path, corpus, lines)
    with open(corpus) as f:
      sentence = f.readline().strip()
    one = os.path.join(scratch, "one.txt")
    with open(one, "w") as f:
      f.write(sentence + "\n")
    config = workdir_lib.load(workdir)
    model = infer.restore(config, workdir)
    ct2 = export.export_restored(model, os.path.join(scratch, "ct2"))
    beam = model.translator.search.beams()
    all_batches = ct2_batches or CT2_BATCHES
    rows = []
    for name, path in (("one sentence", None), (f"{lines:,} lines", corpus)):
      cache = os.path.join(scratch, f"cache-{len(rows)}")
      row = {"input": name}
      outputs = set()
      for state in ("cold", "warm"):
        row[f"whole {state}"], text = whole(workdir, cache, path, os.path.join(scratch, "out"),
                                            sentence=sentence)
        outputs.add(text)
      if baseline:
        for state in ("cold", "warm"):
          row[f"baseline {state}"], text = whole(workdir, cache + "-baseline", path,
                                                 os.path.join(scratch, "out"), repo=baseline,
                                                 sentence=sentence)
          outputs.add(text)
      # Every process of both checkouts, cold and warm, wrote the same bytes.
      row["same output"] = len(outputs) == 1
      row["programs"] = kept_programs(cache)
      if baseline:
        row["baseline programs"] = kept_programs(cache + "-baseline")
      parts_cache = os.path.join(scratch, f"parts-{len(rows)}")
      for state in ("cold", "warm"):
        row[f"parts {state}"] = parts(workdir, parts_cache, path or one)
      # One sentence is one batch under any batching.
      batches = all_batches[:1] if path is None else all_batches
      row["ctranslate2 by batch"] = {
        batch_name(b): ctranslate2_process(ct2, path, beam, threads, config.model.max_len, b,
                                           sentence)
        for b in batches}
      row["ctranslate2"] = min(row["ctranslate2 by batch"].values())
      rows.append(row)
    return {"workdir": workdir, "parameters": model.label, "beam": beam, "lines": lines,
            "input": input_path or "the numbers corpus's test split", "sentence": sentence,
            "threads": threads, "rows": rows, "baseline": baseline}
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def report_lines(record: dict[str, Any]) -> list[str]:
  head = ["| input | cache | whole process (s) | imports | restore | programs (trace + "
          "compile, or load) | search | CTranslate2 process (s) | ours / CTranslate2 |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  count = record["rows"][-1]["parts cold"]["lengths"]
  for r in record["rows"]:
    for state in ("cold", "warm"):
      p = r[f"parts {state}"]
      # The first search less the second: loading kept programs takes less than the searches'
      # noise, which can make the difference negative.
      programs = (f"{p['programs']:.2f}" if p["programs"] >= 0
                  else f"~0 ({p['programs']:.2f}: the searches' noise)")
      head.append(f"| {r['input']} | {state} | {r[f'whole {state}']:.2f} | {p['imports']:.2f} | "
                  f"{p['restore']:.2f} | {programs} | {p['search']:.2f} | "
                  f"{r['ctranslate2']:.2f} | {r['ctranslate2'] / r[f'whole {state}']:.2f}x |")
  return ["## Results\n",
          f"Model: {record['workdir']} ({record['parameters']}), beam {record['beam']}; the file: "
          f"{record['lines']:,} lines of {record['input']}, the one "
          f"sentence its first ({record['sentence']!r}); "
          f"CTranslate2 float32, {record['threads']} threads. Seconds; the parts come from a "
          "second process of each kind (its own cold or warm cache), so they add up to about, "
          "not exactly, the whole process's time (which also reads the input, tokenizes and "
          "writes). ours / CTranslate2 is the ratio of sentences per second of the whole "
          f"processes (above 1: ours is faster); CTranslate2's is its fastest batching "
          f"({ct2_batches(record)}). The file's sources have {count} padded lengths (a pool "
          "program for each length of more sentences than a batch, lockstep batches for the "
          "rest).\n",
          "\n".join(head) + "\n"] + baseline_lines(record)


def ct2_batches(record: dict[str, Any]) -> str:
  """The file's CTranslate2 processes by batching, e.g. '64 sentences 31.2 s, ...'."""
  by_batch = record["rows"][-1].get("ctranslate2 by batch", {})
  return ", ".join(f"{name} per batch {secs:.1f} s" for name, secs in by_batch.items())


def baseline_lines(record: dict[str, Any]) -> list[str]:
  """Before and after: the whole processes of the baseline checkout against this one's."""
  if not record.get("baseline"):
    return []
  rows = ["| input | cache | baseline (s) | this checkout (s) | speed-up | the same output "
          "| programs, baseline -> this checkout |", "|---|---|---:|---:|---:|---|---|"]
  for r in record["rows"]:
    for state in ("cold", "warm"):
      before, after = r[f"baseline {state}"], r[f"whole {state}"]
      same = {True: "yes", False: "**no**", None: "not compared"}[r.get("same output")]
      programs = (f"{r['baseline programs']} -> {r['programs']}" if "programs" in r
                  else "not counted")
      rows.append(f"| {r['input']} | {state} | {before:.2f} | {after:.2f} | "
                  f"{before / after:.2f}x | {same} | {programs} |")
  return ["Against the baseline checkout (`--baseline`), the same whole processes in the same "
          "run; the same output: every process of both checkouts, cold and warm, wrote the "
          "same bytes; programs: those the file's processes compiled and kept "
          "(`compilation.Executables`):\n", "\n".join(rows) + "\n"]


if __name__ == "__main__":
  if len(sys.argv) == 5 and sys.argv[1] == "--probe":
    probe(*sys.argv[2:])
    sys.exit(0)
  from absl import app, flags

  from measuring import report
  from transformer.errors import UserError, fail, flags_parser

  _WORKDIR = flags.DEFINE_string("workdir", "runs/numbers", "A trained workdir.")
  _LINES = flags.DEFINE_integer("lines", 20000, "Sentences of the file.", lower_bound=1)
  _INPUT = flags.DEFINE_string("input", None, "The file's sentences (default: the numbers "
                               "corpus's test split).")
  _THREADS = flags.DEFINE_integer("threads", os.cpu_count() or 1, "CTranslate2's threads.")
  _BASELINE = flags.DEFINE_string("baseline", None, "Another checkout (e.g. a git worktree of "
                                  "an earlier commit) timed the same way, for a before-and-after "
                                  "ratio.")
  _OUT = flags.DEFINE_string("out", "benchmarks/results/startup",
                             "Report path without extension (.md and .json are written).")
  _CT2_BATCHES = flags.DEFINE_string(
    "ct2_batches", None, "CTranslate2's batchings of the file, batch_type:max_batch_size "
    "(default: the corpus benchmark's); the fastest counts, one sentence takes the first.")
  _SECTION = flags.DEFINE_string("section", None, "The report's section this run writes (a "
                                 "model or CPU kind), keeping the others; default: the whole "
                                 "report.")

  def main(argv: list[str]) -> None:
    del argv
    from benchmarks.corpus_translation import parse_batches

    try:
      try:
        batches = parse_batches(_CT2_BATCHES.value) if _CT2_BATCHES.value else None
      except ValueError as e:
        raise UserError(f"--ct2_batches: {e}") from None
      record = run(_WORKDIR.value, _LINES.value, _THREADS.value, _BASELINE.value, _INPUT.value,
                   batches)
    except UserError as e:
      fail(str(e))
    report.write(_OUT.value, "Start-up and compiling of translation, against CTranslate2",
                 __doc__.split("\n\n")[1], report.public_command(report.command_line()),
                 report_lines(record), record, section=_SECTION.value)
    print("\n".join(report_lines(record)))

  app.run(main, flags_parser=flags_parser())
