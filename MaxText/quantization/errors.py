"""The quantization library's user-facing errors, under one root of its own (the library imports nothing from the
trainer): a recipe that doesn't exist or a knob it doesn't take, a backend or kernel implementation asked for where it
can't run. The trainer's CLI prints them as one line, like its own UserError."""


class QuantizationError(Exception):
  """Root of the library's user-facing errors: what went wrong and what to do, in one line."""


class RecipeError(QuantizationError, ValueError):
  """An unknown recipe name, or a knob the recipe doesn't take or a value it doesn't allow."""


class BackendError(QuantizationError, ValueError):
  """A backend was asked for where it can't run the recipe: a user error (one line)."""
