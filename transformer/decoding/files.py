"""Translating and scoring whole corpora: `--mode=translate` and `--mode=score`.

The input (a file, or standard input) is read `decode.chunk_size` lines at a time, never whole;
the translator sorts each chunk by length and cuts it into token-budget batches over every
device of the mesh (`translate.Translator`); the outputs are written in input order, chunk by
chunk. A progress line (sentences/s, ETA when the input is a file) goes to stderr.

With `--output=FILE` the run writes `FILE.partial` and, after every chunk, the number of input
lines done to `FILE.partial.json`; a run interrupted at any moment (`kill -9` included),
started again with the same command, continues after the last finished chunk and ends with the
same file as an uninterrupted run; at the end `FILE.partial` becomes `FILE`
(`ResumableOutput`). An existing FILE is never overwritten.

Documented behaviour for awkward input:
  - an empty (or all-whitespace) line gives an empty output (no hypotheses in jsonl);
  - a line that is not valid UTF-8 is read with the bad bytes replaced by U+FFFD, and a warning
    naming the line number goes to stderr;
  - a line longer than the model allows (model.max_len - decode.max_extra_len tokens; in score
    mode model.max_len a side) is truncated to that many tokens, EOS kept, with a warning
    naming the line number.

Output formats (`--output_format`):
  - `text`: one line per input line; with `--nbest=N` > 1, N lines per input line, its
    hypotheses best first (samples in draw order), empty lines filling up to N.
  - `jsonl`: one JSON object per input line, `{"source": ..., "hypotheses": [{"text": ...,
    "score": ..., "logprob": ...}, ...]}`: `score` is the search's length-normalised score,
    `logprob` the sum of the tokens' natural-log probabilities, EOS included.
Score mode reads `source<TAB>target` lines and writes `{"logprob": ..., "tokens": ...,
"perplexity": ...}` per pair: the target's log probability given the source (natural log,
summed over its tokens with EOS), its token count with EOS, and exp(-logprob / tokens).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import jax
import numpy as np

from transformer import storage
from transformer.data.mixture import SourceEncoder, tags
from transformer.data.tokenizer import TARGET, truncate
from transformer.decoding.translate import Hypothesis
from transformer.errors import UserError
from transformer.metrics import format_duration

FORMATS = ("text", "jsonl")


def check_request(mode: str, nbest: int, output_format: str, search: Any,
                  input_path: str | None, output_path: str | None) -> None:
  """Checks the flags of a corpus run before anything is restored or written."""
  if output_format not in FORMATS:
    raise UserError(f"--output_format={output_format}: must be one of {', '.join(FORMATS)}")
  if nbest < 1:
    raise UserError(f"--nbest={nbest}: must be >= 1")
  if mode == "translate":
    most = search.max_hypotheses()
    if most and nbest > most:
      raise UserError(
        f"--nbest={nbest}: must be <= decode.beam_size={search.beam_size} with "
        f"decode.method={search.method!r}" if search.method == "beam" else
        f"--nbest={nbest}: must be <= decode.mbr_candidates={search.mbr_candidates} with "
        "decode.method='mbr'" if search.method == "mbr" else
        f"--nbest={nbest}: decode.method='greedy' finds one hypothesis; use "
        "decode.method='beam' or 'sample' for more")
  if mode == "score" and input_path is None:
    raise UserError("--mode=score needs --input=FILE of source<TAB>target lines")
  if input_path is not None and not os.path.isfile(input_path):
    raise UserError(f"--input={input_path}: no such file")
  if output_path is not None:
    if storage.is_remote(output_path):
      raise UserError(f"--output={output_path}: must be a local file")
    if os.path.exists(output_path) and not os.path.exists(output_path + ".partial.json"):
      # (With the state beside it, a run stopped while renaming: `ResumableOutput` checks.)
      raise UserError(f"--output={output_path} exists: remove it or choose another file "
                      "(it is never overwritten)")
    parent = os.path.dirname(os.path.abspath(output_path))
    if not os.path.isdir(parent):
      raise UserError(f"--output={output_path}: no such directory {parent}")


def check_score_input(input_path: str) -> int:
  """Reads the whole TSV once (streaming) before any work: every line needs a tab and a
  non-empty target. Returns the number of lines."""
  count = 0
  with open(input_path, "rb") as f:
    for count, raw in enumerate(f, start=1):  # noqa: B007 - the count is the result
      text = _strip_newline(raw).decode("utf-8", errors="replace")
      if "\t" not in text:
        raise UserError(f"--input={input_path}: line {count} has no tab; score mode reads "
                        "source<TAB>target lines")
      if not text.split("\t", 1)[1].strip():
        raise UserError(f"--input={input_path}: line {count} has an empty target")
  return count


def count_lines(path: str) -> int:
  """Lines of a file, read in blocks (for the ETA)."""
  count, last = 0, b"\n"
  with open(path, "rb") as f:
    while block := f.read(1 << 20):
      count += block.count(b"\n")
      last = block[-1:]
  return count + (last != b"\n")


def _strip_newline(raw: bytes) -> bytes:
  return raw[:-1] if raw.endswith(b"\n") else raw


def read_chunks(stream: IO[bytes], chunk_size: int, skip: int = 0
                ) -> Iterator[tuple[int, list[str]]]:
  """(number of the chunk's first line, 0-based; the chunk's lines as text), `chunk_size`
  lines at a time, after skipping `skip` lines. Invalid UTF-8 is replaced, with a warning."""
  chunk: list[str] = []
  first = skip
  for number, raw in enumerate(stream):
    if number < skip:
      continue
    raw = _strip_newline(raw)
    if raw.endswith(b"\r"):
      raw = raw[:-1]
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError:
      text = raw.decode("utf-8", errors="replace")
      print(f"warning: line {number + 1} is not valid UTF-8; invalid bytes replaced by U+FFFD",
            file=sys.stderr)
    chunk.append(text)
    if len(chunk) == chunk_size:
      yield first, chunk
      first, chunk = number + 1, []
  if chunk:
    yield first, chunk


class Progress:
  """A progress line on stderr, at most every `every` seconds and at the end."""

  def __init__(self, what: str, total: int | None, done: int = 0, every: float = 5.0):
    self.what, self.total, self.done, self.every = what, total, done, every
    self.start, self.start_done, self.last = time.time(), done, 0.0

  def add(self, n: int, final: bool = False) -> None:
    self.done += n
    now = time.time()
    if not final and now - self.last < self.every:
      return
    self.last = now
    rate = (self.done - self.start_done) / max(now - self.start, 1e-9)
    line = f"{self.what}: {self.done:,}"
    if self.total:
      line += f"/{self.total:,} sentences ({100 * self.done / self.total:.0f}%)"
    else:
      line += " sentences"
    line += f", {rate:.1f} sentences/s"
    if self.total and rate > 0 and not final:
      line += f", ETA {format_duration((self.total - self.done) / rate)}"
    print(line, file=sys.stderr, flush=True)


class ResumableOutput:
  """A file written chunk by chunk that survives `kill -9` at any moment.

  `FILE.partial.json` (the state: the run's settings, the input lines done and the bytes of
  `FILE.partial` that hold them) is always written first and replaced atomically; the data it
  counts are on disk (fsync) before it counts them. So whenever a kill lands, the next run
  with the same settings finds a state that describes a prefix of `FILE.partial`:

  - before the first chunk: the state (0 lines) exists, `FILE.partial` may not;
  - inside a chunk or between its two writes: `FILE.partial` is longer than the state says,
    and the excess is cut off;
  - during the final rename: `FILE` exists beside the state and no `FILE.partial`; `FILE`
    is complete (`complete`), and the state is removed.

  `settings` identify the run (input, decoding, format, parameters); a `.partial` file of a
  run with other settings is refused, never overwritten or mixed.
  """

  def __init__(self, path: str, settings: dict[str, Any]):
    self.path = path
    self.partial = path + ".partial"
    self.state_path = self.partial + ".json"
    self.settings = json.loads(json.dumps(settings))
    self.lines_done = 0
    self.bytes = 0
    self.complete = False
    state = self._read_state()
    if state is not None:
      self._check_settings(state)
      self.lines_done, self.bytes = int(state["lines_done"]), int(state["bytes"])
    if os.path.exists(self.path):
      # Only a run killed during its final rename leaves FILE beside the state.
      if state is None or os.path.exists(self.partial) or os.path.getsize(self.path) != self.bytes:
        raise UserError(f"--output={self.path} exists: remove it or choose another file "
                        "(it is never overwritten)")
      self.complete = True
      return
    if state is None:
      if os.path.exists(self.partial):
        raise UserError(f"{self.partial} exists without {self.state_path}: it is not a run of "
                        "this program's; remove it to start afresh")
      self._write_state()
    with open(self.partial, "ab") as f:
      f.truncate(self.bytes)  # drops what was written after the last recorded state

  def _read_state(self) -> dict[str, Any] | None:
    if not os.path.exists(self.state_path):
      return None
    with open(self.state_path) as f:
      return json.load(f)

  def _check_settings(self, state: dict[str, Any]) -> None:
    if state.get("settings") != self.settings:
      changed = sorted(k for k in set(state.get("settings", {})) | set(self.settings)
                       if state.get("settings", {}).get(k) != self.settings.get(k))
      raise UserError(f"{self.partial} is an unfinished run with other settings "
                      f"({', '.join(changed)}): finish it with the same command, or remove "
                      f"{self.partial} and {self.state_path} to start afresh")

  def _write_state(self) -> None:
    tmp = self.state_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump({"settings": self.settings, "lines_done": self.lines_done,
                 "bytes": self.bytes}, f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self.state_path)

  def write(self, text: str, lines: int) -> None:
    """Appends a finished chunk (`lines` input lines), then records it, durably, in that
    order: a kill between the two leaves bytes the next run drops."""
    data = text.encode("utf-8")
    with open(self.partial, "ab") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    self.bytes += len(data)
    self.lines_done += lines
    self._write_state()

  def finish(self) -> None:
    """`FILE.partial` becomes `FILE`; then the state goes (a kill between the two: see
    `complete`)."""
    if not self.complete:
      os.replace(self.partial, self.path)
    os.remove(self.state_path)


def _all_complete(output: ResumableOutput | None) -> bool:
  """Process 0's `complete`, the same on every process."""
  complete = output is not None and output.complete
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    complete = bool(multihost_utils.broadcast_one_to_all(np.int32(complete)))
  return complete


