"""Integer loops whose trip count follows the values, for Triton kernels: eager's integer
power (``tf_helpers.pow_int``, ATen's powi) and gcd (``tf_helpers.gcd``, ATen's calc_gcd).
The C++ backend's twins are in cpu_backend/include/tf_int.h.

Each lane has its own trip count: the block loops while any lane is still running, and a
lane that is done keeps its value. Arithmetic stays in the operands' dtype and wraps, as
eager's does (Triton emits add/mul without nsw; the interpreter computes in numpy).
"""
import triton
import triton.language as tl


@triton.jit
def _any(running):
    return tl.max(running.to(tl.int32)) > 0


@triton.jit
def _magnitude(x):
    """|x| in x's dtype: |INT_MIN| stays INT_MIN, as C++'s std::abs gives it."""
    if x.dtype.is_int_signed():
        return tl.where(x < 0, -x, x)
    return x


@triton.jit
def pow_int(a, b):
    """a ** b by repeated squaring; for b < 0: 1 where a == 1, +-1 where a == -1, else 0."""
    a, b = tl.broadcast(a, b)   # a literal operand arrives as a [1] block
    result = tl.full(a.shape, 1, a.dtype)
    base = a
    exponent = b
    if b.dtype.is_int_signed():
        exponent = tl.where(b < 0, 0, b)
    while _any(exponent != 0):
        result = tl.where((exponent & 1) != 0, result * base, result)
        exponent = exponent >> 1
        base = base * base
    if b.dtype.is_int_signed():
        one = tl.full(a.shape, 1, a.dtype)
        zero = tl.full(a.shape, 0, a.dtype)
        sign = tl.where((b & 1) != 0, -one, one)
        negative_power = tl.where(a == 1, one, tl.where(a == -1, sign, zero))
        result = tl.where(b < 0, negative_power, result)
    return result


@triton.jit
def gcd(a, b):
    """Euclid's loop on |a|, |b| with C's truncating remainder, as ATen's calc_gcd."""
    a, b = tl.broadcast(a, b)
    a = _magnitude(a)
    b = _magnitude(b)
    while _any(a != 0):
        running = a != 0
        remainder = b % tl.where(running, a, 1)
        b = tl.where(running, a, b)
        a = tl.where(running, remainder, a)
    return b
