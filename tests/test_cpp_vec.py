"""tritonfuse_vec.h, the SIMD library of generated C++ kernels, checked against torch.

A small C++ file (VEC_TEST_SOURCE) applies each header function to an array, vector by
vector with load_partial/store_partial tails, and is built through cpu_backend.build; the
tests call it with tensor data pointers. The same source is built three times: with the
native ISA (16 lanes on AVX-512), with AVX-512 switched off (8-lane AVX2 path, portable
fp16 conversion and masked-load fallbacks), and for baseline x86-64 (4 lanes, SSE2: no
FMA, per-lane rounding builtins), so every code path of the header is exercised.

Accuracy is measured in float32 ulps against torch in float64. Bounds (max ulp error
over random + special inputs; what the implementation reaches is in ULP_BOUNDS' comments):
exp/log family <= 2, sigmoid/tanh <= 2.5, erf/sin/cos <= 2, pow <= 1 (0.50 measured: it
works in double), sqrt/rounding/fmod/conversions exact.
"""
import concurrent.futures
import pathlib
import ctypes
import math

import pytest
import torch

import tritonfuse.config
from cpu_backend import build

# ---------------------------------------------------------------------------------------
# The C++ side
# ---------------------------------------------------------------------------------------
VEC_TEST_SOURCE = (pathlib.Path(__file__).parent / "cpp_vec_test_source.cpp").read_text()

# ---------------------------------------------------------------------------------------
# Python side
# ---------------------------------------------------------------------------------------
CONFIGS = {
    "native": "",
    # 8 lanes (AVX2), portable fp16 conversion and masked-load fallbacks.
    "avx2": "-mno-avx512f -DTF_DISABLE_F16C",
    "sse2": "-march=x86-64",
}


class VecLib:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lanes = torch.zeros(1, dtype=torch.int64)
        self.call("lanes", lanes)
        self.lanes = int(lanes.item())

    def call(self, name: str, *args):
        """Tensors are passed by data pointer, Python ints as int64."""
        argtypes = [ctypes.c_int64 if isinstance(a, int) else ctypes.c_void_p for a in args]
        fn = build.KernelCallable(self.lib, name, argtypes=argtypes)
        fn(*[a if isinstance(a, int) else a.data_ptr() for a in args])


