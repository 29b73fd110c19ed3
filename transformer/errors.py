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


def _root_cause(e: BaseException) -> BaseException:
  while e.__cause__ or e.__context__:
    e = e.__cause__ or e.__context__
  return e


def flag_error(e: BaseException, argv: list[str]) -> str:
  """One line for a failure to parse the flags, load a config file or apply an override: it
  names the flag or the override (`--config.model.nope`) the user typed."""
  import re

  from absl import flags

  if isinstance(e, flags.Error):
    return (str(e).strip().splitlines() or [""])[0]
  root = _root_cause(e)
  lines = [ln.strip() for ln in str(root).splitlines() if ln.strip()]
  message = lines[-1] if lines else ""
  if isinstance(root, flags.Error):
    return message
  overrides = [a.split("=")[0] for a in argv[1:] if re.match(r"--\w+\.", a)]
  missing = re.search(r"'([^'\"]+)'", message)
  culprit = next((o for o in overrides if missing and o.endswith("." + missing.group(1))), None)
  if isinstance(root, AttributeError | KeyError) and overrides:
    return (f"{culprit or ', '.join(overrides)}: no such field {message}; see the config file "
            "for the field names")
  if overrides and isinstance(root, ValueError | TypeError) and "variant" not in message:
    return f"{', '.join(overrides)}: bad override value: {message}"
  return f"--config: cannot load it ({type(root).__name__}: {message})"


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, but a bad flag, a config file that fails to load or an override that
  does not apply to it is one line naming the flag (`flag_error`), and exit status 2: the one
  parser of the main program and of every command of experiments/ and benchmarks/."""
  from absl import flags

  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # noqa: BLE001 - a bad flag, a config file that fails, an override
    fail(flag_error(e, argv))
  for name in list(flags.FLAGS):
    flag = flags.FLAGS[name]
    try:
      # A config file is loaded lazily, on first use: use it now.
      getattr(flag.value, "to_dict", None)
    except Exception as e:  # noqa: BLE001
      root = _root_cause(e)
      fail(f"--{name}={getattr(flag, 'config_filename', '')}: cannot load the config file "
           f"({type(root).__name__}: {(str(root).strip().splitlines() or [''])[-1]})")
  return rest


def flags_parser(**default_files: str) -> Callable[[list[str]], list[str]]:
  """The flag parser of the experiment CLIs (`app.run(main, flags_parser=flags_parser())`):
  errors as one line and exit status 2 (`parse_flags`). `default_files`: `--NAME=PATH` is
  passed for each NAME not on the command line, so that its `--NAME.FIELD=...` overrides are
  parsed and checked with the rest (a config-file flag with a default would load it, and fail,
  while its module is imported)."""

  def parse(argv: list[str]) -> list[str]:
    for name, path in default_files.items():
      if not any(a == f"--{name}" or a.startswith(f"--{name}=") for a in argv[1:]):
        argv = [argv[0], f"--{name}={path}", *argv[1:]]
    return parse_flags(argv)

  return parse
