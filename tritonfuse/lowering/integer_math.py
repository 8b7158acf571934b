"""Integer-only pointwise ops: gcd and lcm, as ATen's CPU and CUDA kernels compute them.

    gcd(a, b)  Euclid's loop on |a|, |b| (the op table's ``gcd``; |INT_MIN| stays INT_MIN,
               so gcd(INT_MIN, 0) is INT_MIN and gcd(INT_MIN, 6) is -2, as eager's)
    lcm(a, b)  0 where gcd(a, b) == 0, else |a / gcd * b| with C's truncating division,
               wrapping in the dtype; int8/int16/uint8 compute in int, as C++ promotes
               them (eager's |40 * 5| is 200, int8 -56; wrapping first would give 56)
"""
import torch

from ..virtualized import ops
from .registry import DEFAULT, Unsupported, aten, make_pointwise, register_lowering

# dtypes whose arithmetic C++ carries out in int
_PROMOTED_TO_INT = {torch.int8, torch.int16, torch.uint8}


def _check_integer(dtype, name):
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise Unsupported(f"{name} of {dtype} (eager takes integers only)")


@register_lowering(aten.gcd, broadcast=True, type_promotion=DEFAULT)
def gcd(a, b, compute_dtype, result_dtype):
    _check_integer(compute_dtype, "gcd")
    return make_pointwise(lambda x, y: ops.gcd(x, y), [a, b], compute_dtype, result_dtype, origin="gcd")


def _lcm(a, b, dtype):
    zero = ops.constant(0, dtype)
    divisor = ops.gcd(a, b)
    no_divisor = ops.eq(divisor, zero)
    divisor = ops.where(no_divisor, ops.constant(1, dtype), divisor)   # lanes that give 0
    work = torch.int32 if dtype in _PROMOTED_TO_INT else dtype
    a, b, divisor = (ops.to_dtype(v, work) for v in (a, b, divisor))
    product = ops.to_dtype(ops.abs(ops.mul(ops.truncdiv(a, divisor), b)), dtype)
    return ops.where(no_divisor, zero, product)


@register_lowering(aten.lcm, broadcast=True, type_promotion=DEFAULT)
def lcm(a, b, compute_dtype, result_dtype):
    _check_integer(compute_dtype, "lcm")
    return make_pointwise(lambda x, y: _lcm(x, y, compute_dtype), [a, b], compute_dtype, result_dtype,
                          origin="lcm")
