"""Translating a whole file: `--mode=translate` against CTranslate2 on the same exported model.

What a user would otherwise do with a trained workdir is export it (`--mode=export
--format=ctranslate2`) and run CTranslate2's `translate_file` over the corpus. Both translate
the same file of `--lines` sentences into a file, in one process, alternating round by round
(best of `--rounds`), at beam 4 and greedy: ours through `files.translate_corpus` (reading in
chunks, tokenizing, sorting, batching over the mesh, writing), CTranslate2 with the same
SentencePiece model, float32 and the same threads, under each of its batchings in
`--ct2_batches` (sentences or tokens per batch, CTranslate2's `batch_type`); the ratio is
against the fastest of them. The first run of ours (compiling one program per padded length)
is reported apart. The fraction of identical output lines says how alike the searches are
(their length penalties differ: docs/decoding.md).

    python -m benchmarks.corpus_translation --workdir=runs/numbers

Without `--input`, the file is `--lines` (default 20,000) English sources of the numbers
corpus's test split (the default task's model); with it, any text file the workdir's model
translates, whole, or its first `--lines` lines, read again from its start when it has fewer.
`--decode=batch_size=256,tokens_per_batch=16384` sets decoding fields of ours; `--lockstep`
also times ours in lockstep batches (`decode.in_flight=False`, the same other fields) in the
same rounds, for the gain of in-flight batching and a check that both write the same lines.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from transformer import infer
from transformer import workdir as workdir_lib
from transformer.decoding import files
from transformer.errors import UserError

SEARCHES = {"beam 4": {"method": "beam", "beam_size": 4}, "greedy": {"method": "greedy"}}
# CTranslate2's batchings: our sentences per batch, its fastest on the default model (a sweep
# of 32 to 2,048 sentences and 512 to 16,384 tokens), and its token budget.
CT2_BATCHES = (("examples", 64), ("examples", 512), ("tokens", 16384))


def parse_batches(text: str) -> tuple[tuple[str, int], ...]:
  """'examples:64,tokens:16384' -> (('examples', 64), ('tokens', 16384)).

  Raises:
    ValueError: an entry not of the form examples:N or tokens:N with N >= 1.
  """
  out = []
  for entry in text.split(","):
    kind, _, size = entry.strip().partition(":")
    if kind not in ("examples", "tokens") or not size.isdigit() or int(size) < 1:
      raise ValueError(f"{entry!r} is not examples:N or tokens:N")
    out.append((kind, int(size)))
  return tuple(out)


def write_numbers_input(path: str, lines: int) -> None:
  """`lines` English sources of the numbers corpus's test split, one per line."""
  from transformer.data import numbers as nb

  with open(path, "w") as f:
    f.writelines(source + "\n" for source, _ in nb.generate("test", lines))


def ours(model: Any, config: Any, input_path: str, output_path: str) -> float:
  """Seconds to translate `input_path` into `output_path` with `files.translate_corpus`."""
  if os.path.exists(output_path):
    os.remove(output_path)
  start = time.perf_counter()
  files.translate_corpus(files.CorpusRun(model, input_path, output_path, {"run": "bench"}),
                          config, 1, "text")
  return time.perf_counter() - start


def ctranslate2_file(model_dir: str, spm_path: str, input_path: str, output_path: str, *,
                     beam_size: int, alpha: float, batch: tuple[str, int], max_len: int,
                     threads: int) -> float:
  """Seconds for CTranslate2's `translate_file` (loading the model excluded); `batch` is
  (batch_type, max_batch_size)."""
  import ctranslate2
  import sentencepiece

  sp = sentencepiece.SentencePieceProcessor(model_file=spm_path)
  translator = ctranslate2.Translator(model_dir, device="cpu", compute_type="float32",
                                     inter_threads=1, intra_threads=threads)
  start = time.perf_counter()
  translator.translate_file(
    input_path, output_path, max_batch_size=batch[1], batch_type=batch[0],
    beam_size=beam_size, length_penalty=alpha, min_decoding_length=0,
    max_decoding_length=max_len,
    source_tokenize_fn=lambda line: sp.encode(line.strip(), out_type=str),
    target_detokenize_fn=lambda pieces: sp.decode(pieces))
  return time.perf_counter() - start