def _lines_done(output: ResumableOutput | None) -> int:
  """Process 0's resume point, the same on every process."""
  done = output.lines_done if output is not None else 0
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    done = int(multihost_utils.broadcast_one_to_all(np.int64(done)))
  return done


def perplexity(log_prob: float, tokens: int) -> float:
  """exp(-log_prob / tokens), capped at the largest float (JSON has no infinity)."""
  return math.exp(min(-log_prob / tokens, math.log(sys.float_info.max)))


def hypotheses_json(source: str, hyps: list[tuple[str, Hypothesis]],
                    prefix: str | None = None) -> str:
  """One JSON line of translate mode: the source (and its forced target prefix), each
  hypothesis's text, score and log probability (and MBR's expected utility)."""
  record: dict[str, Any] = {"source": source}
  if prefix is not None:
    record["prefix"] = prefix
  record["hypotheses"] = [
    {"text": text, "score": h.score, "logprob": h.log_prob,
     **({} if h.utility is None else {"utility": h.utility})} for text, h in hyps]
  return json.dumps(record, ensure_ascii=False)


def split_prefix(line: str) -> tuple[str, str]:
  """`source<TAB>prefix` -> (source, prefix); a line without a tab has an empty prefix."""
  source, _, prefix = line.partition("\t")
  return source, prefix


