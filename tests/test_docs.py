"""The documentation (README.md and docs/*.md) against the code.

- Every ```python block runs (with the repository on the path and as the working directory).
- Every `python -m transformer.main ...`, `python -m experiments.X ...` or
  `python -m benchmarks.X ...` command of a ```bash / ```sh / ```shell block is parsed by that
  module's own flag parser, without running it: the flags exist, their values parse,
  `--config=path[:variant]` loads with the file's `get_config(arg)`, and every
  `--config.a.b=...` override names a field of that config.
- Every relative link resolves to a file of the repository, and an anchor to a heading of it.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.xla_flags import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Documentation files, relative to ROOT: the README and every page under docs/.
DOC_FILES = ["README.md"] + sorted(
  os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
SHELL_LANGUAGES = {"bash", "sh", "shell"}
# Command modules whose flags the doc tests parse.
CHECKED_MODULES = re.compile(r"^(transformer\.main|experiments\.\w+|benchmarks\.\w+)$")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


def code_blocks(path: str) -> Iterator[tuple[str, int, str]]:
  """(language, line of the opening fence, code) of each fenced block of a markdown file."""
  text = read(path)
  for m in FENCE.finditer(text):
    yield m.group(1).lower(), text.count("\n", 0, m.start()) + 1, m.group(2)


def blocks(languages: set[str]) -> list[tuple[str, int, str]]:
  return [(path, line, code) for path in DOC_FILES for lang, line, code in code_blocks(path)
          if lang in languages]


# ----------------------------------------------------------------------------- python blocks

PYTHON_BLOCKS = blocks({"python"})
# The blocks run as a user's would: one CPU device (not the tests' 8), and cheap XLA:CPU
# compiles, since the examples are tiny.
DOC_ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2",
           "XLA_FLAGS": FAST_COMPILE}


def run_blocks(blocks_json: str, results_path: str) -> None:
  """Runs each (path, line, code) block in a fresh namespace of this process; writes
  {'path:line': traceback or ''} to `results_path` as JSON."""
  import traceback

  results = {}
  for path, line, code in json.loads(blocks_json):
    try:
      exec(compile(code, f"{path}:{line}", "exec"), {"__name__": "__docs__"})  # noqa: S102
      results[f"{path}:{line}"] = ""
    except BaseException:  # noqa: BLE001 - reported by the block's test
      results[f"{path}:{line}"] = traceback.format_exc()
  with open(results_path, "w") as f:
    json.dump(results, f)


@pytest.fixture(scope="module")
def python_block_results(tmp_path_factory) -> dict[str, str]:
  """Every ```python block, run once in one fresh process with the repository as the working
  directory; the traceback of each block that failed."""
  results = tmp_path_factory.mktemp("docs") / "results.json"
  script = ("import sys\nfrom tests.test_docs import run_blocks\n"
            "run_blocks(sys.stdin.read(), sys.argv[1])\n")
  proc = subprocess.run([sys.executable, "-c", script, str(results)], cwd=ROOT, env=DOC_ENV,
                        input=json.dumps(PYTHON_BLOCKS), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0 and results.exists(), proc.stderr[-3000:]
  return json.loads(results.read_text())


def test_docs_have_python_blocks():
  assert PYTHON_BLOCKS, "no ```python block found in " + ", ".join(DOC_FILES)


@pytest.mark.parametrize("where", [f"{p}:{n}" for p, n, _ in PYTHON_BLOCKS])
def test_python_block_runs(where, python_block_results):
  assert python_block_results[where] == "", python_block_results[where]


def test_a_failing_block_is_reported(tmp_path):
  results = tmp_path / "results.json"
  run_blocks(json.dumps([["x.md", 3, "import math\n"], ["x.md", 9, "1 / 0\n"]]), str(results))
  outcome = json.loads(results.read_text())
  assert outcome["x.md:3"] == "" and "ZeroDivisionError" in outcome["x.md:9"]


# ----------------------------------------------------------------------------- shell commands

