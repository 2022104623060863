"""Paired-seed statistics for the parity harness: Student t quantiles and confidence intervals of a mean."""

import functools
import math

import numpy as np


def t_cdf_two_sided(t: float, df: int) -> float:
  """P(|T| <= t) for Student's t with `df` degrees of freedom (exact finite series, A&S 26.7.3-4)."""
  if df < 1:
    raise ValueError(f"df={df} must be >= 1")
  theta = math.atan(abs(t) / math.sqrt(df))
  s, c2 = math.sin(theta), math.cos(theta) ** 2
  if df % 2:  # odd: 2/pi * (theta + sin * cos * (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), df - 3 terms past 1
    term, series = 1.0, 1.0 if df > 1 else 0.0
    for k in range(1, (df - 1) // 2):
      term *= c2 * (2 * k) / (2 * k + 1)
      series += term
    return 2.0 / math.pi * (theta + s * math.cos(theta) * series)
  term, series = 1.0, 1.0  # even: sin * (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
  for k in range(1, df // 2):
    term *= c2 * (2 * k - 1) / (2 * k)
    series += term
  return s * series


@functools.lru_cache(maxsize=None)
def t_quantile(confidence: float, df: int) -> float:
  """The t with P(|T| <= t) = confidence (e.g. 0.95 -> 12.706 for df=1, 2.262 for df=9), by bisection."""
  if not 0 < confidence < 1:
    raise ValueError(f"confidence={confidence} must be in (0, 1)")
  lo, hi = 0.0, 1.0
  while t_cdf_two_sided(hi, df) < confidence:
    hi *= 2
  for _ in range(200):  # the interval halves each time: far past double precision
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    lo, hi = (mid, hi) if t_cdf_two_sided(mid, df) < confidence else (lo, mid)
  return 0.5 * (lo + hi)


def mean_ci(values, confidence=0.95):
  """(mean, half-width) of the t confidence interval of the mean of independent values (None: one value)."""
  x = np.asarray(values, np.float64)
  if x.size == 0:
    raise ValueError("no values")
  if x.size == 1:
    return float(x[0]), None
  half = t_quantile(confidence, x.size - 1) * float(np.std(x, ddof=1)) / math.sqrt(x.size)
  return float(np.mean(x)), half


def verdict(mean, half):
  """'> 0', '< 0' when the interval excludes 0; '0 in CI' when it holds 0; 'n/a' without an interval."""
  if half is None:
    return "n/a"
  if mean - half > 0:
    return "> 0"
  if mean + half < 0:
    return "< 0"
  return "0 in CI"