@pytest.fixture(scope="module")
def vec_libs(tmp_path_factory):
    """Both configurations, compiled in parallel (about 10 s each)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(tritonfuse.config, "cache_dir", str(tmp_path_factory.mktemp("vec_cache")))
    try:
        with concurrent.futures.ThreadPoolExecutor(len(CONFIGS)) as pool:
            futures = {name: pool.submit(build.load_kernel_library, VEC_TEST_SOURCE, flags.split())
                       for name, flags in CONFIGS.items()}
            return {name: VecLib(f.result()) for name, f in futures.items()}
    finally:
        mp.undo()


@pytest.fixture(params=list(CONFIGS), ids=list(CONFIGS))
def vec(request, vec_libs):
    v = vec_libs[request.param]
    if request.param == "avx2":
        assert v.lanes == 8
    elif request.param == "sse2":
        assert v.lanes == 4
    elif "avx512f" in open("/proc/cpuinfo").read():
        assert v.lanes == 16
    return v


def _unary(vec, name, x, scalar=False):
    y = torch.empty_like(x)
    dtype = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t",
             torch.int64: "int64_t", torch.uint8: "uint8_t", torch.int8: "int8_t"}[x.dtype]
    vec.call(f"{'scalar' if scalar else 'vec'}_{name}_{dtype}", x, y, x.numel())
    return y


def _binary(vec, name, a, b, scalar=False):
    y = torch.empty_like(a)
    dtype = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t",
             torch.int64: "int64_t", torch.uint8: "uint8_t", torch.int8: "int8_t"}[a.dtype]
    vec.call(f"{'scalar' if scalar else 'vec'}_{name}_{dtype}", a, b, y, a.numel())
    return y


def ulp_error(got: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    """|got - ref| in units of the float32 spacing at the (rounded) reference; 0 where both
    are the same nan/inf; inf where nan-ness or an infinity disagrees."""
    got64 = got.double()
    ref32 = ref64.float()
    mag = ref32.abs()
    spacing = (torch.nextafter(mag, torch.tensor(math.inf)) - mag).double()
    spacing = torch.where(torch.isinf(mag), torch.tensor(math.inf, dtype=torch.float64), spacing)
    err = (got64 - ref64).abs() / spacing
    both_nan = torch.isnan(got64) & torch.isnan(ref64)
    same_inf = torch.isinf(got64) & (got64 == ref32.double())
    err = torch.where(both_nan | same_inf, torch.zeros_like(err), err)
    bad = torch.isnan(got64) != torch.isnan(ref64)
    bad |= torch.isinf(got64) != torch.isinf(ref32)
    return torch.where(bad, torch.full_like(err, math.inf), err)


FLT_MAX = torch.finfo(torch.float32).max
FLT_TINY = torch.finfo(torch.float32).tiny
SPECIALS = [
    0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-45, -1e-45,
    1e-40, -1e-40, 3e-39, FLT_TINY, -FLT_TINY, FLT_MAX, -FLT_MAX, 1e30, -1e30, 1e10, -1e10,
    88.72283, 88.72284, 89.0, -87.3, -88.0, -103.9, -104.5, -150.0, 127.9, 128.0, -149.0,
    0.625, -0.625, 0.6249, 0.875, 0.8749, 3.95, 3.92, -3.92, 9.0, -9.0, 20.0, -20.0, 44.0,
    1e-8, -1e-8, 1e-20, 3.1415927, -3.1415927, 1.5707964, 524287.0, 524288.0, 1e6, -7e7,
    -17.33, -30.0, 0.34657, 0.7071068, 1.4142135, 2.5, -2.5, 0.49999997, 1.5, 1e-3, -1e-3,
]


def _inputs(domain: str, n: int = 20011, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    parts = [torch.tensor(SPECIALS, dtype=torch.float32)]
    parts.append(torch.randn(n, generator=g))
    parts.append(torch.randn(n, generator=g) * 10)
    parts.append(torch.randn(n, generator=g) * 1e-3)
    # log-uniform magnitudes over the whole float range, both signs
    mag = torch.exp(torch.empty(n).uniform_(-103, 88.7, generator=g))
    parts.append(mag * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0))
    if domain == "exp":
        parts.append(torch.empty(n).uniform_(-110, 95, generator=g))
    if domain == "trig":
        parts.append(torch.empty(n).uniform_(-1e4, 1e4, generator=g))
        parts.append(torch.empty(n).uniform_(-6e5, 6e5, generator=g))
        parts.append(torch.arange(-2000, 2000) * (math.pi / 2))  # next to multiples of pi/2
    if domain == "erf":
        parts.append(torch.empty(n).uniform_(-5, 5, generator=g))
    if domain == "log":
        parts.append(torch.empty(n).uniform_(0, 3, generator=g))
        parts.append(torch.empty(n).uniform_(-1, 1, generator=g))
    x = torch.cat(parts).float()
    return x[: x.numel() - (x.numel() % 16) + 7]  # not a multiple of the lane count


# name -> (torch reference on float64, input domain, max ulp error allowed)
UNARY_CASES = {  # measured max (native and AVX2 builds, 600k inputs) in the comments
    "exp": (torch.exp, "exp", 1.5),  # 1.00
    "exp2": (torch.exp2, "exp", 1.5),  # 0.83
    "expm1": (torch.expm1, "exp", 2),  # 1.41
    "log": (torch.log, "log", 1.5),  # 0.85
    "log2": (torch.log2, "log", 2),  # 1.76
    "log10": (torch.log10, "log", 2.5),  # 1.91 (glibc's scalar log10f: 1.98)
    "log1p": (torch.log1p, "log", 2),  # 1.44
    "sqrt": (torch.sqrt, "log", 0.5),  # 0.50: correctly rounded
    "rsqrt": (torch.rsqrt, "log", 2),  # 1.49: 1 / sqrt(x), two roundings
    "tanh": (torch.tanh, "exp", 2.5),  # 1.26 (glibc's scalar tanhf: 2.06)
    "sigmoid": (torch.sigmoid, "exp", 2.5),  # 2.17
    "erf": (torch.erf, "erf", 2),  # 1.68 (scripts/fit_erf.py; 12 vector ops fewer than the 1.08 form)
    "sin": (torch.sin, "trig", 2),  # 1.55
    "cos": (torch.cos, "trig", 2),  # 1.52
    "reciprocal": (torch.reciprocal, "log", 0.5),  # 0.50
}


@pytest.mark.parametrize("name", list(UNARY_CASES))
def test_float_unary_accuracy(vec, name):
    ref_fn, domain, max_ulp = UNARY_CASES[name]
    x = _inputs(domain)
    ref = ref_fn(x.double())
    got = _unary(vec, name, x)
    err = ulp_error(got, ref)
    worst = int(err.argmax())
    assert err.max() <= max_ulp, f"{name}: {err.max():.2f} ulp at x={x[worst].item()!r}: got {got[worst].item()!r}, want {ref[worst].item()!r}"
    # signed zeros: f(+-0) must keep torch's sign
    zero = ref == 0
    assert torch.equal(torch.signbit(got[zero]), torch.signbit(ref[zero].float())), name
    # the scalar overloads (libm) agree with torch too
    got_s = _unary(vec, name, x, scalar=True)
    assert ulp_error(got_s, ref).max() <= max(max_ulp, 1.0), name


EXACT_UNARY = {
    "abs": torch.abs, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
    "round": torch.round, "sign": torch.sign, "neg": torch.neg,
    "isnan": lambda x: torch.isnan(x).to(x.dtype), "isinf": lambda x: torch.isinf(x).to(x.dtype),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(EXACT_UNARY))
def test_float_unary_exact(vec, name, dtype):
    x = torch.cat([_inputs("exp", n=2000), torch.arange(-40, 40) * 0.25]).to(dtype)
    x = torch.cat([x, torch.tensor([2.0**52 + 1, -(2.0**52) - 1, 4503599627370495.5], dtype=dtype)])
    want = EXACT_UNARY[name](x)
    for scalar in (False, True):
        got = _unary(vec, name, x, scalar=scalar)
        assert torch.equal(got.isnan(), want.isnan()), name
        ok = ~want.isnan()
        assert torch.equal(got[ok], want[ok]), name
        assert torch.equal(got[ok].signbit(), want[ok].signbit()), name


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sigmoid", "erf", "sin", "expm1", "log1p", "sqrt"])
def test_double_vectors_match_torch(vec, name):
    ref_fn = UNARY_CASES[name][0]
    x = _inputs(UNARY_CASES[name][1], n=3000).double()
    got = _unary(vec, name, x)
    # lane by lane through libm: agrees with eager to the last bit or two (eager's
    # formulas differ: e.g. sigmoid of -800 is 0 there, a denormal here)
    torch.testing.assert_close(got, ref_fn(x), rtol=5e-16, atol=1e-300, equal_nan=True)


# ---- tf_vec_special.h ---------------------------------------------------------------------

def _special_inputs(n=20011):
    g = torch.Generator().manual_seed(5)
    unit = torch.cat([torch.empty(n).uniform_(-1.1, 1.1, generator=g), torch.tensor([0.99999994, -0.99999994, 1e-30]),
                      1 - torch.exp(torch.empty(n).uniform_(-17, -1, generator=g))])
    return torch.cat([_inputs("erf", n), unit, torch.empty(n).uniform_(-10, 11, generator=g),
                      torch.empty(n).uniform_(80, 90, generator=g)])


# name -> (torch reference on float64, max ulp error): vectorized float kernels
SPECIAL_CASES = {  # measured max (native, AVX2 and SSE2 builds) in the comments
    "asin": (torch.asin, 0.6), "acos": (torch.acos, 0.6), "atan": (torch.atan, 0.6),  # 0.51: in double
    "sinh": (torch.sinh, 2.5), "cosh": (torch.cosh, 2),  # 1.96, 1.57
    "asinh": (torch.asinh, 2.5), "acosh": (torch.acosh, 2.5), "atanh": (torch.atanh, 2.5),  # 1.83, 1.86, 2.20
    "erfc": (torch.erfc, 4), "erfcx": (torch.special.erfcx, 5),  # 3.37, 4.55 (1 - erf(x) for |x| < 0.875)
}


@pytest.mark.parametrize("name", list(SPECIAL_CASES))
def test_special_unary_accuracy(vec, name):
    ref_fn, max_ulp = SPECIAL_CASES[name]
    x = _special_inputs()
    ref = ref_fn(x.double())
    for scalar in (False, True):
        got = _unary(vec, name, x, scalar=scalar)
        err = ulp_error(got, ref)
        worst = int(err.argmax())
        bound = max(max_ulp, 1.0) if scalar else max_ulp   # scalars: libm (glibc: < 1 ulp)
        assert err.max() <= bound, (f"{name} (scalar={scalar}): {err.max():.2f} ulp at x={x[worst].item()!r}: "
                                      f"got {got[worst].item()!r}, want {ref[worst].item()!r}")
        zero = ref == 0
        assert torch.equal(torch.signbit(got[zero]), torch.signbit(ref[zero].float())), name
    x64 = x.double()
    torch.testing.assert_close(_unary(vec, name, x64), ref_fn(x64), rtol=1e-13, atol=1e-300, equal_nan=True)


def test_special_binary(vec):
    g = torch.Generator().manual_seed(6)
    specials = torch.tensor([0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 1e-45, 3e38, -2.5])
    a = torch.cat([torch.randn(3001, generator=g) * 10, specials.repeat_interleave(len(specials))])
    b = torch.cat([torch.randn(3001, generator=g) * 10, specials.repeat(len(specials))])
    for dtype in (torch.float32, torch.float64):
        x, y = a.to(dtype), b.to(dtype)
        for scalar in (False, True):
            assert torch.equal(_binary(vec, "nextafter", x, y, scalar=scalar).view(-1), torch.nextafter(x, y)) or \
                torch.equal(_binary(vec, "nextafter", x, y, scalar=scalar).isnan(), torch.nextafter(x, y).isnan())
            got, want = _binary(vec, "hypot", x, y, scalar=scalar), torch.hypot(x, y)
            if dtype == torch.float32:
                assert ulp_error(got, torch.hypot(x.double(), y.double())).max() <= 0.5
            else:
                torch.testing.assert_close(got, want, rtol=5e-16, atol=0, equal_nan=True)
            sign = _unary(vec, "signbit", x, scalar=scalar)
            assert torch.equal(sign.bool(), torch.signbit(x))


def _pow_specials():
    vals = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, math.inf,
            -math.inf, math.nan, 1e-40, -1e-40, 1e30, -1e30, 127.0, -128.0]
    a, b = torch.meshgrid(torch.tensor(vals), torch.tensor(vals), indexing="ij")
    return a.flatten().float(), b.flatten().float()


def test_pow(vec):
    g = torch.Generator().manual_seed(1)
    n = 30011
    a = torch.cat([torch.exp(torch.empty(n).uniform_(-20, 20, generator=g)),
                   torch.randn(n, generator=g).abs() * 3,
                   -torch.randint(1, 10, (n,), generator=g).float()])
    b = torch.cat([torch.randn(n, generator=g) * 5,
                   torch.randn(n, generator=g) * 40,
                   torch.randint(-30, 30, (n,), generator=g).float()])
    got = _binary(vec, "pow", a, b)
    err = ulp_error(got, torch.pow(a.double(), b.double()))
    assert err.max() <= 1.0, f"pow: {err.max()} ulp"
    sa, sb = _pow_specials()
    got = _binary(vec, "pow", sa, sb)
    want = torch.pow(sa, sb)
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok], want[ok]) and torch.equal(got[ok].signbit(), want[ok].signbit())


def test_fmod_exact(vec):
    g = torch.Generator().manual_seed(2)
    n = 20011
    a = torch.cat([torch.randn(n, generator=g) * 100, torch.randn(n, generator=g) * 1e8,
                   torch.tensor([0.0, -0.0, 5.0, -5.0, math.inf, -math.inf, math.nan, 1e30, -1e-40, 7.0])])
    b = torch.cat([torch.randn(n, generator=g), torch.randn(n, generator=g) * 1e-3,
                   torch.tensor([3.0, 3.0, 0.0, math.inf, 2.0, 1.0, 1.0, 1e-30, 3e-41, -math.inf])])
    for dtype in (torch.float32, torch.float64):
        got = _binary(vec, "fmod", a.to(dtype), b.to(dtype))
        # C fmod is exact, so the float64 result rounds back exactly. (Eager's vectorized
        # fmod returns nan when the quotient is huge, e.g. fmod(1e30, 1e-30): not a reference.)
        want = torch.tensor([math.fmod(x, y) if y != 0 and not math.isinf(x) else math.nan
                             for x, y in zip(a.to(dtype).tolist(), b.to(dtype).tolist())], dtype=torch.float64).to(dtype)
        assert torch.equal(got.isnan(), want.isnan())
        ok = ~want.isnan()
        assert torch.equal(got[ok], want[ok]) and torch.equal(got[ok].signbit(), want[ok].signbit())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_binary_exact(vec, dtype):
    g = torch.Generator().manual_seed(3)
    specials = torch.tensor([math.nan, 1.0, math.nan, -0.0, 0.0, math.inf, -math.inf, 2.0])
    a = torch.cat([torch.randn(1000, generator=g), specials, specials.flip(0)]).to(dtype)
    b = torch.cat([torch.randn(1000, generator=g), specials.roll(1), specials]).to(dtype)
    cases = {"maximum": torch.maximum, "minimum": torch.minimum, "add": torch.add, "sub": torch.sub,
             "mul": torch.mul, "div": torch.div, "copysign": torch.copysign, "atan2": torch.atan2}
    for name, fn in cases.items():
        for scalar in (False, True):
            got, want = _binary(vec, name, a, b, scalar=scalar), fn(a, b)
            assert torch.equal(got.isnan(), want.isnan()), name
            ok = ~want.isnan()
            if name == "atan2" and dtype == torch.float32:
                assert ulp_error(got[ok], torch.atan2(a[ok].double(), b[ok].double())).max() <= 2
            elif name == "atan2":
                torch.testing.assert_close(got[ok], want[ok], rtol=5e-16, atol=0)
            else:
                assert torch.equal(got[ok], want[ok]), name  # (zero signs of max/min unspecified)


INT_DTYPES = {torch.int32: (-(2**31), 2**31), torch.int64: (-(2**62), 2**62),
              torch.uint8: (0, 256), torch.int8: (-128, 128)}


@pytest.mark.parametrize("dtype", list(INT_DTYPES))
def test_integer_ops(vec, dtype):
    g = torch.Generator().manual_seed(4)
    lo, hi = INT_DTYPES[dtype]
    n = 4001
    a = torch.cat([torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64), torch.randint(-50, 50, (n,), generator=g)])
    b = torch.cat([torch.randint(-7, 8, (n,), generator=g), torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64)])
    a, b = a.to(dtype), b.to(dtype)  # wraps into range for the narrow types
    nz = b != 0
    for name, fn in {"add": torch.add, "sub": torch.sub, "mul": torch.mul,
                     "and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
                     "maximum": torch.maximum, "minimum": torch.minimum}.items():
        assert torch.equal(_binary(vec, name, a, b), fn(a, b)), name
    # C semantics: truncating division, remainder with the sign of the dividend
    div, mod = _binary(vec, "div", a, b), _binary(vec, "mod", a, b)
    assert torch.equal(div[nz], torch.div(a[nz], b[nz], rounding_mode="trunc")), "div"
    assert torch.equal(mod[nz], torch.fmod(a[nz], b[nz])), "mod"
    assert (div[~nz] == 0).all() and (mod[~nz] == 0).all()  # no trap on zero divisors
    safe_b = torch.where(nz, b, torch.ones((), dtype=dtype))  # plain C `/` in the scalar loop would trap
    assert torch.equal(_binary(vec, "div", a, safe_b, scalar=True)[nz], div[nz])
    # shifts: in-range and out-of-range counts, compared with eager
    bits = torch.iinfo(dtype).bits
    counts = torch.randint(-3 if dtype.is_signed else 0, bits + 4, a.shape, generator=g).to(dtype)
    for name, fn in {"shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift}.items():
        assert torch.equal(_binary(vec, name, a, counts), fn(a, counts)), name
    for name, fn in {"neg": torch.neg, "not": torch.bitwise_not, "abs": torch.abs, "sign": torch.sign}.items():
        if dtype == torch.uint8 and name in ("neg",):
            want = (-a.to(torch.int64)).to(torch.uint8)
        else:
            want = fn(a)
        assert torch.equal(_unary(vec, name, a), want), name
    if dtype.is_signed:  # INT_MIN / -1 wraps like eager instead of trapping
        m = torch.full((20,), torch.iinfo(dtype).min, dtype=dtype)
        assert torch.equal(_binary(vec, "div", m, torch.full_like(m, -1)), m)
        assert (_binary(vec, "mod", m, torch.full_like(m, -1)) == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8])
def test_compare_and_where(vec, dtype):
    g = torch.Generator().manual_seed(5)
    if dtype.is_floating_point:
        a = torch.cat([torch.randint(-3, 3, (500,), generator=g).to(dtype), torch.tensor([math.nan, 0.0, -0.0, math.inf], dtype=dtype)])
        b = torch.cat([torch.randint(-3, 3, (500,), generator=g).to(dtype), torch.tensor([1.0, -0.0, math.nan, math.inf], dtype=dtype)])
    else:
        a = torch.randint(0, 5, (503,), generator=g).to(dtype)
        b = torch.randint(0, 5, (503,), generator=g).to(dtype)
    ctype = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.uint8: "uint8_t"}[dtype]
    for name, fn in {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}.items():
        m = torch.empty(a.shape, dtype=torch.bool)
        y = torch.empty_like(a)
        vec.call(f"cmp_{name}_{ctype}", a, b, m, y, a.numel())
        assert torch.equal(m, fn(a, b)), name
        assert torch.equal(y, torch.where(fn(a, b), a, b), ) or torch.equal(y.isnan(), torch.where(fn(a, b), a, b).isnan())


def test_mask_ops(vec):
    g = torch.Generator().manual_seed(6)
    n = 16 * 7 + 5
    c = torch.rand(n, generator=g) < 0.5
    d = torch.rand(n, generator=g) < 0.9
    a = torch.randn(n, generator=g)
    c[:16], d[:16], a[:16] = False, True, 1.0  # an all-false block
    c[16:32], d[16:32], a[16:32] = True, True, 1.0  # an all-true block
    out = torch.empty(n, dtype=torch.bool)
    blocks = (n + vec.lanes - 1) // vec.lanes
    any_all = torch.empty(2 * blocks, dtype=torch.bool)
    vec.call("mask_ops", c, d, a, out, any_all, n)
    want = ((a < 0) ^ c) | ~d
    assert torch.equal(out, want)
    for blk in range(blocks):
        part = want[blk * vec.lanes: (blk + 1) * vec.lanes]
        assert any_all[2 * blk].item() == bool(part.any()) and any_all[2 * blk + 1].item() == bool(part.all())


CONVERSIONS = [
    (torch.float32, torch.float64), (torch.float32, torch.int32), (torch.float32, torch.int64),
    (torch.float32, torch.uint8), (torch.float32, torch.int8), (torch.float32, torch.bool),
    (torch.float64, torch.float32), (torch.float64, torch.int64), (torch.int64, torch.float32),
    (torch.int64, torch.float64), (torch.int64, torch.int32), (torch.int32, torch.int64),
    (torch.int32, torch.float32), (torch.uint8, torch.float32), (torch.uint8, torch.int64),
    (torch.bool, torch.float32), (torch.bool, torch.int64), (torch.int64, torch.bool),
    (torch.int8, torch.float32), (torch.float64, torch.bool),
]
CNAMES = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t", torch.int64: "int64_t",
          torch.uint8: "uint8_t", torch.int8: "int8_t", torch.bool: "bool"}


@pytest.mark.parametrize("src,dst", CONVERSIONS, ids=[f"{CNAMES[a]}-{CNAMES[b]}" for a, b in CONVERSIONS])
def test_convert(vec, src, dst):
    g = torch.Generator().manual_seed(7)
    if src.is_floating_point:
        x = torch.cat([torch.randn(2000, generator=g) * 60, torch.tensor([-1.5, -0.7, 255.9, -128.5, 127.9, 0.0, -0.0, 1e-40])])
        if dst == torch.bool:
            x = torch.cat([x, torch.tensor([math.nan, math.inf, -math.inf])])
        if src == torch.float64:
            x = torch.cat([x, torch.tensor([1.0000000001, 3e38, 1e-300])])  # rounding to float
    elif src == torch.bool:
        x = torch.rand(2000, generator=g) < 0.5
    else:
        x = torch.randint(-(2**40), 2**40, (2000,), generator=g) if src == torch.int64 else torch.randint(-100, 100, (2000,), generator=g)
        if src == torch.int64:
            x = torch.cat([x, torch.tensor([2**53 + 1, 2**24 + 1, 0])])
    x = x.to(src)
    want = x.to(dst)
    for prefix in ("convert", "sconvert"):
        y = torch.empty(x.shape, dtype=dst)
        vec.call(f"{prefix}_{CNAMES[src]}_{CNAMES[dst]}", x, y, x.numel())
        assert torch.equal(y, want), prefix


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8])
def test_gather(vec, dtype):
    g = torch.Generator().manual_seed(8)
    base = (torch.randn(997, generator=g) * 50).to(dtype)
    n = 1003
    idx = torch.randint(0, base.numel(), (n,), generator=g)
    y = torch.empty(n, dtype=dtype)
    vec.call(f"gather_{CNAMES[dtype]}", base, idx, y, n)
    assert torch.equal(y, base[idx])
    # inactive lanes get wild indices (2^40 elements away): reading one would fault
    m = torch.rand(n, generator=g) < 0.6
    wild = torch.where(m, idx, 2**40)
    vec.call(f"masked_gather_{CNAMES[dtype]}", base, wild, m, y, n)
    assert torch.equal(y, torch.where(m, base[idx], torch.zeros((), dtype=dtype)))


def test_masked_load_store_arange_lanes(vec):
    g = torch.Generator().manual_seed(9)
    n = 16 * 5 + 11
    x = torch.randn(n, generator=g)
    m = torch.rand(n, generator=g) < 0.5
    ml, ms, ar, lanes_out = torch.empty(n), torch.full((n,), 7.0), torch.empty(n), torch.empty(n)
    vec.call("misc_float", x, m, ml, ms, ar, lanes_out, n)
    assert torch.equal(ml, torch.where(m, x, 0.0))
    assert torch.equal(ms, torch.where(m, -1.0, 7.0))
    assert torch.equal(ar, torch.arange(n) * 0.5)
    assert torch.equal(lanes_out, x)
    out = torch.empty(n, dtype=torch.int64)
    vec.call("arange_int64", out, n)
    assert torch.equal(out, torch.arange(n) * 3)


def _interesting_floats(n=200000, seed=10):
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    rnd = bits.view(torch.float32)
    # exact ties and near-ties for bf16 (16 dropped bits) and fp16 (13 dropped bits, plus
    # the denormal range of half: |x| < 2^-14)
    base = torch.randint(0, 2**16, (4000,), generator=g, dtype=torch.int64).to(torch.int32)
    ties = torch.cat([(base << 16) | 0x8000, (base << 16) | 0x7FFF, (base << 16) | 0x8001]).view(torch.float32)
    half_vals = torch.randint(0, 2**16, (4000,), generator=g, dtype=torch.int64).to(torch.int16).view(torch.float16).float()
    half_bits = half_vals.view(torch.int32)
    half_ties = torch.cat([half_bits | 0x1000, (half_bits | 0x1000) + 1, half_bits | 0x0FFF]).view(torch.float32)
    tiny = torch.empty(4000).uniform_(-(2.0**-13), 2.0**-13, generator=g)
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, 65504.0, 65519.99, 65520.0, -65520.0,
                             FLT_MAX, 3.3961e38, 1e-45, 5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5])
    x = torch.cat([rnd, ties, half_vals, half_ties, tiny, specials])
    return x[~torch.isnan(x)][:-3].contiguous()  # NaNs are checked separately; odd length


@pytest.mark.parametrize("kind", ["bf16", "half"])
def test_16bit_float_conversions(vec, kind):
    dtype = torch.bfloat16 if kind == "bf16" else torch.float16
    # every 16-bit pattern -> float, exactly as torch (NaN payloads included)
    all_bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    want = all_bits.view(dtype).float().view(torch.int32)
    for mode in ("vec", "scalar"):
        y = torch.empty(all_bits.shape, dtype=torch.float32)
        vec.call(f"{kind}_to_float_{mode}", all_bits, y, all_bits.numel())
        got = y.view(torch.int32)
        is_nan = torch.isnan(want.view(torch.float32))
        assert torch.equal(got[~is_nan], want[~is_nan]), mode
        assert torch.isnan(y[is_nan]).all()
    # float -> 16 bits: round to nearest even, denormals, overflow: bit for bit
    x = _interesting_floats()
    want16 = x.to(dtype).view(torch.int16)
    for mode in ("vec", "scalar"):
        y = torch.empty(x.shape, dtype=torch.int16)
        vec.call(f"float_to_{kind}_{mode}", x, y, x.numel())
        mismatch = (y != want16).nonzero()
        assert mismatch.numel() == 0, f"{mode}: x={x[mismatch[0]].item()!r} got {y[mismatch[0]].item():#x} want {want16[mismatch[0]].item():#x}"
        nans = torch.tensor([math.nan, -math.nan, torch.tensor(0x7F800001, dtype=torch.int32).view(torch.float32).item()] * 7)
        yn = torch.empty(nans.shape, dtype=torch.int16)
        vec.call(f"float_to_{kind}_{mode}", nans, yn, nans.numel())
        assert torch.isnan(yn.view(dtype).float()).all()


def test_row_reductions(vec):
    g = torch.Generator().manual_seed(11)
    for cols in (1, 5, 16, 37, 100):
        x = torch.randn(9, cols, generator=g)
        x[3, cols // 2] = math.nan
        x[4, :] = -math.inf
        out = torch.empty(9)
        vec.call("row_sum_float", x, out, 9, cols)
        torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-5, equal_nan=True)
        vec.call("row_max_float", x, out, 9, cols)
        assert torch.equal(out.isnan(), x.amax(1).isnan()) and torch.equal(out[~out.isnan()], x.amax(1)[~out.isnan()])
        vec.call("row_min_float", x, out, 9, cols)
        assert torch.equal(out.isnan(), x.amin(1).isnan()) and torch.equal(out[~out.isnan()], x.amin(1)[~out.isnan()])
        p = torch.rand(9, cols, generator=g) + 0.5
        vec.call("row_prod_float", p, out, 9, cols)
        torch.testing.assert_close(out, p.prod(1), rtol=1e-5, atol=0)
        xd = x.double()
        outd = torch.empty(9, dtype=torch.float64)
        vec.call("row_sum_double", xd, outd, 9, cols)
        torch.testing.assert_close(outd, xd.sum(1), rtol=1e-12, atol=1e-12, equal_nan=True)
        xi = torch.randint(-1000, 1000, (9, cols), generator=g)
        outi = torch.empty(9, dtype=torch.int64)
        vec.call("row_sum_int64_t", xi, outi, 9, cols)
        assert torch.equal(outi, xi.sum(1))
        xi32 = xi.to(torch.int32)
        outi32 = torch.empty(9, dtype=torch.int32)
        vec.call("row_max_int32_t", xi32, outi32, 9, cols)
        assert torch.equal(outi32, xi32.amax(1))


def test_welford(vec):
    g = torch.Generator().manual_seed(12)
    for cols in (1, 3, 16, 37, 1000):
        x = torch.randn(6, cols, generator=g) * 3 + 10
        x[5] = 4.0  # constant row: variance exactly 0
        out = torch.empty(6, 9)
        vec.call("row_welford_float", x, out, 6, cols)
        var, mean = torch.var_mean(x.double(), dim=1, correction=0)
        for k in range(3):  # vector lanes, scalar, combined halves
            torch.testing.assert_close(out[:, 3 * k].double(), mean, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out[:, 3 * k + 1].double(), var, rtol=1e-4, atol=1e-5)
            assert torch.equal(out[:, 3 * k + 2], torch.full((6,), float(cols)))
        assert out[5, 1] == 0 and out[5, 4] == 0


def test_argmax_argmin(vec):
    g = torch.Generator().manual_seed(13)
    rows = []
    for cols in (1, 5, 16, 17, 40):
        base = torch.randint(0, 4, (8, cols), generator=g).float()  # many ties
        base[1] = -math.inf  # all -inf: index 0
        if cols > 3:
            base[2, 2] = math.nan  # nan wins argmax and argmin
            base[3, 1] = math.nan
            base[3, 3] = math.nan  # first nan wins
            base[4, cols - 1] = 9.0  # max in the tail
            base[5, cols - 1] = -9.0
        rows.append(base)
    for x in rows:
        r, cols = x.shape
        out = torch.empty(r, 5, dtype=torch.int64)
        vec.call("row_arg_float", x, out, r, cols)
        amax, amin = torch.argmax(x, 1), torch.argmin(x, 1)
        for k, want in enumerate([amax, amin, amax, amin, amax]):
            assert torch.equal(out[:, k], want), (k, x, out[:, k], want)
        xi = (x.nan_to_num(7.0, 8.0, -8.0) * 3).to(torch.int64)
        outi = torch.empty(r, 2, dtype=torch.int64)
        vec.call("row_arg_int64", xi, outi, r, cols)
        assert torch.equal(outi[:, 0], torch.argmax(xi, 1)) and torch.equal(outi[:, 1], torch.argmin(xi, 1))
