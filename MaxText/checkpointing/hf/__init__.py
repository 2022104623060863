"""Hugging Face interop: the safetensors format, Llama's tensor names and config.json, import, export, direct load."""

from MaxText.errors import UserError


class HFError(UserError):
  """A Hugging Face checkpoint (or an output directory) we can't use: one line, what, where and what to do."""
