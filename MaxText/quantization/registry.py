"""Backends by name, the values quantization_backend takes: `Choice` names the built-in ones and `auto`; a program adds
its own Backend with backends.register, under the Backend's name. Plain Python: the config checks a name without
importing JAX."""

import enum


class Choice(enum.Enum):
  """A request for a built-in backend (the values are quantization_backend's spellings)."""

  AUTO = "auto"
  TE = "te"
  XLA = "xla"
  EMULATE = "emulate"


REGISTERED = {}  # name -> the Backend a program registered (backends.register), in registration order


class Names:
  """quantization_backend's choices as the config sees them: `leading` values (e.g. '': "as quantization_backend"),
  the Choice values, then every registered backend's name, read when asked: a backend registered after the config
  schema was built is a choice at once."""

  def __init__(self, *leading):
    self.leading = leading

  def _values(self):
    return (*self.leading, *(c.value for c in Choice), *REGISTERED)

  def __iter__(self):
    return iter(self._values())

  def __contains__(self, name):
    return name in self._values()

  def __len__(self):
    return len(self._values())

  def __repr__(self):
    return repr(self._values())
