"""How the Triton backend spells each primitive of the op table. Values of float16 and
bfloat16 tensors are computed in float32 (loads upcast, stores round), so math here
sees float32, float64, integers and bools only."""
import torch

from ...ops_table import SPECIAL_LOOPS

TRITON_TYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

# {0}, {1}, {2} are the operands.
TRITON_OPS = {
    "neg": "-{0}",
    "abs": "tl.abs({0})",
    "exp": "tl.exp({0})",
    "exp2": "tl.exp2({0})",
    "expm1": "libdevice.expm1({0})",
    "log": "tl.log({0})",
    "log2": "tl.log2({0})",
    "log1p": "libdevice.log1p({0})",
    "sqrt": "tf_helpers.sqrt({0})",   # tl.sqrt_rn takes float32 only; see triton_helpers.sqrt
    "rsqrt": "libdevice.rsqrt({0})",
    "sin": "libdevice.sin({0})",   # tl.sin/tl.cos are the fast approximate PTX forms
    "cos": "libdevice.cos({0})",
    "tan": "libdevice.tan({0})",
    "tanh": "libdevice.tanh({0})",
    "sigmoid": "tl.sigmoid({0})",
    "erf": "tl.erf({0})",
    "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})",
    "trunc": "libdevice.trunc({0})",
    "round": "libdevice.nearbyint({0})",
    "reciprocal": "(1.0 / {0})",
    "bitwise_not": "~{0}",
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "truediv": "{0} / {1}",
    "truncdiv": "{0} // {1}",
    "mod": "{0} % {1}",
    "pow": "libdevice.pow({0}, {1})",
    "maximum": "tf_helpers.maximum({0}, {1})",
    "minimum": "tf_helpers.minimum({0}, {1})",
    "bitwise_and": "{0} & {1}",
    "bitwise_or": "{0} | {1}",
    "bitwise_xor": "{0} ^ {1}",
    "lshift": "{0} << {1}",
    "rshift": "{0} >> {1}",
    "isnan": "({0} != {0})",
    "logical_not": "({0} == 0)",
    "eq": "{0} == {1}",
    "ne": "{0} != {1}",
    "lt": "{0} < {1}",
    "le": "{0} <= {1}",
    "gt": "{0} > {1}",
    "ge": "{0} >= {1}",
    "logical_and": "{0} & {1}",
    "logical_or": "{0} | {1}",
    "where": "tl.where({0}, {1}, {2})",
}

# ---- math beyond the basics (lowering/pointwise_math.py): libdevice's float32/float64 functions
TRITON_OPS.update({
    "asin": "libdevice.asin({0})",
    "acos": "libdevice.acos({0})",
    "atan": "libdevice.atan({0})",
    "sinh": "libdevice.sinh({0})",
    "cosh": "libdevice.cosh({0})",
    "asinh": "libdevice.asinh({0})",
    "acosh": "libdevice.acosh({0})",
    "atanh": "libdevice.atanh({0})",
    "log10": "libdevice.log10({0})",
    "erfc": "libdevice.erfc({0})",
    "erfcx": "libdevice.erfcx({0})",
    "lgamma": "libdevice.lgamma({0})",
    "atan2": "libdevice.atan2({0}, {1})",
    "hypot": "libdevice.hypot({0}, {1})",
    "copysign": "libdevice.copysign({0}, {1})",
    "nextafter": "libdevice.nextafter({0}, {1})",
    "signbit": "(libdevice.signbit({0}) != 0)",
})
# the polynomial recurrences: loops with a per-lane trip count (runtime/triton_special.py)
TRITON_OPS.update({name: f"tf_helpers.{name}({{0}}, {{1}}, {{2}})" for name in SPECIAL_LOOPS})
TRITON_OPS["gcd"] = "tf_helpers.gcd({0}, {1})"   # integers only (runtime/triton_integer.py)
TRITON_OPS["zeta"] = "tf_helpers.zeta({0}, {1})"
TRITON_OPS["airy_ai_series"] = "tf_helpers.airy_ai_series({0})"
TRITON_OPS.update({name: f"tf_helpers.{name}({{0}}, {{1}})"
                   for name in ("igamma_series", "igammac_series", "igammac_fraction")})
# ---- end of the math block

# Triton's interpreter has no libdevice: these ops use the pure-tl versions in tf_helpers.
INTERPRETER_OPS = dict(
    TRITON_OPS,
    expm1="tf_helpers.expm1({0})",
    log1p="tf_helpers.log1p({0})",
    rsqrt="tf_helpers.rsqrt({0})",
    tan="tf_helpers.tan({0})",
    sin="tl.sin({0})",
    cos="tl.cos({0})",
    tanh="tf_helpers.tanh({0})",
    trunc="tf_helpers.trunc({0})",
    round="tf_helpers.nearbyint({0})",
    pow="tf_helpers.pow({0}, {1})",
    # bfloat16 <-> float32 conversions of loads and stores: compiled, a store rounds to the
    # nearest (ties to even) and subnormals are kept; the interpreter truncates and flushes
    # subnormals to zero, so these convert bit by bit
    load_bfloat16="tf_helpers.bfloat16_to_float32({0})",
    store_bfloat16="tf_helpers.round_to_bfloat16({0})",
)

# ---- math beyond the basics, for the interpreter: pure-tl versions (runtime/triton_math.py)
INTERPRETER_OPS.update({name: f"tf_helpers.{name}({{0}})" for name in (
    "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log10", "erfc", "erfcx", "lgamma",
    "signbit")})
INTERPRETER_OPS.update({name: f"tf_helpers.{name}({{0}}, {{1}})" for name in (
    "atan2", "hypot", "copysign", "nextafter")})
# ---- end of the math block

# ---- integers -------------------------------------------------------------------------
# Division and shifts by an operand that is not a literal go through helpers that keep
# off LLVM's undefined cases (a zero divisor, INT_MIN // -1, shift amounts outside
# [0, bits)) and give eager's values there; see runtime/triton_helpers.py. Signed
# arithmetic wraps: Triton emits LLVM add/sub/mul without nsw, and the interpreter computes
# in numpy, which wraps.
TRITON_INTEGER_DIVISION = {
    "truncdiv": "tf_helpers.div_trunc({0}, {1})",
    "mod": "tf_helpers.mod_trunc({0}, {1})",
}
# Integer pow is eager's integer power, a loop with a per-lane trip count (runtime/triton_integer.py).
TRITON_INTEGER_LOOPS = {
    "pow": "tf_helpers.pow_int({0}, {1})",
}
TRITON_INTEGER_SHIFTS = {
    "lshift": "tf_helpers.shift_left({0}, {1})",
    "rshift": "tf_helpers.shift_right({0}, {1})",
}


def shift_by_constant(op_name, dtype, amount):
    """The spelling of a shift by a literal amount: eager's value outside [0, bits)."""
    bits = torch.iinfo(dtype).bits
    if 0 <= amount < bits:
        return TRITON_OPS[op_name]
    if op_name == "rshift" and dtype.is_signed:
        return f"{{0}} >> {bits - 1}"
    return "{0} * 0"
