"""The math ops beyond the basics (lowering/pointwise_math.py): each generates a kernel on
every column of the device matrix and matches eager, over random values of its domain
plus the edges (+-0, +-1, +-inf, NaN, tiny and huge values), in float32 and bfloat16, on
an odd-sized tensor and a transposed one; integer inputs promote as in eager."""
import math

import pytest
import torch

import tritonfuse
from common import check, kernel_count, rand

INF, NAN = math.inf, math.nan
EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-30, -1e-30, 1e-3, -1e-3, 10.0, -10.0, 1e30, -1e30,
         INF, -INF, NAN]


def values(low, high, edges=EDGES, n=161, seed=0):
    """Values uniform in [low, high) followed by the edges: n in all, as float32."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.rand(n - len(edges), generator=g) * (high - low) + low, torch.tensor(edges)])


# name -> (function, low, high): random inputs in [low, high) besides the edges
UNARY = {
    "asin": (torch.asin, -1.2, 1.2), "acos": (torch.acos, -1.2, 1.2), "atan": (torch.atan, -20, 20),
    "sinh": (torch.sinh, -12, 12), "cosh": (torch.cosh, -12, 12), "asinh": (torch.asinh, -50, 50),
    "acosh": (torch.acosh, 0.5, 30), "atanh": (torch.atanh, -1.1, 1.1), "log10": (torch.log10, -1, 1000),
    "erfc": (torch.erfc, -5, 10), "lgamma": (torch.lgamma, -6.5, 30), "digamma": (torch.digamma, -6.5, 30),
    "i0": (torch.i0, -20, 20), "sinc": (torch.sinc, -6, 6),
    # erfinv is ill-conditioned next to +-1 (eager's own float32 result is off there)
    "erfinv": (torch.erfinv, -0.99, 0.99),
    "special_erfcx": (torch.special.erfcx, -8, 30), "special_i0e": (torch.special.i0e, -30, 30),
    "special_i1": (torch.special.i1, -20, 20), "special_i1e": (torch.special.i1e, -30, 30),
    "special_ndtri": (torch.special.ndtri, -0.1, 1.1), "special_log_ndtr": (torch.special.log_ndtr, -30, 10),
    "special_entr": (torch.special.entr, -1, 5), "special_bessel_i0": (torch.special.modified_bessel_i0, -20, 20),
    "special_bessel_i1": (torch.special.modified_bessel_i1, -20, 20),
    "special_spherical_j0": (torch.special.spherical_bessel_j0, -10, 10),
    "trigamma": (lambda x: torch.polygamma(1, x), -5.5, 20),
    "polygamma0": (lambda x: torch.polygamma(0, x), -5.5, 20),
    "signbit": (torch.signbit, -2, 2), "angle": (torch.angle, -2, 2),
    # Bessel functions of the first and second kind, modified ones of the second kind
    "special_bessel_j0": (torch.special.bessel_j0, -40, 40), "special_bessel_j1": (torch.special.bessel_j1, -40, 40),
    "special_bessel_y0": (torch.special.bessel_y0, -1, 40), "special_bessel_y1": (torch.special.bessel_y1, -1, 40),
    "special_bessel_k0": (torch.special.modified_bessel_k0, -0.5, 30),
    "special_bessel_k1": (torch.special.modified_bessel_k1, -0.5, 30),
    "special_scaled_k0": (torch.special.scaled_modified_bessel_k0, -0.5, 60),
    "special_scaled_k1": (torch.special.scaled_modified_bessel_k1, -0.5, 60),
}
# edges where eager's float32 result depends on its code path (vectorized or not) or is
# too ill-conditioned to compare
EDGE_EXCLUSIONS = {"trigamma": [-1.0, -2.0, -10.0, 1e30, -1e30]}


def _edges(name):
    skip = EDGE_EXCLUSIONS.get(name, [])
    return [e for e in EDGES if not any(e == s for s in skip)]


def _no_fallbacks():
    assert not tritonfuse.metrics.fallbacks, tritonfuse.metrics.fallbacks
    assert kernel_count() >= 1


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(device, name):
    fn, low, high = UNARY[name]
    x = values(low, high, _edges(name)).to(device)
    odd = x.reshape(-1)[: 7 * 23].reshape(7, 23)
    # float32 on an odd-sized tensor, a transposed view, and bfloat16 where eager has it
    if _eager_supports(fn, torch.bfloat16, device):
        check(lambda a, b, c: (fn(a), fn(b.t()), fn(c)), x, odd, x.to(torch.bfloat16))
    else:
        check(lambda a, b: (fn(a), fn(b.t())), x, odd)
    _no_fallbacks()


def _eager_supports(fn, dtype, device):
    try:
        fn(torch.ones(1, dtype=dtype, device=device))
        return True
    except (NotImplementedError, RuntimeError):
        return False


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float64(device, name):
    fn, low, high = UNARY[name]
    check(fn, values(low, high, _edges(name)).to(device, torch.float64))
    _no_fallbacks()


# ops that take integer tensors: eager computes them in float32 (INT_TO_FLOAT)
INTEGER_UNARY = ["atan", "log10", "erfc", "lgamma", "digamma", "i0", "sinc", "special_i1e", "signbit", "asinh",
                 "angle"]


@pytest.mark.parametrize("name", INTEGER_UNARY)
def test_unary_integer_input(device, name):
    fn = UNARY[name][0]
    x = torch.arange(-7, 30, dtype=torch.int64, device=device)
    x = x[x > 0] if name in ("log10", "lgamma", "digamma") else x
    check(lambda a, b: (fn(a), fn(b)), x, x.to(torch.int32))
    _no_fallbacks()


def pairs(seed=1):
    """Random pairs plus every combination of a few edges."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.tensor([0.0, -0.0, 1.0, -1.5, 3.0, 1e-30, 1e30, INF, -INF, NAN])
    a = torch.cat([torch.randn(97, generator=g) * 4, edges.repeat_interleave(len(edges))])
    b = torch.cat([torch.randn(97, generator=g) * 4, edges.repeat(len(edges))])
    return a, b


