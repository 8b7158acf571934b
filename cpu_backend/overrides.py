"""How the C++ backend spells each primitive of the op table. tf:: functions are
overloaded for scalars and tf::Vec, so one spelling serves both the vectorized loops
and the scalar row-wise code. float16/bfloat16 values are computed as float."""
import torch

from tritonfuse.ops_table import BOOL, PRIMITIVES

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
# ---- end of the math block


# integer spellings that differ from the floating-point ones
CPP_INTEGER_OPS = {"mod": "({0} % {1})", "abs": "tf::where({0} < 0, -{0}, {0})"}


def cpp_op(op_name, dtype):
    if not dtype.is_floating_point and op_name in CPP_INTEGER_OPS:
        return CPP_INTEGER_OPS[op_name]
    return CPP_OPS.get(op_name)


def cpp_result_dtype(op_name, operands):
    if PRIMITIVES[op_name].result == BOOL:
        return torch.bool
    if op_name == "where":
        return operands[1].dtype
    return operands[0].dtype
