"""The quantization library's user-facing error: a backend or kernel implementation asked for where it can't run."""


class BackendError(ValueError):
  """A backend was asked for where it can't run the recipe: a user error (one line)."""
