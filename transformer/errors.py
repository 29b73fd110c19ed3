"""Errors that are the user's to fix: the main program prints them as one line, exit status 2."""

import sys
from collections.abc import Callable
from typing import NoReturn


class UserError(Exception):
  """A mistake in the config, the data or the workdir, explained in one line."""


class ConfigError(UserError):
  """A config field has a bad value; the message names the field and what would be valid."""


class CheckpointError(UserError):
  """A checkpoint cannot be used with this config; the message names the path."""


def show(value: object) -> str:
  """`value` as one short line for a message (a config node as its plain dict)."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  shown = " ".join(repr(value).split())
  return shown if len(shown) <= 80 else shown[:77] + "..."


def fail(message: str) -> NoReturn:
  """Prints `error: message` on stderr and exits with status 2 (the CLIs' one-line errors)."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, but a bad flag, a config file that fails to load or an override that
  does not apply to it is one line naming the flag, and exit status 2."""
  import re

  from absl import flags

  def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"

  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e).strip().splitlines()[0])
  except Exception as e:  # noqa: BLE001 - a config file that fails to load, a bad override
    missing = re.search(r"'([^'\"]+)'", str(e))
    culprit = next((a.split("=")[0] for a in argv[1:] if missing and a.startswith("--")
                    and a.split("=")[0].endswith("." + missing.group(1))), "--config")
    fail(f"{culprit}: {'no such field' if culprit != '--config' else 'cannot load it'} "
         f"({first_line(e)})")
  for name in list(flags.FLAGS):
    flag = flags.FLAGS[name]
    try:
      # A config file that failed to load raises on first use: use it now.
      getattr(flag.value, "to_dict", None)
    except Exception:  # noqa: BLE001
      fail(f"--{name}={getattr(flag, 'config_filename', '')}: cannot load the config file")
  return rest


def flags_parser(**default_files: str) -> Callable[[list[str]], list[str]]:
  """The flag parser of the experiment CLIs (`app.run(main, flags_parser=flags_parser())`):
  errors as one line and exit status 2 (`_parse_flags`). `default_files`: `--NAME=PATH` is
  passed for each NAME not on the command line, so that its `--NAME.FIELD=...` overrides are
  parsed and checked with the rest (a config-file flag with a default would load it, and fail,
  while its module is imported)."""

  def parse(argv: list[str]) -> list[str]:
    for name, path in default_files.items():
      if not any(a == f"--{name}" or a.startswith(f"--{name}=") for a in argv[1:]):
        argv = [argv[0], f"--{name}={path}", *argv[1:]]
    return _parse_flags(argv)

  return parse
