"""Errors that are the user's to fix: the main program prints them as one line, exit status 2."""


class UserError(Exception):
  """A mistake in the config, the data or the workdir, explained in one line."""


class ConfigError(UserError):
  """A config field has a bad value; the message names the field and what would be valid."""


class CheckpointError(UserError):
  """A checkpoint cannot be used with this config; the message names the path."""
