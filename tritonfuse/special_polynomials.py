"""torch.special's orthogonal polynomials P_n(x), written once in terms of the op table:
the special cases of ATen's Math.h as a chain of ``where``s (checked in Math.h's order:
the first that holds wins) around one recurrence loop primitive (ops.chebyshev_loop ...,
which each backend spells: cpu_backend/include/tf_special_loops.h,
tritonfuse/runtime/triton_special.py).

    chebyshev_polynomial_{t,u,v,w}(x, n)           closed forms in acos(x) for |x| < 1, large n
    shifted_chebyshev_polynomial_{t,u,v,w}(x, n)   the same in y = 2x - 1
    hermite_polynomial_{h,he}(x, n)                NaN above n = 128 (float32) / 512 (float64)
    laguerre_polynomial_l(x, n), legendre_polynomial_p(x, n)

The degree is a float tensor in eager too, read as ``static_cast<int64_t>(n)``, truncated,
which each device converts its own way where it is NaN or out of int64's range:
- CPU (x86): INT64_MIN, negative, so P = 0;
- CUDA (saturating): +inf and n >= 2**63 give INT64_MAX, an odd degree whose ``n + 1`` and
  ``n + n + 1`` wrap around in int64 as eager's do; NaN, -inf and n <= -2**63 give
  INT64_MIN (P = 0), as on x86 (measured on an H200). Where such a degree reaches the recurrence, eager's CUDA
  kernel steps 2**63 times (it ends only where a NaN check stops it); those lanes give NaN.
Lanes that take a special case run the loop with n = 0 (no steps). Where eager's result is
undefined (x NaN: Math.h returns an unset variable) this gives NaN; the closed forms for
large n multiply the last-ulp differences of acos between libms by n, as eager's own
float32 and float64 results differ there.
"""
import torch

from .virtualized import ops

INT64_LIMIT = 2.0 ** 63


def _c(value, dtype):
    return ops.constant(value, dtype)


class _Degree:
    """The degree n as eager reads it on the device, and the tests on it (values of
    ``dtype``). ``saturating``: CUDA's conversion (module docstring); else x86's."""

    def __init__(self, n, dtype, saturating=False):
        self.dtype = dtype
        in_range = ops.lt(ops.abs(n), _c(INT64_LIMIT, dtype))       # false for NaN and inf
        if saturating:
            self.saturated = ops.logical_and(ops.logical_not(in_range), ops.gt(n, _c(0.0, dtype)))
            self.n = ops.where(in_range, ops.trunc(n),
                               ops.where(self.saturated, _c(INT64_LIMIT, dtype), _c(-INT64_LIMIT, dtype)))
            # INT64_MAX is odd; 2**63 (its value as a float) is even
            self.even = ops.logical_and(ops.logical_not(self.saturated),
                                        ops.eq(ops.mod(self.n, _c(2.0, dtype)), _c(0.0, dtype)))
        else:
            self.saturated = None
            self.n = ops.where(in_range, ops.trunc(n), _c(-1.0, dtype))
            self.even = ops.eq(ops.mod(self.n, _c(2.0, dtype)), _c(0.0, dtype))
        self.negative = ops.lt(self.n, _c(0.0, dtype))

    def equals(self, value):
        return ops.eq(self.n, _c(float(value), self.dtype))

    def above(self, value):
        return ops.gt(self.n, _c(float(value), self.dtype))

    def _wrapping(self, value, wrapped):
        """value, or ``wrapped`` (eager's int64 overflow) where the degree saturated."""
        if self.saturated is None:
            return value
        return ops.where(self.saturated, _c(wrapped, self.dtype), value)

    def plus(self, value):
        """n + value: in int64 for an integer value (INT64_MAX + 1 wraps to INT64_MIN)."""
        total = ops.add(self.n, _c(float(value), self.dtype))
        return self._wrapping(total, -INT64_LIMIT) if float(value).is_integer() and value else total

    def twice_plus_one(self):
        """n + n + 1 in int64 (-1 for INT64_MAX)."""
        total = ops.add(ops.add(self.n, self.n), _c(1.0, self.dtype))
        return self._wrapping(total, -1.0)

    def odd_sign(self, value):
        """value for an even n, -value for an odd one."""
        return ops.where(self.even, value, ops.neg(value))

    def endless(self, looping):
        """Lanes whose recurrence eager would step 2**63 times (NaN here), or None."""
        return None if self.saturated is None else ops.logical_and(looping, self.saturated)


def _cases(cases, otherwise):
    """where(c1, v1, where(c2, v2, ... otherwise)): the first case that holds wins."""
    result = otherwise
    for condition, value in reversed(cases):
        result = ops.where(condition, value, result)
    return result


def _loop(loop_name, factor, degree, taken_elsewhere, first):
    """The recurrence for the lanes no special case takes (n = 0 for the others)."""
    endless = degree.endless(ops.logical_not(taken_elsewhere))
    if endless is not None:
        taken_elsewhere = ops.logical_or(taken_elsewhere, endless)
    steps = ops.where(taken_elsewhere, _c(0.0, degree.dtype), degree.n)
    result = getattr(ops, loop_name)(factor, steps, first)
    return result if endless is None else ops.where(endless, _c(float("nan"), degree.dtype), result)


def _any(conditions):
    result = conditions[0]
    for condition in conditions[1:]:
        result = ops.logical_or(result, condition)
    return result


