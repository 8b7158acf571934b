"""Lowerings of the math ops beyond the basics: inverse trigonometric and hyperbolic
functions, erfc/erfinv/lgamma/digamma/i0, the two-operand float ops (atan2, hypot,
copysign, nextafter, fmax, fmin, logaddexp), signbit, heaviside, sinc and the
``torch.special`` functions Inductor lowers (the Bessel functions J, Y and K from
special_bessel.py; the orthogonal polynomials, zeta, Airy Ai and the incomplete gamma
functions igamma / igammac, whose loops run as long as a value asks: special_polynomials.py,
special_airy.py, special_igamma.py, ops_table's loop primitives).

Each is a primitive of the op table (spelled by every backend) or a composite of
math_composites.py (written once). Type promotion is eager's, per op: integer inputs of
the transcendental functions compute in float32 (INT_TO_FLOAT), 16-bit floats in float32.
"""
import torch

from .. import math_composites as composite
from .. import ops_table
from .. import special_airy
from .. import special_bessel as bessel
from .. import special_igamma
from .. import special_polynomials
from ..ir import TensorBox
from ..virtualized import ops
from .pointwise import register_pointwise
from .registry import (
    ALWAYS_BOOL, DEFAULT, INT_TO_FLOAT, NO_OPMATH, Unsupported, aten, make_pointwise, promote_types,
    register_lowering,
)

PRIMITIVE_UNARY = {
    aten.asin: "asin", aten.acos: "acos", aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh",
    aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh", aten.log10: "log10", aten.erfc: "erfc",
    aten.lgamma: "lgamma", aten.special_erfcx: "erfcx",
}
COMPOSITE_UNARY = {
    aten.erfinv: composite.erfinv, aten.digamma: composite.digamma, aten.i0: composite.i0,
    aten.sinc: composite.sinc, aten.angle: composite.angle, aten.special_i0e: composite.i0e,
    aten.special_i1: composite.i1, aten.special_i1e: composite.i1e, aten.special_modified_bessel_i0: composite.i0,
    aten.special_modified_bessel_i1: composite.i1, aten.special_ndtri: composite.ndtri,
    aten.special_log_ndtr: composite.log_ndtr, aten.special_entr: composite.entr,
    aten.special_spherical_bessel_j0: composite.spherical_bessel_j0,
    aten.special_bessel_j0: bessel.bessel_j0, aten.special_bessel_j1: bessel.bessel_j1,
    aten.special_bessel_y0: bessel.bessel_y0, aten.special_bessel_y1: bessel.bessel_y1,
    aten.special_modified_bessel_k0: bessel.modified_bessel_k0,
    aten.special_modified_bessel_k1: bessel.modified_bessel_k1,
    aten.special_scaled_modified_bessel_k0: bessel.scaled_modified_bessel_k0,
    aten.special_scaled_modified_bessel_k1: bessel.scaled_modified_bessel_k1,
}


def _unary_primitive(op_name):
    return lambda x, dtype: getattr(ops, op_name)(x)


for _op, _name in PRIMITIVE_UNARY.items():
    register_pointwise(_op, _unary_primitive(_name), INT_TO_FLOAT)
for _op, _fn in COMPOSITE_UNARY.items():
    register_pointwise(_op, _fn, INT_TO_FLOAT)

register_pointwise(aten.atan2, lambda y, x, dtype: ops.atan2(y, x), INT_TO_FLOAT)
register_pointwise(aten.copysign, lambda a, b, dtype: ops.copysign(a, b), INT_TO_FLOAT)
register_pointwise(aten.hypot, lambda a, b, dtype: ops.hypot(a, b), DEFAULT)
register_pointwise(aten.fmax, composite.fmax, DEFAULT)
register_pointwise(aten.fmin, composite.fmin, DEFAULT)
register_pointwise(aten.logaddexp, composite.logaddexp, DEFAULT)
register_pointwise(aten.logaddexp2, composite.logaddexp2, DEFAULT)
register_pointwise(aten.heaviside, composite.heaviside, DEFAULT)
register_pointwise(aten.special_xlog1py, composite.xlog1py, INT_TO_FLOAT)


def _register_polynomial(name):
    """The degree's conversion to int64 is the device's (special_polynomials.py): CUDA
    saturates, x86 gives INT64_MIN."""
    body = getattr(special_polynomials, name)

    @register_lowering(getattr(aten, f"special_{name}"), broadcast=True, type_promotion=INT_TO_FLOAT)
    def lowering(*args, compute_dtype, result_dtype):
        saturating = any(isinstance(a, TensorBox) and a.get_device().type == "cuda" for a in args)
        return make_pointwise(lambda x, n: body(x, n, compute_dtype, saturating=saturating), args,
                              compute_dtype, result_dtype, origin=name)


# loops whose trip count is a value: the orthogonal polynomials P_n(x), Hurwitz zeta, Airy Ai
for _name in ("chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
              "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
              "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
              "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"):
    _register_polynomial(_name)
register_pointwise(aten.special_zeta, lambda x, q, dtype: ops.zeta(x, q), INT_TO_FLOAT)   # a loop primitive
register_pointwise(aten.special_airy_ai, special_airy.airy_ai, INT_TO_FLOAT)
register_pointwise(aten.igamma, special_igamma.igamma, INT_TO_FLOAT)
register_pointwise(aten.igammac, special_igamma.igammac, INT_TO_FLOAT)


def _signbit(x, dtype):
    if dtype.is_floating_point:
        return ops.signbit(x)
    if dtype == torch.bool or dtype == torch.uint8:
        return ops.constant(False, torch.bool)
    return ops.lt(x, ops.constant(0, dtype))


register_pointwise(aten.signbit, _signbit, ALWAYS_BOOL)
register_pointwise(aten.sgn, ops_table.sign)   # sign, for the real dtypes lowered here (abs's backward)


@register_lowering(aten.nextafter, broadcast=True, type_promotion=NO_OPMATH)
def nextafter(a, b, compute_dtype, result_dtype):
    if result_dtype in (torch.float16, torch.bfloat16):
        # a step of a 16-bit float, which a float32 computation would round away
        raise Unsupported(f"nextafter of {result_dtype} steps in its own precision")
    return make_pointwise(lambda x, y: ops.nextafter(x, y), [a, b], compute_dtype, result_dtype, origin="nextafter")


POLYGAMMA = {0: composite.digamma, 1: composite.trigamma}


@register_lowering(aten.polygamma)
def polygamma(n, x):
    if n not in POLYGAMMA:
        raise Unsupported(f"polygamma of order {n} (needs the Hurwitz zeta function)")
    compute, result = promote_types([x], INT_TO_FLOAT)
    return make_pointwise(lambda v: POLYGAMMA[n](v, compute), [x], compute, result, origin="polygamma")
