"""Generate the series coefficients that tritonfuse/math_composites.py evaluates.

Run ``python scripts/gen_special_coefficients.py`` and paste its output over the tables
there. Everything is computed from first principles with mpmath at 50 digits:

* Chebyshev expansions (sum c_k T_k(t), t in [-1, 1]) of the exponentially scaled
  modified Bessel functions, on x in [0, 8] (t = x / 4 - 1) and x in [8, inf)
  (t = 16 / x - 1, the sqrt(x)-scaled function is smooth in 1 / x there):
      I0_SMALL  exp(-x) I0(x)               I0_LARGE  exp(-x) I0(x) sqrt(x)
      I1_SMALL  exp(-x) I1(x) / x           I1_LARGE  exp(-x) I1(x) sqrt(x)
  Coefficients below 1e-18 of the largest are dropped; math_composites keeps fewer
  for float32 (see ``chebyshev``).
* ERFCX_TAIL (for cpu_backend/include/tf_vec_special.h): erfcx(x) (x + 3) on x >= 0.875
  as a Chebyshev series in s = 2 (t - t0) / (1 - t0) - 1, t = 1 - 6 / (x + 3), t0 = t(0.875)
  (the (x + 3) factor keeps the relative error uniform up to x = inf, where it is 1/sqrt(pi)).
* digamma(10), the anchor of the digamma recurrence.
"""
import mpmath

mpmath.mp.dps = 50
NODES = 80


def chebyshev_coefficients(f, to_x):
    """c_k with f(to_x(t)) = sum_k c_k T_k(t) on [-1, 1] (c_0 not halved)."""
    ts = [mpmath.cos(mpmath.pi * (j + mpmath.mpf(1) / 2) / NODES) for j in range(NODES)]
    values = [f(to_x(t)) for t in ts]
    coeffs = []
    for k in range(NODES):
        s = sum(v * mpmath.cos(k * mpmath.pi * (j + mpmath.mpf(1) / 2) / NODES) for j, v in enumerate(values))
        coeffs.append(2 * s / NODES)
    coeffs[0] /= 2
    biggest = max(abs(c) for c in coeffs)
    while abs(coeffs[-1]) < 1e-18 * biggest:
        coeffs.pop()
    return coeffs


def small(t):
    return 4 * (t + 1)


def large(t):
    return 16 / (t + 1)


SERIES = {
    "I0_SMALL": (lambda x: mpmath.exp(-x) * mpmath.besseli(0, x), small),
    "I0_LARGE": (lambda x: mpmath.exp(-x) * mpmath.besseli(0, x) * mpmath.sqrt(x), large),
    "I1_SMALL": (lambda x: mpmath.exp(-x) * mpmath.besseli(1, x) / x if x else mpmath.mpf(1) / 2, small),
    "I1_LARGE": (lambda x: mpmath.exp(-x) * mpmath.besseli(1, x) * mpmath.sqrt(x), large),
}


def erfcx_tail(s):
    t0 = 1 - 6 / (mpmath.mpf("0.875") + 3)
    t = t0 + (s + 1) * (1 - t0) / 2
    if t >= 1:
        return 1 / mpmath.sqrt(mpmath.pi)
    x = 6 / (1 - t) - 3
    return mpmath.exp(x * x) * mpmath.erfc(x) * (x + 3)


def main():
    for name, (f, to_x) in SERIES.items():
        coeffs = chebyshev_coefficients(f, to_x)
        print(f"{name} = (")
        for i in range(0, len(coeffs), 3):
            print("    " + " ".join(f"{mpmath.nstr(c, 17, min_fixed=0, max_fixed=0)}," for c in coeffs[i:i + 3]))
        print(")")
    coeffs = chebyshev_coefficients(erfcx_tail, lambda s: s)[:16]
    print("ERFCX_TAIL = {" + ", ".join(mpmath.nstr(c, 17, min_fixed=0, max_fixed=0) for c in coeffs) + "}")
    print(f"DIGAMMA_10 = {mpmath.nstr(mpmath.digamma(10), 20)}")


if __name__ == "__main__":
    main()