def _chebyshev(x, y, n, dtype, kind, shifted, saturating):
    """Chebyshev polynomials of the four kinds at y (y = x, or 2x - 1 shifted): the edge
    values at y = +-1 (x == 1, x == 0 shifted), the closed form for |y| < 1 and n above a
    threshold, n = 0 and 1, then the recurrence from the degree-1 value."""
    d = _Degree(n, dtype, saturating)
    one, zero, two = _c(1.0, dtype), _c(0.0, dtype), _c(2.0, dtype)
    if shifted:
        top, bottom = ops.eq(x, one), ops.eq(x, zero)
    else:
        at_one = ops.eq(ops.abs(x), one)
        positive = ops.gt(x, zero)
        top, bottom = ops.logical_and(at_one, positive), ops.logical_and(at_one, ops.logical_not(positive))
    twice_plus_one = d.twice_plus_one()
    theta = ops.acos(y)
    half = ops.truediv(theta, two)
    if kind == "t":
        at_top, at_bottom = one, d.odd_sign(one)
        closed = ops.cos(ops.mul(d.n, theta))
        degree_one = y
    elif kind == "u":
        at_top, at_bottom = d.plus(1.0), d.odd_sign(d.plus(1.0))
        sine = ops.sin(theta)
        closed = ops.where(ops.ne(sine, zero), ops.truediv(ops.sin(ops.mul(d.plus(1.0), theta)), sine),
                           ops.truediv(ops.mul(d.plus(1.0), ops.cos(ops.mul(d.plus(1.0), theta))), y))
        degree_one = ops.add(y, y)
    elif kind == "v":
        at_top, at_bottom = one, d.odd_sign(twice_plus_one)
        closed = ops.where(ops.ne(ops.sin(half), one),
                           ops.truediv(ops.cos(ops.mul(d.plus(0.5), theta)), ops.cos(half)), at_bottom)
        degree_one = ops.sub(ops.add(y, y), one)
    else:   # "w"
        at_top, at_bottom = twice_plus_one, d.odd_sign(one)
        closed_edge = ops.where(ops.gt(x, zero), at_top, at_bottom) if not shifted else at_bottom
        closed = ops.where(ops.ne(ops.cos(half), one),
                           ops.truediv(ops.sin(ops.mul(d.plus(0.5), theta)), ops.sin(half)), closed_edge)
        degree_one = ops.add(ops.add(y, y), one)
    threshold = {("t", False): 6, ("u", False): 8, ("v", False): 8, ("w", False): 8,
                 ("t", True): 6, ("u", True): 6, ("v", True): 6, ("w", True): 4}[(kind, shifted)]
    use_closed = ops.logical_and(d.above(threshold), ops.lt(ops.abs(y), one))
    is_zero, is_one = d.equals(0), d.equals(1)
    special = [(d.negative, zero), (top, at_top), (bottom, at_bottom), (use_closed, closed),
               (is_zero, one), (is_one, degree_one)]
    looped = _loop("chebyshev_loop", ops.add(y, y), d, _any([c for c, _ in special]), degree_one)
    return _cases(special, looped)


def _chebyshev_op(kind, shifted):
    def polynomial(x, n, dtype, saturating=False):
        y = ops.sub(ops.add(x, x), _c(1.0, dtype)) if shifted else x
        return _chebyshev(x, y, n, dtype, kind, shifted, saturating)
    polynomial.__name__ = f"{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}"
    return polynomial


chebyshev_polynomial_t = _chebyshev_op("t", False)
chebyshev_polynomial_u = _chebyshev_op("u", False)
chebyshev_polynomial_v = _chebyshev_op("v", False)
chebyshev_polynomial_w = _chebyshev_op("w", False)
shifted_chebyshev_polynomial_t = _chebyshev_op("t", True)
shifted_chebyshev_polynomial_u = _chebyshev_op("u", True)
shifted_chebyshev_polynomial_v = _chebyshev_op("v", True)
shifted_chebyshev_polynomial_w = _chebyshev_op("w", True)


def _hermite(x, n, dtype, loop_name, degree_one, saturating):
    d = _Degree(n, dtype, saturating)
    limit = 512 if dtype == torch.float64 else 128     # ATen's getHermitianLimit
    special = [(d.negative, _c(0.0, dtype)), (d.equals(0), _c(1.0, dtype)), (d.equals(1), degree_one),
               (d.above(limit), _c(float("nan"), dtype))]
    looped = _loop(loop_name, x, d, _any([c for c, _ in special]), degree_one)
    return _cases(special, looped)


def hermite_polynomial_h(x, n, dtype, saturating=False):
    return _hermite(x, n, dtype, "hermite_h_loop", ops.add(x, x), saturating)


def hermite_polynomial_he(x, n, dtype, saturating=False):
    return _hermite(x, n, dtype, "hermite_he_loop", x, saturating)


def laguerre_polynomial_l(x, n, dtype, saturating=False):
    d = _Degree(n, dtype, saturating)
    one = _c(1.0, dtype)
    degree_one = ops.sub(one, x)
    special = [(d.negative, _c(0.0, dtype)), (ops.eq(ops.abs(x), _c(0.0, dtype)), one), (d.equals(0), one),
               (d.equals(1), degree_one)]
    looped = _loop("laguerre_loop", x, d, _any([c for c, _ in special]), degree_one)
    return _cases(special, looped)


def legendre_polynomial_p(x, n, dtype, saturating=False):
    d = _Degree(n, dtype, saturating)
    one = _c(1.0, dtype)
    at_one = ops.eq(ops.abs(x), one)
    edge = ops.where(ops.logical_or(ops.gt(x, _c(0.0, dtype)), d.even), one, ops.neg(one))
    special = [(d.negative, _c(0.0, dtype)), (at_one, edge), (d.equals(0), one), (d.equals(1), x)]
    looped = _loop("legendre_loop", x, d, _any([c for c, _ in special]), x)
    return _cases(special, looped)