def same_lines(a: str, b: str) -> float:
  with open(a) as f, open(b) as g:
    x, y = f.read().splitlines(), g.read().splitlines()
  return sum(p == q for p, q in zip(x, y, strict=True)) / max(len(x), 1)


def batch_name(batch: tuple[str, int]) -> str:
  return f"{batch[1]} {'sentences' if batch[0] == 'examples' else 'tokens'}"


def write_lines_of(source: str, path: str, lines: int) -> None:
  """The first `lines` lines of the text file `source` into `path`, reading `source` again
  from its start as often as it takes.

  Raises:
    UserError: `source` holds no line.
  """
  with open(source) as f:
    text = [line.rstrip("\n") + "\n" for line in f]
  if not text:
    raise UserError(f"--input={source}: the file is empty")
  with open(path, "w") as f:
    f.writelines(text[i % len(text)] for i in range(lines))


def parse_decode(text: str) -> dict[str, Any]:
  """'batch_size=256,in_flight=False' -> {'batch_size': 256, 'in_flight': False} (ints and
  True/False; anything else stays text).

  Raises:
    ValueError: an entry not of the form FIELD=VALUE.
  """
  out: dict[str, Any] = {}
  for entry in filter(None, (e.strip() for e in text.split(","))):
    field, eq, value = entry.partition("=")
    if not eq or not field:
      raise ValueError(f"{entry!r} is not FIELD=VALUE")
    out[field] = (int(value) if value.lstrip("-").isdigit() else
                  {"True": True, "False": False}.get(value, value))
  return out


