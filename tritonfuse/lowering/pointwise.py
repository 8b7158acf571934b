"""Lowerings of elementwise aten ops. Broadcasting and eager's type promotion happen in
``register_lowering``; each lowering here only says what to compute."""
import math

import torch

from .. import ops_table
from ..ir import TensorBox
from ..virtualized import ops
from .registry import (
    ALWAYS_BOOL, BOOL_TO_LONG, DEFAULT, INT_TO_FLOAT, NO_OPMATH, Unsupported, aten,
    broadcast_operands, make_pointwise, promote_types, register_lowering,
)


def register_pointwise(aten_op, body, kind=DEFAULT):
    """Register ``body(*values, dtype)`` as the lowering of ``aten_op``; ``dtype`` is the
    computation dtype the values arrive in."""
    name = str(aten_op).split(".")[-1]

    @register_lowering(aten_op, broadcast=True, type_promotion=kind)
    def lowering(*args, compute_dtype, result_dtype):
        return make_pointwise(lambda *values: body(*values, compute_dtype), args,
                              compute_dtype, result_dtype, origin=name)
    return lowering


def _unary(op_name):
    return lambda x, dtype: getattr(ops, op_name)(x)


def _binary(op_name):
    return lambda a, b, dtype: getattr(ops, op_name)(a, b)


for _name in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos",
              "tan", "tanh", "sigmoid", "erf", "reciprocal"):
    register_pointwise(getattr(aten, _name), _unary(_name), INT_TO_FLOAT)

register_pointwise(aten.neg, _unary("neg"))
register_pointwise(aten.abs, lambda x, dtype: x if dtype == torch.bool else ops.abs(x))
register_pointwise(aten.sign, ops_table.sign)
register_pointwise(aten.sgn, ops_table.sign)   # complex tensors decline (dtype) and fall back
register_pointwise(aten.relu, ops_table.relu)
register_pointwise(aten.maximum, _binary("maximum"))
register_pointwise(aten.minimum, _binary("minimum"))
register_pointwise(aten.mul, lambda a, b, dtype: ops.logical_and(a, b) if dtype == torch.bool else ops.mul(a, b))
register_pointwise(aten.fmod, _binary("mod"))
register_pointwise(aten.remainder, ops_table.remainder)
register_pointwise(aten.bitwise_and, _binary("bitwise_and"))
register_pointwise(aten.bitwise_or, _binary("bitwise_or"))
register_pointwise(aten.bitwise_xor, _binary("bitwise_xor"))
register_pointwise(aten.bitwise_left_shift, _binary("lshift"))
register_pointwise(aten.bitwise_right_shift, _binary("rshift"))
register_pointwise(aten.bitwise_not, lambda x, dtype: ops.logical_not(x) if dtype == torch.bool else ops.bitwise_not(x))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    register_pointwise(getattr(aten, _name), _binary(_name), ALWAYS_BOOL)
register_pointwise(aten.isnan, lambda x, dtype: ops.isnan(x) if dtype.is_floating_point else ops.ne(x, x), ALWAYS_BOOL)
register_pointwise(aten.isinf, lambda x, dtype: ops_table.isinf(x, dtype) if dtype.is_floating_point
                   else ops.ne(x, x), ALWAYS_BOOL)


def _is_infinity(sign):
    def body(x, dtype):
        if not dtype.is_floating_point:
            return ops.ne(x, x)   # integers are never infinite
        return ops.eq(x, ops.constant(sign * math.inf, dtype))
    return body


register_pointwise(aten.isposinf, _is_infinity(1), ALWAYS_BOOL)
register_pointwise(aten.isneginf, _is_infinity(-1), ALWAYS_BOOL)


def _rounding(op_name):
    def body(x, dtype):
        return getattr(ops, op_name)(x) if dtype.is_floating_point else x
    return body


for _name in ("floor", "ceil", "trunc"):
    register_pointwise(getattr(aten, _name), _rounding(_name))