BINARY = {
    "atan2": torch.atan2, "hypot": torch.hypot, "copysign": torch.copysign, "nextafter": torch.nextafter,
    "fmax": torch.fmax, "fmin": torch.fmin, "logaddexp": torch.logaddexp, "logaddexp2": torch.logaddexp2,
    "heaviside": torch.heaviside, "xlog1py": torch.special.xlog1py,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(device, name):
    fn = BINARY[name]
    a, b = pairs()
    a, b = a.to(device), b.to(device)
    # float32, a broadcast operand and (but for nextafter: see below) bfloat16
    if name == "nextafter":
        check(lambda x, y: (fn(x, y), fn(x[:51].reshape(3, 17), y[:17].reshape(1, 17))), a, b)
    else:
        check(lambda x, y, x16, y16: (fn(x, y), fn(x[:51].reshape(3, 17), y[:17].reshape(1, 17)), fn(x16, y16)),
              a, b, a.to(torch.bfloat16), b.to(torch.bfloat16))
    _no_fallbacks()


@pytest.mark.parametrize("name", ["fmax", "fmin", "heaviside", "copysign", "atan2"])
def test_binary_integer_inputs(device, name):
    a = torch.randint(-5, 6, (41,), device=device)
    b = torch.randint(-5, 6, (41,), device=device)
    check(BINARY[name], a, b)
    _no_fallbacks()


def test_binary_bool_inputs(device):
    a, b = rand(37, dtype=torch.bool, device=device), rand(37, dtype=torch.bool, device=device)
    check(lambda x, y: (torch.heaviside(x, y), torch.fmax(x, y), torch.fmin(x, y), torch.copysign(x, y),
                        torch.signbit(x)), a, b)
    _no_fallbacks()


def test_binary_with_a_scalar(device):
    x = torch.randn(37, device=device)
    check(lambda a, zero_d: (torch.special.xlog1py(a, 2.0), torch.special.xlog1py(3.0, a.abs()),
                             torch.logaddexp(a, zero_d), torch.atan2(zero_d, a)), x, torch.tensor(0.5, device=device))
    _no_fallbacks()


def test_nextafter_16bit_falls_back(device):
    """A float32 step would round away in a 16-bit float: that case stays eager's."""
    x = torch.randn(16, device=device).to(torch.bfloat16)
    check(lambda a: torch.nextafter(a, a + 1) * 2, x)
    assert "aten.nextafter.default" in tritonfuse.metrics.fallbacks


def test_polygamma_higher_order_falls_back(device):
    x = torch.rand(16, device=device) + 0.5
    check(lambda a: torch.polygamma(2, a) + 1, x)
    assert "aten.polygamma.default" in tritonfuse.metrics.fallbacks


def test_mvlgamma(device):
    x = torch.rand(5, 7, device=device) * 10 + 2
    check(lambda a: torch.mvlgamma(a, 3), x)
    _no_fallbacks()


def test_math_fuses_with_neighbours(device):
    """The new ops cut no fusion: one kernel for a chain of them between pointwise ops."""
    x = torch.rand(6, 33, device=device) * 1.8 - 0.9
    y = torch.randn(6, 33, device=device)

    def fn(a, b):
        t = torch.atan2(a, b).sigmoid() + torch.erfinv(a) * torch.lgamma(b.abs() + 1)
        return torch.logaddexp(t, torch.digamma(b.abs() + 0.5)) + torch.asinh(b) * torch.hypot(a, b)
    check(fn, x, y)
    _no_fallbacks()
    assert kernel_count() == 1


def test_math_with_symbolic_sizes_and_gradients(device):
    """Symbolic sizes (dynamic=True) change nothing: one compile per graph for every shape;
    the backwards' own math (i0e's needs sgn) is lowered too."""
    from test_layout_ops import check_symbolic_with_grad

    def fn(a):
        return torch.special.i0e(a) + torch.special.erfcx(a) * torch.atan2(a, a.exp()) + torch.asinh(a)
    check_symbolic_with_grad(fn, device)
    _no_fallbacks()
