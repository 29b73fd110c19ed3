"""Errors that are the user's to fix: the main program prints them as one line, exit status 2."""

import sys
from typing import NoReturn


class UserError(Exception):
  """A mistake in the config, the data or the workdir, explained in one line."""


class ConfigError(UserError):
  """A config field has a bad value; the message names the field and what would be valid."""


class CheckpointError(UserError):
  """A checkpoint cannot be used with this config; the message names the path."""


def fail(message: str) -> NoReturn:
  """Prints `error: message` on stderr and exits with status 2 (the CLIs' one-line errors)."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing for the experiment CLIs (`app.run(main, flags_parser=parse_flags)`),
  but a bad flag or a config file that fails to load is one line and exit status 2."""
  from absl import flags

  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e).strip().splitlines()[0])
  except Exception as e:  # noqa: BLE001 - a config file that fails to load or parse
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    fail(f"--config: {type(e).__name__}: {first}")
