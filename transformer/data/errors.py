"""Errors of the data layer."""

from transformer.errors import UserError


class DataError(UserError, ValueError):
  """A user-facing data problem (missing dataset, damaged vocabulary, bad language pair).

  The message is one line that names the dataset or path; as every `UserError`, the main
  program prints it and exits with status 2.
  """