# Shell operators that end one command and start the next.
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {">", ">>", "<", "2>", "&>"}


def shell_commands(code: str) -> Iterator[list[str]]:
  """The simple commands of a shell block, as argv lists (comments, `\\` line continuations,
  pipes, `&&`, `;` and redirections handled; no variable expansion)."""
  for line in code.replace("\\\n", " ").splitlines():
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    command: list[str] = []
    stopped = False
    for token in lexer:
      if token in SEPARATORS:
        if command:
          yield command
        command, stopped = [], False
      elif token in REDIRECTS:
        stopped = True  # the rest is the redirection's target
      elif not stopped:
        command.append(token)
    if command:
      yield command


def module_invocation(argv: list[str]) -> tuple[str, list[str]] | None:
  """(module, its arguments) for `[VAR=value ...] [nice -n N] python -m MODULE ARGS...`."""
  for i, token in enumerate(argv[:-2]):
    if os.path.basename(token) in ("python", "python3") and argv[i + 1] == "-m":
      return argv[i + 2], argv[i + 3:]
  return None


def inline_commands(path: str) -> Iterator[tuple[int, str]]:
  """(line, command) of each inline code span outside code blocks that is a `python -m`
  command, e.g. in a table."""
  text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), read(path))  # keeps line numbers
  for m in re.finditer(r"`(python3? -m [^`\n]+)`", text):
    yield text.count("\n", 0, m.start()) + 1, m.group(1)


def documented_commands() -> list[tuple[str, list[str], str]]:
  """(module, argv, 'file:line') of every checked command in the documentation: in shell
  blocks, and in inline code."""
  snippets = [(f"{path}:{line}", code) for path, line, code in blocks(SHELL_LANGUAGES)]
  snippets += [(f"{path}:{line}", code) for path in DOC_FILES
               for line, code in inline_commands(path)]
  found = []
  for where, code in snippets:
    for argv in shell_commands(code):
      invocation = module_invocation(argv)
      if invocation and CHECKED_MODULES.match(invocation[0]):
        found.append((invocation[0], invocation[1], where))
  return found


def test_shell_command_parsing():
  code = ('XLA_FLAGS= python -m benchmarks.decode --a=1 \\\n  --b="x y"  # note\n'
          'echo "seven" | python -m transformer.main --mode=translate && ls > out.txt\n'
          'pip install -r requirements.txt; nice -n 19 python3 -m experiments.heads\n')
  commands = list(shell_commands(code))
  assert commands == [
    ["XLA_FLAGS=", "python", "-m", "benchmarks.decode", "--a=1", "--b=x y"],
    ["echo", "seven"], ["python", "-m", "transformer.main", "--mode=translate"], ["ls"],
    ["pip", "install", "-r", "requirements.txt"],
    ["nice", "-n", "19", "python3", "-m", "experiments.heads"]]
  assert [module_invocation(c) for c in commands] == [
    ("benchmarks.decode", ["--a=1", "--b=x y"]), None,
    ("transformer.main", ["--mode=translate"]), None, None, ("experiments.heads", [])]


def command_parser(module_name: str) -> Callable[[list[str]], list[str]]:
  """The flag parser of `python -m module_name`, without running the command: the module runs
  as `__main__` (so that its flags get defined, under `if __name__ == "__main__":`) with
  absl's `app.run` replaced by a stub that keeps the `flags_parser` it is given. The entry
  point transformer/main.py, whose `__main__` block may run the process again with huge pages,
  is imported (its flags are module-level) and its `run()` called instead."""
  import importlib
  import runpy

  from absl import app

  given: dict[str, Callable[[list[str]], list[str]]] = {}

  def keep_parser(main, argv=None, flags_parser=None):  # noqa: ARG001 - app.run's signature
    if flags_parser is not None:
      given["parser"] = flags_parser

  run = app.run
  app.run = keep_parser
  try:
    if module_name == "transformer.main":
      importlib.import_module(module_name).run()
    else:
      runpy.run_module(module_name, run_name="__main__")
  finally:
    app.run = run
  if "parser" not in given:
    raise AssertionError(f"{module_name}: no app.run(..., flags_parser=...) when run")
  return given["parser"]


