"""A corpus run's output survives `kill -9` wherever it lands (decoding/files.py).

Every file operation of a run (each fsync, each rename, each removal) is a moment a kill can
land on: the run is stopped just before it and just after it, in turn, with the bytes it had
written left behind as a kill leaves them (and half a chunk more); the same command then
finishes the file, which must equal an uninterrupted run's, without redoing finished chunks.
"""

import os

import pytest

from transformer.decoding import files


class Killed(BaseException):
  """Stands for SIGKILL: nothing of the run's own cleanup may react to it."""


LINES = [f"line {i}" for i in range(10)]


def run(tmp_path, output, what, seen):
  """`_run` over LINES in chunks of 3, each line's output its upper case (score mode: a JSON
  object per line), as translate and score write them."""
  source = tmp_path / "input.txt"
  source.write_text("".join(x + "\n" for x in LINES))

  def process_chunk(first, lines, progress):
    seen.extend(lines)
    if what == "score":
      return "".join(f'{{"logprob": -{first + i}.5}}\n' for i, _ in enumerate(lines))
    return "".join(x.upper() + "\n" for x in lines)

  settings = {"mode": what, "input": str(source)}
  files._run(files.CorpusRun(None, str(source), str(output), settings), what, len(LINES), 3,
             process_chunk)


OPERATIONS = ("fsync", "replace", "remove")


def count_operations(tmp_path, what, monkeypatch):
  calls = []
  for name in OPERATIONS:
    real = getattr(os, name)
    monkeypatch.setattr(files.os, name,
                        lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
  run(tmp_path, tmp_path / "count.txt", what, [])
  monkeypatch.undo()
  return len(calls)


@pytest.mark.parametrize("what", ["translate", "score"])
def test_a_kill_at_every_moment_resumes_to_the_same_file(tmp_path, monkeypatch, what):
  whole = tmp_path / "whole.txt"
  run(tmp_path, whole, what, [])
  expected = whole.read_bytes()
  moments = count_operations(tmp_path, what, monkeypatch)
  assert moments >= 3 * 4 + 2  # state and data of 4 chunks, the first state, the rename
  for k in range(moments):
    for after in (False, True):
      output = tmp_path / f"out-{k}-{after}.txt"
      calls = []
      for name in OPERATIONS:
        real = getattr(os, name)

        def op(*args, _real=real, _k=k, _after=after, calls=calls):
          calls.append(1)
          if len(calls) - 1 == _k and not _after:
            raise Killed
          result = _real(*args)
          if len(calls) - 1 == _k and _after:
            raise Killed
          return result

        monkeypatch.setattr(files.os, name, op)
      with pytest.raises(Killed):
        run(tmp_path, output, what, [])
      monkeypatch.undo()
      partial = tmp_path / f"{output.name}.partial"
      if partial.exists():
        with open(partial, "ab") as f:
          f.write(b"half a chunk\n")  # bytes written after the last recorded state
      seen = []
      if k == moments - 1 and after:  # killed after its last step: the run had finished
        assert output.read_bytes() == expected
        continue
      run(tmp_path, output, what, seen)
      assert output.read_bytes() == expected, (k, after)
      assert not partial.exists() and not (tmp_path / f"{output.name}.partial.json").exists()
      assert len(seen) <= len(LINES)


def test_a_finished_file_is_never_overwritten(tmp_path):
  output = tmp_path / "done.txt"
  run(tmp_path, output, "translate", [])
  with pytest.raises(files.UserError, match="exists"):
    files.check_request("score", 1, "jsonl", None, str(tmp_path / "input.txt"), str(output))
  with pytest.raises(files.UserError, match="exists"):
    run(tmp_path, output, "translate", [])


def test_a_partial_file_of_no_known_run_is_refused(tmp_path):
  output = tmp_path / "stray.txt"
  (tmp_path / "stray.txt.partial").write_text("someone else's\n")
  with pytest.raises(files.UserError, match="without"):
    run(tmp_path, output, "translate", [])
  assert (tmp_path / "stray.txt.partial").read_text() == "someone else's\n"
