"""The precision plan: which recipe and backend each GEMM of each decoder layer runs, asked by the model."""

from MaxText.precision.plan import *  # noqa: F401,F403
from MaxText.precision.plan import quantizer_impl  # noqa: F401
