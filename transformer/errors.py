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
