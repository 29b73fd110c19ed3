"""Errors of the data layer."""


class DataError(ValueError):
  """A user-facing data problem (missing dataset, damaged vocabulary, bad language pair).

  The message is one line that names the dataset or path, so the main program can print it and
  exit with status 2.
  """