def prefix_ids(tokenizer: Any, prefix: str) -> list[int]:
  """The target-side ids of a forced prefix, without the EOS that `encode` appends."""
  return tokenizer.encode(prefix.strip(), side=TARGET)[:-1] if prefix.strip() else []


def check_prefixes(path: str, tokenizer: Any, translator: Any, limit: int) -> None:
  """Before any work: each `source<TAB>prefix` line's prefix leaves room for its output's EOS
  (UserError naming the first line whose prefix is too long)."""
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      source, prefix = split_prefix(_strip_newline(raw).decode("utf-8", errors="replace"))
      ids = prefix_ids(tokenizer, prefix)
      if ids:
        longest = translator.output_limit(min(len(tokenizer.encode(source.strip())), limit))
        if len(ids) >= longest:
          raise UserError(f"--input={path}: line {number}: the prefix has {len(ids)} tokens but "
                          f"the output of its source is at most {longest} tokens, EOS "
                          "included (decode.max_extra_len, model.max_len)")


def check_source_tags(path: str, encoder: SourceEncoder, tab_separated: bool) -> None:
  """Before any work, for a model trained on tagged corpora: no line of `path` starts with a
  tag the model never saw (UserError naming the first that does). With `tab_separated`, the
  source is the text before the first tab."""
  if not encoder.ids:
    return
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      line = _strip_newline(raw).decode("utf-8", errors="replace")
      try:
        encoder.split(line.partition("\t")[0] if tab_separated else line)
      except UserError as e:
        raise UserError(f"--input={path}: line {number}: {e}") from None


