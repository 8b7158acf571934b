#!/usr/bin/env python
"""Fit the polynomials of the vector erf in cpu_backend/include/tf_vec_math.h (erf_ps) and
check the float32 result against torch's float64 erf, in ulps.

    python scripts/fit_erf.py            # prints the coefficients (paste them into erf_ps)

erf_ps computes, for |x| < SPLIT, x + x Q(x^2) (Q fitted for relative error), and for
SPLIT <= |x| < 3.95, 1 - 2^R(|x|) with R ~ log2(erfc(|x|)) (fitted for absolute error, which
is erfc's relative error) and 2^R = 2^n 2^f, n = round(R), 2^f by P(f) on [-0.5, 0.5]
(fitted for relative error). Fits: Lawson-weighted least squares (close to minimax). The
check evaluates the polynomials as the header does, in float32 with fused multiply-adds.
"""
from __future__ import annotations

import numpy as np
import torch

SPLIT = 1.0
Q_TERMS, R_TERMS, P_TERMS = 6, 8, 6
HIGH = 3.95   # erf(x) rounds to 1 in float32 beyond


def lawson(basis: np.ndarray, target: np.ndarray, weight: np.ndarray, rounds: int = 40):
    """Coefficients c minimizing max |(basis @ c - target) * weight| (approximately)."""
    extra = np.ones_like(target)
    for _ in range(rounds):
        w = (weight * np.sqrt(extra))[:, None]
        coeffs, *_ = np.linalg.lstsq(basis * w, target * w[:, 0], rcond=None)
        err = np.abs((basis @ coeffs - target) * weight)
        extra = extra * (err / err.max() + 1e-6)
        extra /= extra.sum()
    return coeffs, err.max()


def fit():
    x = np.linspace(1e-5, SPLIT, 20000)
    erf = torch.erf(torch.from_numpy(x)).numpy()
    q, q_err = lawson(np.stack([x * (x * x) ** k for k in range(Q_TERMS)], 1), erf - x, 1 / erf)
    a = np.linspace(SPLIT, HIGH, 20000)
    log2_erfc = np.log2(torch.erfc(torch.from_numpy(a)).numpy())
    r, r_err = lawson(np.stack([a ** k for k in range(R_TERMS)], 1), log2_erfc, np.ones_like(a))
    f = np.linspace(-0.5, 0.5, 20000)
    p, p_err = lawson(np.stack([f ** k for k in range(1, P_TERMS)], 1), np.exp2(f) - 1, 2.0 ** -f)
    print(f"fits (exact arithmetic): Q rel {q_err:.2g}, R abs {r_err:.2g}, P rel {p_err:.2g}")
    return [np.float32(c) for c in q], [np.float32(c) for c in r], [np.float32(1.0)] + [np.float32(c) for c in p]


def _fma(a, b, c):
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


def _horner(coeffs, v):
    acc = np.full_like(v, coeffs[-1])
    for c in coeffs[-2::-1]:
        acc = _fma(acc, v, c)
    return acc


def erf_float32(x: np.ndarray, q, r, p) -> np.ndarray:
    """erf_ps, step by step in float32."""
    ax = np.abs(x)
    small = _fma(x, _horner(q, (x * x).astype(np.float32)), x)
    big_r = _horner(r, np.minimum(ax, np.float32(HIGH)))
    n = np.rint(big_r).astype(np.float32)
    two_f = _horner(p, (big_r - n).astype(np.float32))
    e = (two_f.astype(np.float64) * np.exp2(n.astype(np.float64))).astype(np.float32)   # scalef
    big = np.copysign((np.float32(1) - e).astype(np.float32), x)
    return np.where(ax < np.float32(SPLIT), small, big)


def max_ulp(q, r, p) -> tuple[float, float]:
    x = np.concatenate([np.linspace(-6, 6, 3000001), np.geomspace(1e-30, 6, 300001),
                        -np.geomspace(1e-30, 6, 30001)]).astype(np.float32)
    ref = torch.erf(torch.from_numpy(x).double()).numpy()
    ref32 = np.abs(ref.astype(np.float32))
    spacing = (np.nextafter(ref32, np.float32(np.inf)) - ref32).astype(np.float64)
    err = np.abs(erf_float32(x, q, r, p) - ref) / spacing
    return float(err.max()), float(x[err.argmax()])


def main() -> None:
    q, r, p = fit()
    worst, at = max_ulp(q, r, p)
    print(f"float32 erf: max {worst:.2f} ulp (at x = {at!r})")
    for name, coeffs in (("Q", q), ("R", r), ("P", p)):
        print(f"{name} (highest degree first): " + ", ".join(f"{float(c):.9e}f" for c in coeffs[::-1]))


if __name__ == "__main__":
    main()