def _as_bool(x, dtype):
    return x if dtype == torch.bool else ops.ne(x, ops.constant(0, dtype))


def _register_logical(aten_op, combine):
    @register_lowering(aten_op, broadcast=True, type_promotion=NO_OPMATH)
    def lowering(a, b, compute_dtype, result_dtype):
        return make_pointwise(lambda x, y: combine(_as_bool(x, compute_dtype), _as_bool(y, compute_dtype)),
                              [a, b], compute_dtype, torch.bool, origin=str(aten_op).split(".")[-1])


_register_logical(aten.logical_and, lambda x, y: ops.logical_and(x, y))
_register_logical(aten.logical_or, lambda x, y: ops.logical_or(x, y))
_register_logical(aten.logical_xor, lambda x, y: ops_table.logical_xor(x, y))


@register_lowering(aten.logical_not, type_promotion=NO_OPMATH)
def logical_not(x, compute_dtype, result_dtype):
    return make_pointwise(lambda v: ops.logical_not(_as_bool(v, compute_dtype)), [x], compute_dtype,
                          torch.bool, origin="logical_not")


@register_lowering(aten.add, broadcast=True, type_promotion=DEFAULT)
def add(a, b, alpha=1, compute_dtype=None, result_dtype=None):
    return _add_sub("add", "add", a, b, alpha, compute_dtype, result_dtype)


@register_lowering(aten.sub, broadcast=True, type_promotion=DEFAULT)
def sub(a, b, alpha=1, compute_dtype=None, result_dtype=None):
    return _add_sub("sub", "sub", a, b, alpha, compute_dtype, result_dtype)


@register_lowering(aten.rsub, broadcast=True, type_promotion=DEFAULT)
def rsub(a, b, alpha=1, compute_dtype=None, result_dtype=None):
    return _add_sub("sub", "rsub", b, a, alpha, compute_dtype, result_dtype)


def _add_sub(op_name, name, a, b, alpha, compute_dtype, result_dtype):
    if compute_dtype == torch.bool:
        if op_name != "add":
            raise Unsupported("subtraction of bool tensors")
        op_name = "logical_or"

    def body(x, y):
        if alpha != 1:
            y = ops.mul(y, ops.constant(alpha, compute_dtype))
        return getattr(ops, op_name)(x, y)
    return make_pointwise(body, [a, b], compute_dtype, result_dtype, origin=name)


@register_lowering(aten.div, aten.true_divide)
def div(a, b, rounding_mode=None):
    compute, result = promote_types([a, b], INT_TO_FLOAT if rounding_mode is None else DEFAULT)
    a, b = broadcast_operands([a, b])
    if rounding_mode is None:
        return make_pointwise(lambda x, y: ops.truediv(x, y), [a, b], compute, result, origin="div")
    if rounding_mode == "trunc":
        if compute.is_floating_point:
            body = lambda x, y: ops.trunc(ops.truediv(x, y))
        else:
            body = lambda x, y: ops.truncdiv(x, y)
    elif rounding_mode == "floor":
        body = lambda x, y: ops_table.floordiv(x, y, compute)
    else:
        raise Unsupported(f"rounding_mode={rounding_mode!r}")
    return make_pointwise(body, [a, b], compute, result, origin=f"div_{rounding_mode}")


@register_lowering(aten.floor_divide, broadcast=True, type_promotion=DEFAULT)
def floor_divide(a, b, compute_dtype, result_dtype):
    return make_pointwise(lambda x, y: ops_table.floordiv(x, y, compute_dtype), [a, b],
                          compute_dtype, result_dtype, origin="floor_divide")