def run_benchmark(workdir: str, input_path: str | None, lines: int | None, rounds: int,
                  threads: int, searches: dict[str, dict[str, Any]] = SEARCHES,
                  ct2_batches: tuple[tuple[str, int], ...] = CT2_BATCHES,
                  decode: dict[str, Any] | None = None, lockstep: bool = False
                  ) -> dict[str, Any]:
  """Times both over the same file per search (ours with the `decode` fields set, and with
  `lockstep` in lockstep batches too); returns the record for the report."""
  from transformer.interop import export

  if workdir_lib.load(workdir) is None:
    raise UserError(f"--workdir={workdir}: no {workdir_lib.CONFIG}; train it first")
  scratch = tempfile.mkdtemp(prefix="corpus-bench-")
  try:
    source = input_path
    if input_path is None:
      input_path = os.path.join(scratch, "input.txt")
      write_numbers_input(input_path, 20000 if lines is None else lines)
    elif lines is not None:
      input_path = os.path.join(scratch, "input.txt")
      write_lines_of(source, input_path, lines)
    count = files.count_lines(input_path)
    import jax

    record: dict[str, Any] = {"lines": count, "rounds": rounds, "threads": threads,
                              "devices": jax.device_count(), "rows": [],
                              "input": source or "the numbers corpus's test split",
                              "decode": dict(decode or {})}
    exported = None

    def restored(fields):
      config = workdir_lib.load(workdir)
      with config.unlocked():
        for k, v in {**(decode or {}), **fields}.items():
          config.decode[k] = v
        config.decode.chunk_size = max(count, 1)
      return infer.restore(config, workdir), config

    for name, fields in searches.items():
      model, config = restored(fields)
      if exported is None:
        exported = export.export_restored(model, os.path.join(scratch, "ct2"))
      ours_out, ct2_out = (os.path.join(scratch, f"{who}.txt") for who in ("ours", "ct2"))
      first = ours(model, config, input_path, ours_out)
      times: dict[str, list[float]] = {"ours": [], **{batch_name(b): [] for b in ct2_batches}}
      if lockstep:
        steady, steady_config = restored({**fields, "in_flight": False})
        steady_out = os.path.join(scratch, "lockstep.txt")
        times["lockstep"] = []
        ours(steady, steady_config, input_path, steady_out)  # its programs compiled
      same = {}
      for _ in range(rounds):
        times["ours"].append(ours(model, config, input_path, ours_out))
        if lockstep:
          times["lockstep"].append(ours(steady, steady_config, input_path, steady_out))
          same["lockstep"] = same_lines(ours_out, steady_out)
        for batch in ct2_batches:
          times[batch_name(batch)].append(ctranslate2_file(
            exported, os.path.join(exported, export.SPM_NAME), input_path, ct2_out,
            beam_size=model.translator.search.beam_size if fields["method"] == "beam" else 1,
            alpha=model.translator.search.alpha, batch=batch, max_len=config.model.max_len,
            threads=threads))
          same[batch_name(batch)] = same_lines(ours_out, ct2_out)
      best = {k: min(v) for k, v in times.items()}
      fastest = min((batch_name(b) for b in ct2_batches), key=best.get)
      record["rows"].append({
        "search": name, "ours_first_s": first, "ours_s": best["ours"],
        "ours_sentences_per_s": count / best["ours"],
        "ct2": [{"batch": batch_name(b), "s": best[batch_name(b)],
                 "sentences_per_s": count / best[batch_name(b)], "same_lines": same[batch_name(b)]}
                for b in ct2_batches],
        "ct2_fastest": fastest, "ct2_s": best[fastest],
        "ct2_sentences_per_s": count / best[fastest],
        "ratio": best[fastest] / best["ours"], "same_lines": same[fastest], "times": times})
      if lockstep:
        record["rows"][-1]["lockstep"] = {"s": best["lockstep"],
                                          "sentences_per_s": count / best["lockstep"],
                                          "same_lines": same["lockstep"]}
    record["parameters"] = model.label
    record["workdir"] = workdir
    return record
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def report_lines(record: dict[str, Any]) -> list[str]:
  rows = ["| search | ours (sentences/s) | CTranslate2, fastest (sentences/s) | "
          "ours / CTranslate2 | ours, first run (s) | identical lines |",
          "|---|---:|---:|---:|---:|---:|"]
  for r in record["rows"]:
    rows.append(f"| {r['search']} | {r['ours_sentences_per_s']:.1f} | "
                f"{r['ct2_sentences_per_s']:.1f} ({r['ct2_fastest']}) | **{r['ratio']:.2f}x** | "
                f"{r['ours_first_s']:.1f} | {100 * r['same_lines']:.1f}% |")
  batchings = ["| search | CTranslate2 batching | sentences/s | ours / this |",
               "|---|---|---:|---:|"]
  for r in record["rows"]:
    for c in r["ct2"]:
      batchings.append(f"| {r['search']} | {c['batch']} per batch | {c['sentences_per_s']:.1f} | "
                       f"{r['ours_sentences_per_s'] / c['sentences_per_s']:.2f}x |")
  steady = ["| search | ours, lockstep batches (sentences/s) | in-flight / lockstep | "
            "identical lines |", "|---|---:|---:|---:|"]
  for r in record["rows"]:
    if "lockstep" in r:
      steady.append(f"| {r['search']} | {r['lockstep']['sentences_per_s']:.1f} | "
                    f"**{r['ours_sentences_per_s'] / r['lockstep']['sentences_per_s']:.2f}x** | "
                    f"{100 * r['lockstep']['same_lines']:.1f}% |")
  fields = ", ".join(f"{k}={v}" for k, v in record.get("decode", {}).items())
  return ["## Results\n",
          f"{record['lines']:,} lines of {record['input']}, "
          f"workdir {record['workdir']}, best of {record['rounds']} rounds, "
          f"{record['threads']} threads each (ours over {record['devices']} JAX "
          f"device(s): `transformer/cpu_devices.py`), parameters of {record['parameters']}"
          + (f"; ours with decode.{fields.replace(', ', ', decode.')}" if fields else "")
          + ".\n",
          "\n".join(rows) + "\n",
          "CTranslate2 under each batching (`--ct2_batches`):\n",
          "\n".join(batchings) + "\n"] + (
    ["Ours in lockstep batches (`--lockstep`, `decode.in_flight=False`), in the same rounds:\n",
     "\n".join(steady) + "\n"] if len(steady) > 2 else [])


