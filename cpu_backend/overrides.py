"""How the C++ backend spells each primitive of the op table. tf:: functions are
overloaded for scalars and tf::Vec, so one spelling serves both the vectorized loops
and the scalar row-wise code. float16/bfloat16 values are computed as float."""
import torch

from tritonfuse.ops_table import BOOL, PRIMITIVES, SPECIAL_LOOPS

from .common import STORAGE_TYPES

CPP_OPS = {
    "neg": "(-{0})",
    "abs": "tf::abs({0})",
    "exp": "tf::exp({0})",
    "exp2": "tf::exp2({0})",
    "expm1": "tf::expm1({0})",
    "log": "tf::log({0})",
    "log2": "tf::log2({0})",
    "log1p": "tf::log1p({0})",
    "sqrt": "tf::sqrt({0})",
    "rsqrt": "tf::rsqrt({0})",
    "sin": "tf::sin({0})",
    "cos": "tf::cos({0})",
    "tan": "tf::tan({0})",
    "tanh": "tf::tanh({0})",
    "sigmoid": "tf::sigmoid({0})",
    "erf": "tf::erf({0})",
    "floor": "tf::floor({0})",
    "ceil": "tf::ceil({0})",
    "trunc": "tf::trunc({0})",
    "round": "tf::round({0})",
    "reciprocal": "tf::reciprocal({0})",
    "bitwise_not": "(~{0})",
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "truediv": "({0} / {1})",
    "truncdiv": "({0} / {1})",
    "mod": "tf::fmod({0}, {1})",
    "pow": "tf::pow({0}, {1})",
    "maximum": "tf::maximum({0}, {1})",
    "minimum": "tf::minimum({0}, {1})",
    "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})",
    "lshift": "({0} << {1})",
    "rshift": "({0} >> {1})",
    "isnan": "tf::isnan({0})",
    "logical_not": "(!{0})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
    "logical_and": "({0} && {1})",
    "logical_or": "({0} || {1})",
    "where": "tf::where({0}, {1}, {2})",
}

# ---- math beyond the basics (lowering/pointwise_math.py; include/tf_vec_special.h)
CPP_OPS.update({name: f"tf::{name}({{0}})" for name in (
    "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log10", "erfc", "erfcx", "lgamma",
    "signbit")})
CPP_OPS.update({name: f"tf::{name}({{0}}, {{1}})" for name in ("atan2", "hypot", "copysign", "nextafter")})
# the polynomial recurrences (include/tf_special_loops.h)
CPP_OPS.update({name: f"tf::{name}({{0}}, {{1}}, {{2}})" for name in SPECIAL_LOOPS})
CPP_OPS["gcd"] = "tf::gcd({0}, {1})"   # integers only (include/tf_int.h)
CPP_OPS["zeta"] = "tf::zeta({0}, {1})"
CPP_OPS["airy_ai_series"] = "tf::airy_ai_series({0})"
CPP_OPS.update({name: f"tf::{name}({{0}}, {{1}})" for name in ("igamma_series", "igammac_series", "igammac_fraction")})
# ---- end of the math block


# ---- integers: eager's semantics (cpu_backend/include/tf_int.h) ------------------------
# Spellings that differ from the floating-point ones. Shifts by amounts < 0 or >= the bit
# width give what eager gives (C++ leaves them undefined).
CPP_INTEGER_OPS = {
    "abs": "tf::where({0} < 0, -{0}, {0})",
    "lshift": "tf::shift_left({0}, {1})",
    "rshift": "tf::shift_right({0}, {1})",
    "pow": "tf::pow_int({0}, {1})",   # eager's integer power (a loop per lane)
}

# Integer division and remainder (truncating, like C), spelled by the kernel with the
# lanes that hold elements ({active}: tails and masked-off lanes excluded): a zero divisor
# there sets the kernel's zero_division flag, and the wrapper raises eager's error.
# INT_MIN / -1 wraps; nothing traps.
CPP_CHECKED_DIVISION = {
    "truncdiv": "tf::div_trunc({0}, {1}, {active}, zero_division)",
    "mod": "tf::mod_trunc({0}, {1}, {active}, zero_division)",
}

# C++ computes scalar int8/int16/uint8 arithmetic in int: these results are wrapped back
# to the dtype (vector lanes already hold it). Kernels are built with -fwrapv, so
# int32/int64 arithmetic wraps as two's complement, as eager's does.
NARROW_INTEGER_TYPES = {torch.int8, torch.int16, torch.uint8}
WRAPPED_INTEGER_OPS = {"neg", "abs", "add", "sub", "mul", "bitwise_not", "bitwise_and", "bitwise_or",
                       "bitwise_xor", "lshift", "rshift"}


def is_integer(dtype) -> bool:
    return not dtype.is_floating_point and dtype != torch.bool


def cpp_op(op_name, dtype, vec=False):
    if not is_integer(dtype):
        return CPP_OPS.get(op_name)
    template = CPP_INTEGER_OPS.get(op_name, CPP_OPS.get(op_name))
    if not vec and dtype in NARROW_INTEGER_TYPES and op_name in WRAPPED_INTEGER_OPS:
        return f"tf::wrap<{STORAGE_TYPES[dtype]}>({template})"
    return template


def cpp_result_dtype(op_name, operands):
    if PRIMITIVES[op_name].result == BOOL:
        return torch.bool
    if op_name == "where":
        return operands[1].dtype
    return operands[0].dtype
