"""Interval estimates for accuracies and means (the statistics issue extends this room)."""
from __future__ import annotations

import math

import numpy as np


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (95% by default); (nan, nan) when n is 0."""
    if n == 0:
        return float("nan"), float("nan")
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """Mean with a Student-t interval; the interval is nan for fewer than two values."""
    from scipy import stats as st

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    m = float(x.mean())
    if x.size < 2:
        return m, float("nan"), float("nan")
    half = float(st.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half