if __name__ == "__main__":
  from absl import app, flags

  from measuring import report
  from transformer.errors import fail, flags_parser

  _WORKDIR = flags.DEFINE_string("workdir", "runs/numbers", "A trained workdir.")
  _INPUT = flags.DEFINE_string("input", None, "A file to translate (default: --lines "
                               "numbers sentences).")
  _LINES = flags.DEFINE_integer("lines", None, "Sentences to translate: of the generated "
                                "input (default 20,000), or the first of --input's (default: "
                                "all), read again from its start when it has fewer.",
                                lower_bound=1)
  _ROUNDS = flags.DEFINE_integer("rounds", 2, "Timed rounds of each (the best counts).")
  _THREADS = flags.DEFINE_integer("threads", os.cpu_count() or 1, "CTranslate2's threads.")
  _OUT = flags.DEFINE_string("out", "benchmarks/results/corpus_translation",
                             "Report path without extension (.md and .json are written).")
  _SECTION = flags.DEFINE_string("section", None, "The report's section this run writes (a "
                                 "model or CPU kind), keeping the others; default: the whole "
                                 "report.")
  _CT2_BATCHES = flags.DEFINE_string(
    "ct2_batches", ",".join(f"{k}:{n}" for k, n in CT2_BATCHES),
    "CTranslate2's batchings, batch_type:max_batch_size (examples or tokens); the ratio is "
    "against the fastest.")
  _CPU_DEVICES = flags.DEFINE_integer("cpu_devices", None, "JAX CPU devices of ours (default: "
                                      "what --mode=translate takes, cpu_devices.py).")
  _DECODE = flags.DEFINE_string("decode", "", "Decoding fields of ours, FIELD=VALUE,... (e.g. "
                                "batch_size=256,tokens_per_batch=16384).")
  _LOCKSTEP = flags.DEFINE_bool("lockstep", False, "Also time ours in lockstep batches "
                                "(decode.in_flight=False) in the same rounds.")

  def main(argv: list[str]) -> None:
    del argv
    from transformer import cpu_devices

    try:
      try:
        ct2_batches = parse_batches(_CT2_BATCHES.value)
      except ValueError as e:
        raise UserError(f"--ct2_batches: {e}") from None
      try:
        decode = parse_decode(_DECODE.value)
      except ValueError as e:
        raise UserError(f"--decode: {e}") from None
      config = workdir_lib.load(_WORKDIR.value)
      if config is None:
        raise UserError(f"--workdir={_WORKDIR.value}: no {workdir_lib.CONFIG}; train it first")
      unknown = sorted(set(decode) - set(config.decode))
      if unknown:
        raise UserError(f"--decode: no such field decode.{unknown[0]}")
      cpu_devices.use(_CPU_DEVICES.value, config, translating=True)
      record = run_benchmark(_WORKDIR.value, _INPUT.value, _LINES.value, _ROUNDS.value,
                             _THREADS.value, ct2_batches=ct2_batches, decode=decode,
                             lockstep=_LOCKSTEP.value)
    except UserError as e:
      fail(str(e))
    report.write(_OUT.value, "Translating a corpus: ours against CTranslate2",
                 __doc__.split("\n\n")[1], report.public_command(report.command_line()),
                 report_lines(record), record, section=_SECTION.value)
    print("\n".join(report_lines(record)))

  app.run(main, flags_parser=flags_parser())
