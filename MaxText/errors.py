"""UserError: a mistake the user can fix (or an environment fault they must), printed as one line, exit code 2."""


class UserError(Exception):
  """What went wrong, where, and what to do: the CLI prints it as one line on stderr and exits 2."""