@dataclasses.dataclass
class CorpusRun:
  """What a corpus run needs of a restored model (`infer.Restored`) and the flags."""

  model: Any  # infer.Restored
  input_path: str | None
  output_path: str | None
  settings: dict[str, Any]


def _run(run: CorpusRun, what: str, total: int | None, chunk_size: int,
         process_chunk: Callable[[int, list[str], Progress], str]) -> None:
  """Reads the input in chunks, turns each into output text, writes it (process 0)."""
  writer = None
  if run.output_path is not None and jax.process_index() == 0:
    writer = ResumableOutput(run.output_path, run.settings)
  if _all_complete(writer):
    if writer is not None:
      writer.finish()
      print(f"{run.output_path} is complete (its run was stopped while renaming it)",
            file=sys.stderr, flush=True)
    return
  skip = _lines_done(writer)
  progress = Progress(what, total, skip)
  stream = open(run.input_path, "rb") if run.input_path else sys.stdin.buffer  # noqa: SIM115
  try:
    for first, lines in read_chunks(stream, chunk_size, skip):
      text = process_chunk(first, lines, progress)
      if jax.process_index() != 0:
        continue
      if writer is not None:
        writer.write(text, len(lines))
      else:
        sys.stdout.write(text)
        sys.stdout.flush()
  finally:
    if run.input_path:
      stream.close()
  progress.add(0, final=True)
  if writer is not None:
    writer.finish()
    print(f"wrote {run.output_path}", file=sys.stderr, flush=True)


