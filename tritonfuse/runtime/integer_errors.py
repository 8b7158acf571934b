"""The error eager raises for an integer division by zero on the CPU.

Eager's CPU kernels for ``//``, ``%``, ``torch.div(..., rounding_mode=...)``, ``fmod`` and
``remainder`` on integer tensors raise ``RuntimeError("ZeroDivisionError")`` when a
divisor is zero (CUDA kernels raise nothing). Generated C++ kernels return whether one
of their integer divisions met a zero divisor, and the wrapper raises this: a
RuntimeError with eager's message, which is also a Python ZeroDivisionError.
"""


class IntegerDivisionByZero(RuntimeError, ZeroDivisionError):
    pass


def raise_integer_division_by_zero():
    raise IntegerDivisionByZero("ZeroDivisionError")