# The configs of the documented workdirs, for the commands that read their config from the
# workdir (every mode but import, without --config): the check gives each a stand-in workdir
# holding that config's config.json.
WORKDIR_CONFIGS = {"runs/numbers": "configs/numbers.py", "runs/mine": "configs/text.py:en-de,small",
                   "runs/wmt-base": "configs/wmt.py:base",
                   "runs/numbers-es": "configs/numbers.py",
                   "runs/reverse": "configs/text.py:de-en,small",
                   "runs/multilingual": "configs/multilingual.py",
                   # an imported OPUS-MT model: its config has text.py's fields
                   "runs/opus-mt-en-de": "configs/text.py:en-de"}


def stand_in(workdir: str, root: str) -> str:
  """A directory under `root` holding the config.json that `workdir` would have."""
  import importlib.util

  from transformer import workdir as workdir_lib

  if workdir not in WORKDIR_CONFIGS:
    raise ValueError(f"--workdir={workdir}: add its config to test_docs.WORKDIR_CONFIGS")
  path, _, arg = WORKDIR_CONFIGS[workdir].partition(":")
  spec = importlib.util.spec_from_file_location("doc_config", os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  directory = os.path.join(root, workdir.replace("/", "_"))
  os.makedirs(directory, exist_ok=True)
  workdir_lib.save(module.get_config(arg or None), directory)
  return directory


def with_stand_in_workdir(argv: list[str], root: str) -> list[str]:
  """`argv` with its --workdir replaced by a stand-in holding the workdir's config.json, when
  the command takes its config from the workdir (or names a workdir's config as its config
  file, `--config=transformer/workdir.py:WORKDIR`); else `argv` unchanged."""
  from transformer import workdir as workdir_lib

  prefix = "--config=transformer/workdir.py:"
  argv = [prefix + stand_in(a[len(prefix):], root) if a.startswith(prefix) else a
          for a in argv]
  if workdir_lib.with_workdir_config(["main", *argv])[1:] == argv:
    return argv
  workdir = workdir_lib.flag_value(argv, "workdir")
  directory = stand_in(workdir, root)
  return [a if not a.startswith("--workdir=") else f"--workdir={directory}" for a in argv]


def check_commands(commands: list[tuple[str, list[str], str]]) -> list[str]:
  """Parses every (module, argv, where) with its module's flag parser, in this process; returns
  one line per command that fails. Each module's flags are removed again after its commands,
  so that the next module can define its own."""
  import contextlib
  import io
  import tempfile

  from absl import flags

  stand_ins = tempfile.mkdtemp(prefix="doc-workdirs-")
  try:

    FLAGS = flags.FLAGS
    errors = []
    by_module: dict[str, list[tuple[list[str], str]]] = {}
    for module_name, argv, where in commands:
      by_module.setdefault(module_name, []).append((argv, where))
    for module_name, runs in by_module.items():
      before = set(FLAGS)
      try:
        parse = command_parser(module_name)
      except Exception as e:  # noqa: BLE001 - reported as the documentation's error
        errors.append(f"{runs[0][1]}: python -m {module_name}: {type(e).__name__}: {e}")
        continue
      for argv, where in runs:
        if module_name == "transformer.main":
          try:
            argv = with_stand_in_workdir(argv, stand_ins)
          except Exception as e:  # noqa: BLE001 - reported as the documentation's error
            errors.append(f"{where}: python -m {module_name}: {e}")
            continue
        full = [module_name, *argv]
        for name in [n for n in FLAGS if "." in n]:  # the last command's config overrides
          delattr(FLAGS, name)
        FLAGS.unparse_flags()
        sys.argv = full  # ml-collections reads the overrides from sys.argv
        stderr = io.StringIO()
        try:
          with contextlib.redirect_stderr(stderr):
            rest = parse(full)
            for name in list(FLAGS):
              getattr(FLAGS[name].value, "to_dict", None)  # a config file loads on first use
          if rest[1:]:
            raise ValueError(f"unexpected arguments {rest[1:]}")
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the parsers exit 2 on an error
          message = (stderr.getvalue().strip().splitlines() or [""])[-1]
          if not isinstance(e, SystemExit):
            message = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
          errors.append(f"{where}: {shlex.join(['python', '-m', *full])}: {message}")
      for name in set(FLAGS) - before:
        delattr(FLAGS, name)
  finally:
    shutil.rmtree(stand_ins, ignore_errors=True)
  return errors


# Commands the checker must refuse: an unknown flag, an unknown config field, a bad value, a
# missing config file, an unknown variant, a stray argument.
BAD_COMMANDS = [
  ["--config=configs/numbers.py", "--nope=1"],
  ["--config=configs/numbers.py", "--config.model.nope=1"],
  ["--config=configs/numbers.py", "--config.model.num_heads=four"],
  ["--config=configs/missing.py"],
  ["--config=configs/wmt.py:nope"],
  ["--config=configs/wmt.py:big", "extra"],
]


@pytest.fixture(scope="module")
def command_errors() -> list[str]:
  """check_commands over the documented commands and BAD_COMMANDS (where 'bad<i>'), in a
  fresh process (it changes absl's global flags and sys.argv)."""
  commands = documented_commands() + [
    ("transformer.main", argv, f"bad{i}") for i, argv in enumerate(BAD_COMMANDS)]
  script = ("import json, sys\nfrom tests.test_docs import check_commands\n"
            "print(json.dumps(check_commands(json.load(sys.stdin))))\n")
  proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(commands), cwd=ROOT,
                        env=DOC_ENV, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_documented_commands_parse(command_errors):
  modules = {m for m, _, _ in documented_commands()}
  assert "transformer.main" in modules and any(m.startswith("experiments.") for m in modules)
  errors = [e for e in command_errors if not e.startswith("bad")]
  assert not errors, "\n".join(errors)


def test_bad_commands_are_caught(command_errors):
  caught = [e.split(":")[0] for e in command_errors if e.startswith("bad")]
  assert caught == [f"bad{i}" for i in range(len(BAD_COMMANDS))], command_errors


# ----------------------------------------------------------------------------- links

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def heading_anchors(path: str) -> set[str]:
  """GitHub's anchors for the headings of a markdown file (lower case, punctuation dropped,
  spaces to hyphens, -1, -2, ... for repeats)."""
  text = FENCE.sub("", read(path))
  anchors, seen = set(), {}
  for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.MULTILINE):
    slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
    anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
    seen[slug] = seen.get(slug, 0) + 1
  return anchors


def relative_links(path: str) -> list[str]:
  text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", read(path)))  # not in code
  return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("path", DOC_FILES)
def test_relative_links_resolve(path):
  broken = []
  for target in relative_links(path):
    file, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
    if resolved.startswith("..") or not os.path.exists(os.path.join(ROOT, resolved)):
      broken.append(f"{target} (no file {resolved} in the repository)")
    elif anchor and resolved.endswith(".md") and anchor not in heading_anchors(resolved):
      broken.append(f"{target} (no heading #{anchor} in {resolved})")
  assert not broken, f"{path}: " + "; ".join(broken)


def test_anchors_and_links_are_found():
  assert heading_anchors("README.md") >= {"attention-is-all-you-need-in-jaxflax", "quick-start"}
  assert "the-data-path-at-wmt14s-size" in heading_anchors("docs/data.md")
  assert "docs/training.md#the-offline-default" in relative_links("README.md")
  assert "../experiments/results/heads.png" in relative_links("docs/experiments.md")
  assert not [t for t in relative_links("README.md") if t.startswith("http")]
  assert "python -m experiments.heads" in [c for _, c in inline_commands("docs/experiments.md")]