def translate_corpus(run: CorpusRun, config: Any, nbest: int, output_format: str,
                     target_prefix: bool = False) -> None:
  """`--mode=translate`: every input line translated (module docstring). With
  `target_prefix`, each line is `source<TAB>prefix`: every hypothesis starts with the prefix
  (a line without a tab has none)."""
  model = run.model
  tokenizer, translator = model.tokenizer, model.translator
  encoder = SourceEncoder(tokenizer, tags(config), config.decode.get("tag", ""))
  limit = translator.max_len - translator.max_extra_len
  total = count_lines(run.input_path) if run.input_path else None
  if target_prefix and run.input_path:
    check_prefixes(run.input_path, tokenizer, translator, limit)
  if run.input_path:
    check_source_tags(run.input_path, encoder, target_prefix)

  def process_chunk(first: int, lines: list[str], progress: Progress) -> str:
    rows, sources, prefixes = [], [], []
    texts = [split_prefix(line) if target_prefix else (line, "") for line in lines]
    for i, (line, prefix) in enumerate(texts):
      if not line.strip():
        continue
      if target_prefix:
        prefixes.append(prefix_ids(tokenizer, prefix))
      try:
        ids = encoder.encode(line)
      except UserError as e:
        raise UserError(f"line {first + i + 1}: {e}") from None
      if len(ids) > limit:
        print(f"warning: line {first + i + 1} has {len(ids)} tokens; truncated to {limit}",
              file=sys.stderr)
        ids = truncate(ids, limit)
      rows.append(i)
      sources.append(ids)
    try:
      found = translator.search_ids(model.params, sources, nbest,
                                    sentence_ids=[first + i for i in rows],
                                    on_batch=progress.add,
                                    prefixes=prefixes if target_prefix else None)
    except ValueError as e:  # a prefix too long for its output (read from standard input)
      raise UserError(f"line {first + 1} to {first + len(lines)}: {e}") from None
    progress.add(len(lines) - len(rows))  # empty lines
    hyps: list[list[tuple[str, Hypothesis]]] = [[] for _ in lines]
    for i, found_i in zip(rows, found, strict=True):
      hyps[i] = [(tokenizer.decode(h.ids), h) for h in found_i]
    out = []
    for (line, prefix), line_hyps in zip(texts, hyps, strict=True):
      if output_format == "jsonl":
        out.append(hypotheses_json(line, line_hyps, prefix if target_prefix else None) + "\n")
      else:
        texts = [t for t, _ in line_hyps][:nbest]
        out.append("".join(t + "\n" for t in texts + [""] * (nbest - len(texts))))
    return "".join(out)

  print(f"translating with the parameters of {model.label}", file=sys.stderr, flush=True)
  _run(run, "translate", total, int(config.decode.get("chunk_size", 10000)), process_chunk)


def score_corpus(run: CorpusRun, config: Any, total: int) -> None:
  """`--mode=score`: the log probability of every `source<TAB>target` pair (module docstring);
  `total`: the input's lines, as `check_score_input` counted them before any work."""
  model = run.model
  tokenizer, translator = model.tokenizer, model.translator
  encoder = SourceEncoder(tokenizer, tags(config), config.decode.get("tag", ""))
  limit = config.model.max_len
  if run.input_path:
    check_source_tags(run.input_path, encoder, True)

  def process_chunk(first: int, lines: list[str], progress: Progress) -> str:
    pairs = []
    for i, line in enumerate(lines):
      source, target = line.split("\t", 1)
      try:
        sides = [encoder.encode(source), tokenizer.encode(target.strip(), side=TARGET)]
      except UserError as e:
        raise UserError(f"line {first + i + 1}: {e}") from None
      if max(len(s) for s in sides) > limit:
        print(f"warning: line {first + i + 1} has a side longer than {limit} tokens; "
              "truncated", file=sys.stderr)
        sides = [truncate(s, limit) for s in sides]
      pairs.append((sides[0], sides[1]))
    log_probs = translator.score_ids(model.params, pairs, on_batch=progress.add)
    out = []
    for (_, target), logprob in zip(pairs, log_probs, strict=True):
      out.append(json.dumps({"logprob": logprob, "tokens": len(target),
                             "perplexity": perplexity(logprob, len(target))}) + "\n")
    return "".join(out)

  print(f"scoring with the parameters of {model.label}", file=sys.stderr, flush=True)
  _run(run, "score", total, int(config.decode.get("chunk_size", 10000)), process_chunk)