@register_lowering(aten.pow, broadcast=True, type_promotion=BOOL_TO_LONG)
def pow(base, exponent, compute_dtype, result_dtype):
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and isinstance(base, TensorBox):
        if exponent == 0.5 and compute_dtype.is_floating_point:
            return make_pointwise(lambda x: ops.sqrt(x), [base], compute_dtype, result_dtype, origin="pow")
        if float(exponent).is_integer() and 0 <= exponent <= 8:
            power = int(exponent)

            def body(x):
                if power == 0:
                    return ops.constant(1, compute_dtype)
                result = x
                for _ in range(power - 1):
                    result = ops.mul(result, x)
                return result
            return make_pointwise(body, [base], compute_dtype, result_dtype, origin="pow")
        if exponent == -1 and compute_dtype.is_floating_point:
            return make_pointwise(lambda x: ops.reciprocal(x), [base], compute_dtype, result_dtype, origin="pow")
    if not compute_dtype.is_floating_point and isinstance(exponent, int) and isinstance(base, TensorBox):
        info = torch.iinfo(compute_dtype)
        if not 0 <= exponent <= info.max:   # eager raises (negative, or not held by the dtype)
            raise Unsupported(f"integer pow with the exponent {exponent}")
    # (integers: the op table's pow is eager's integer power, a loop in each backend)
    return make_pointwise(lambda x, y: ops.pow(x, y), [base, exponent], compute_dtype, result_dtype, origin="pow")


@register_lowering(aten.where)
def where(condition, a, b):
    compute, result = promote_types([a, b], NO_OPMATH)
    if not isinstance(condition, TensorBox):
        raise Unsupported("where with a python condition")
    condition, a, b = broadcast_operands([condition, a, b])

    def body(c, x, y):
        return ops.where(c, x, y)
    loaders_args = [condition, a, b]
    from ..ir import Pointwise
    from .registry import make_loader
    cond_load = make_loader(condition, torch.bool)
    a_load, b_load = make_loader(a, result), make_loader(b, result)
    size = list(next(t for t in loaders_args if isinstance(t, TensorBox)).get_size())
    return TensorBox.create(Pointwise(condition.get_device(), result,
                                      lambda idx: body(cond_load(idx), a_load(idx), b_load(idx)), size,
                                      origins=("where",)))


@register_lowering(aten.clamp, aten.clip)
def clamp(x, min=None, max=None):
    return _clamp(x, min, max)


@register_lowering(aten.clamp_min)
def clamp_min(x, min):
    return _clamp(x, min, None)


@register_lowering(aten.clamp_max)
def clamp_max(x, max):
    return _clamp(x, None, max)


def _clamp(x, low, high):
    compute, result = promote_types([v for v in (x, low, high) if v is not None], DEFAULT)
    x, low, high = broadcast_operands([x, low, high])

    def body(*values):
        value, rest = values[0], list(values[1:])
        if low is not None:
            value = ops.maximum(value, rest.pop(0))
        if high is not None:
            value = ops.minimum(value, rest.pop(0))
        return value
    return make_pointwise(body, [v for v in (x, low, high) if v is not None], compute, result, origin="clamp")


@register_lowering(aten.round)
def round_(x, decimals=0):
    dtype = x.get_dtype()
    if not dtype.is_floating_point:
        return x
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if decimals:
        return make_pointwise(lambda v: ops_table.round_decimals(v, decimals, compute), [x], compute, dtype,
                              origin="round")
    return make_pointwise(lambda v: ops.round(v), [x], compute, dtype, origin="round")


@register_lowering(aten.nan_to_num)
def nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    dtype = x.get_dtype()
    if not dtype.is_floating_point:
        return x
    info = torch.finfo(dtype)
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype

    def body(v):
        v = ops.where(ops.isnan(v), ops.constant(nan, compute), v)
        v = ops.where(ops.eq(v, ops.constant(math.inf, compute)), ops.constant(posinf, compute), v)
        return ops.where(ops.eq(v, ops.constant(-math.inf, compute)), ops.constant(neginf, compute), v)
    return make_pointwise(body, [x], compute, dtype, origin="nan_to_num")
