"""The op table: every IR-level op, declared once.

Loop bodies call these through the virtual ``ops`` handler. Each entry gives the arity
and how the result dtype follows from the operands:

    SAME  the operands' dtype (lowering casts operands to one compute dtype first)
    BOOL  torch.bool
    ARG   given explicitly by the call (constant, index_expr, to_dtype, load)

A backend spells every primitive (see its overrides table); composite ops below are
written once in terms of primitives and never reach a backend.
"""
from dataclasses import dataclass

import torch

from .virtualized import ops

SAME, BOOL, ARG = "same", "bool", "arg"


@dataclass(frozen=True)
class OpSpec:
    name: str
    arity: int
    result: str


def _specs(result, arity, names):
    return {name: OpSpec(name, arity, result) for name in names.split()}


SPECIAL_LOOPS = ("chebyshev_loop", "hermite_h_loop", "hermite_he_loop", "laguerre_loop", "legendre_loop")

PRIMITIVES = {
    **_specs(SAME, 1, "neg abs exp exp2 expm1 log log2 log1p sqrt rsqrt sin cos tan tanh "
                      "sigmoid erf floor ceil trunc round reciprocal bitwise_not"),
    **_specs(SAME, 2, "add sub mul truediv truncdiv mod pow maximum minimum "
                      "bitwise_and bitwise_or bitwise_xor lshift rshift"),
    **_specs(BOOL, 1, "isnan logical_not"),
    **_specs(BOOL, 2, "eq ne lt le gt ge logical_and logical_or"),
    "where": OpSpec("where", 3, SAME),
    # math beyond the basics (lowering/pointwise_math.py): floating point operands only
    **_specs(SAME, 1, "asin acos atan sinh cosh asinh acosh atanh log10 erfc erfcx lgamma"),
    **_specs(SAME, 2, "atan2 hypot copysign nextafter"),
    **_specs(BOOL, 1, "signbit"),
    # loops whose trip count is a value (x or the recurrence's factor, the degree n as a float,
    # the degree-1 value): the recurrences of torch.special's orthogonal polynomials, each as
    # ATen's Math.h runs it; special cases around them are composites (special_polynomials.py)
    **_specs(SAME, 3, " ".join(SPECIAL_LOOPS)),
    "zeta": OpSpec("zeta", 2, SAME),   # Hurwitz zeta(x, q): a series run until it converges
    "airy_ai_series": OpSpec("airy_ai_series", 1, SAME),   # Airy Ai's power series, likewise
    # the incomplete gamma functions' loops (a, x), run until they converge (special_igamma.py)
    **_specs(SAME, 2, "igamma_series igammac_series igammac_fraction"),
    # Euclid's loop on |a|, |b| (ATen's calc_gcd), integer operands only. (``pow`` of
    # integers is eager's integer power: repeated squaring, 0 for negative exponents but
    # those of 1 and -1.)
    "gcd": OpSpec("gcd", 2, SAME),
    # special forms, handled by every backend explicitly
    "constant": OpSpec("constant", 2, ARG),     # (value, dtype)
    "index_expr": OpSpec("index_expr", 2, ARG),  # (sympy expr, dtype)
    "to_dtype": OpSpec("to_dtype", 2, ARG),      # (value, dtype)
    "load": OpSpec("load", 2, ARG),              # (buffer name, sympy index)
    "store": OpSpec("store", 3, ARG),            # (buffer name, sympy index, value)
    "reduction": OpSpec("reduction", 4, ARG),    # (dtype, src_dtype, reduction_type, value)
    "store_reduction": OpSpec("store_reduction", 3, ARG),
    "indirect_indexing": OpSpec("indirect_indexing", 2, ARG),  # (value, size) -> sympy symbol
    "masked": OpSpec("masked", 3, ARG),          # (mask, body_fn, other)
    # ---- indirect writes and scans (lowering/indexing.py, lowering/scan.py) ----
    "store_scatter": OpSpec("store_scatter", 4, ARG),  # (buffer name, sympy index, value, mode in SCATTER_MODES)
    "scan": OpSpec("scan", 3, ARG),              # (dtype, scan_type in SCAN_TYPES, value) -> the running value
}

# welford_mean / welford_m2: the mean and the sum of squared deviations of the values,
# from one Welford pass (backends share one accumulator between the two)
# sumexp: sum(exp(v - max(v))) in one pass (online softmax; only backends that ask for it)
REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "welford_mean", "welford_m2",
                   "sumexp")


REDUCTION_IDENTITY = {"sum": 0, "prod": 1, "any": False, "all": True}

# How store_scatter combines a value with the element it lands on: None overwrites it.
SCATTER_MODES = (None, "sum", "prod", "max", "min")
# The combine ops of inclusive scans; logaddexp is log(exp(a) + exp(b)) (logcumsumexp);
# argmax/argmin give the position of the running max/min along the scanned dim (int64;
# a NaN always takes over, a later equal value wins: cummax/cummin's indices).
SCAN_TYPES = ("sum", "prod", "logaddexp", "max", "min", "argmax", "argmin")


def reduction_identity(reduction_type, dtype):
    """The value a reduction starts from (and fills masked lanes with)."""
    if reduction_type in REDUCTION_IDENTITY:
        return REDUCTION_IDENTITY[reduction_type]
    if reduction_type in ("max", "argmax"):
        return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min
    if reduction_type in ("min", "argmin"):
        return float("inf") if dtype.is_floating_point else torch.iinfo(dtype).max
    if reduction_type == "logaddexp":
        return float("-inf")
    raise ValueError(f"no identity for reduction {reduction_type!r}")


# ---- composite ops: written once in terms of primitives -------------------------------

def floordiv(a, b, dtype):
    """Python floor division for integers (C truncation corrected), floor(a/b) for floats."""
    if dtype.is_floating_point:
        return ops.floor(ops.truediv(a, b))
    quotient = ops.truncdiv(a, b)
    zero = ops.constant(0, dtype)
    inexact = ops.ne(ops.mod(a, b), zero)
    signs_differ = ops.ne(ops.lt(a, zero), ops.lt(b, zero))
    adjust = ops.logical_and(inexact, signs_differ)
    return ops.where(adjust, ops.sub(quotient, ops.constant(1, dtype)), quotient)


def remainder(a, b, dtype):
    """Python modulo: the result takes the divisor's sign."""
    rem = ops.mod(a, b)
    zero = ops.constant(0, dtype)
    nonzero = ops.ne(rem, zero)
    signs_differ = ops.ne(ops.lt(rem, zero), ops.lt(b, zero))
    return ops.where(ops.logical_and(nonzero, signs_differ), ops.add(rem, b), rem)


def sign(x, dtype):
    if dtype == torch.bool:
        return x
    zero = ops.constant(0, dtype)
    positive = ops.to_dtype(ops.gt(x, zero), dtype)
    negative = ops.to_dtype(ops.lt(x, zero), dtype)
    return ops.sub(positive, negative)  # sign(nan) is 0, as in eager


def isinf(x, dtype):
    return ops.eq(ops.abs(x), ops.constant(float("inf"), dtype))


def relu(x, dtype):
    return ops.maximum(x, ops.constant(0, dtype))


def logical_xor(a, b):
    return ops.ne(a, b)


def round_decimals(x, decimals, dtype):
    scale = ops.constant(10.0 ** decimals, dtype)
    return ops.truediv(ops.round(ops.mul(x, scale)), scale)
