"""torch.special's orthogonal polynomials, Hurwitz zeta, Airy Ai and the incomplete gamma
functions: loops whose trip count is a value of the tensor (special cases in
tritonfuse/special_polynomials.py, special_airy.py and special_igamma.py;
the loop primitives in cpu_backend/include/tf_special_loops.h and
tritonfuse/runtime/triton_special.py).
Compared with eager on every column, over the special cases of ATen's Math.h (n < 0,
n NaN or infinite, |x| == 1, x == 0, the closed forms for larger n, Hermite's NaN above
its limit) and lanes of one block with very different trip counts; no aten call left."""
import pytest
import torch

import tritonfuse
from common import check, kernel_count

POLYNOMIALS = [
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
    "legendre_polynomial_p",
]

X = [1.0, -1.0, 0.0, 0.5, -0.5, 0.25, -0.75, 2.0, -1.5, 1.25, 0.9, float("inf")]
N = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 9.0, 12.0, 2.7, -1.0, -3.5, float("nan"), float("inf"), 1e30, 140.0]


def _kernels_only():
    assert not tritonfuse.metrics.fallbacks, tritonfuse.metrics.fallbacks
    assert kernel_count() > 0


# Degrees at or past 2**63 on CUDA: eager converts them to INT64_MAX, and then its closed
# forms multiply acos's last-ulp by 2**63 (no two libms agree) and its recurrences step 2**63
# times; test_saturated_degrees_on_cuda covers the cases eager answers at once.
N_CUDA = [n for n in N if not abs(n) >= 2.0 ** 63]


def _grid(dtype, device):
    """Every x with every n: one block holds lanes with 0 to 140 steps."""
    x = torch.tensor(X, dtype=dtype)
    n = torch.tensor(N_CUDA if torch.device(device).type == "cuda" else N, dtype=dtype)
    return (x[:, None].expand(-1, len(n)).contiguous().to(device),
            n[None, :].expand(len(X), -1).contiguous().to(device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_matches_eager(device, name, dtype):
    fn = getattr(torch.special, name)
    x, n = _grid(dtype, device)
    # (big values of |x| > 1 overflow to inf or NaN at the same step as in eager)
    check(lambda a, b: fn(a * 1.0, b), x, n, rtol=1e-4 if dtype == torch.float32 else 1e-10)
    _kernels_only()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_saturated_degrees_on_cuda(device, dtype):
    """CUDA converts +inf and n >= 2**63 to INT64_MAX (x86 gives INT64_MIN, as both do for
    NaN and -inf: the other columns' grid covers that): the cases where eager answers
    without its 2**63-step loop (x = +-1, Hermite's limit, n NaN or negative)."""
    if torch.device(device).type != "cuda":
        pytest.skip("tests CUDA's float-to-int64 conversion of the degree; x86's is covered by the other columns' grid")
    x = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 0.5, 2.0, -0.75], dtype=dtype, device=device)
    n = torch.tensor([float("inf"), float("inf"), 1e30, 1e30, -float("inf"), -1e30] + [float("nan")] * 3,
                     dtype=dtype, device=device)
    for name in ("chebyshev_polynomial_t", "chebyshev_polynomial_w", "legendre_polynomial_p",
                 "hermite_polynomial_h", "hermite_polynomial_he"):
        torch._dynamo.reset()
        fn = getattr(torch.special, name)
        check(lambda a, b: fn(a * 1.0, b), x, n, rtol=1e-6)
    _kernels_only()


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "hermite_polynomial_h", "legendre_polynomial_p"])
def test_polynomial_scalar_and_integer_operands(device, name):
    fn = getattr(torch.special, name)
    x = torch.linspace(-1.5, 1.5, 13, device=device)
    n = torch.arange(0, 13, device=device)              # int64 degrees: computed in float32
    check(lambda a, b: fn(a, b), x, n, rtol=1e-4)
    # a Python-number operand: the special-case tests on it are ops on literals alone, which
    # Triton code once left as Python values (`bool & tensor`, `float.to`: the graph ran eagerly)
    check(lambda a, b: (fn(a, 5), fn(0.3, b)), x, n, rtol=1e-4)
    _kernels_only()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zeta_matches_eager(device, dtype):
    """Hurwitz zeta: poles and domain errors (x <= 1, q a non-positive integer, q < 0 with a
    fractional x), negative q (a direct sum of ~|q| terms in that lane), large q and x."""
    x = torch.tensor([1.0, 0.5, 2.0, 3.0, 2.5, 1.5, 4.0, 10.0, 2.0, 2.0, 3.0, 2.0, 1.0001, 30.0, 2.0, 5.0],
                     dtype=dtype)
    q = torch.tensor([1.0, 1.0, 1.0, 0.5, 2.0, 0.1, -2.5, 3.0, 0.0, -3.0, -2.5, 100.0, 1.0, 0.7, -300.5, 1e-3],
                     dtype=dtype)
    torch.manual_seed(0)
    x = torch.cat([x, torch.rand(20, dtype=dtype) * 5 + 1]).to(device)
    q = torch.cat([q, torch.rand(20, dtype=dtype) * 10 - 2]).to(device)
    check(lambda a, b: torch.special.zeta(a * 1.0, b), x, q, rtol=1e-5 if dtype == torch.float32 else 1e-9)
    _kernels_only()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_airy_ai_matches_eager(device, dtype):
    """Airy Ai: each of ATen's branches and their edges (+-2.09, 8.32, 103.892, +-inf, NaN),
    the power series in between (a trip count that follows x), and x << 0, where sin(t)
    takes t ~ 2e4 and one ulp of t shows."""
    x = torch.cat([torch.tensor([0.0, -0.0, 1.0, -1.0, 2.08, 2.09, -2.09, -2.1, 5.0, 8.3, 8.33, 20.0, 103.0, 104.0,
                                 -50.0, -1e3, float("inf"), float("-inf"), float("nan")]),
                   torch.linspace(-12, 12, 49)]).to(dtype).to(device)
    check(lambda a: torch.special.airy_ai(a * 1.0), x, atol=1e-6 if dtype == torch.float32 else 1e-12,
          rtol=1e-5 if dtype == torch.float32 else 1e-10)
    _kernels_only()


IGAMMA_A = [0.0, 1e-3, 0.1, 0.5, 1.0, 1.5, 2.0, 3.7, 5.0, 10.0, 19.0, 21.0, 30.0, 50.0, 100.0, 199.0, 201.0, 250.0,
            1000.0, 1e4, float("inf"), float("nan"), -1.0]
IGAMMA_X = [0.0, 1e-4, 0.1, 0.3, 0.5, 0.7, 1.0, 1.05, 1.1, 1.5, 2.0, 5.0, 10.0, 20.0, 25.0, 30.0, 60.0, 100.0, 200.0,
            210.0, 260.0, 1000.0, 1.1e4, float("inf"), float("nan"), -1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["gammainc", "gammaincc"])
def test_incomplete_gamma_matches_eager(device, name, dtype):
    """P(a, x) and Q(a, x) over every a with every x: Math.h's boundary values (0, inf, NaN,
    negative), the asymptotic expansion (a ~ x above 20 and above 200, across its region),
    the power series,
    the series of Q for x <= 1.1 on each side of 0.5 and the continued fraction, with lanes
    of very different trip counts in one block; no aten call left."""
    fn = getattr(torch.special, name)
    a = torch.tensor(IGAMMA_A, dtype=dtype)
    x = torch.tensor(IGAMMA_X, dtype=dtype)
    a, x = a[:, None].expand(-1, len(IGAMMA_X)).flatten(), x[None, :].expand(len(IGAMMA_A), -1).flatten()
    # and across the asymptotic expansion's region: |x - a| / a up to 0.3, 4.5 / sqrt(a) above 200
    near = torch.tensor([20.5, 21.0, 35.0, 60.0, 150.0, 199.5, 200.5, 300.0, 1e3, 1e4, 1e5], dtype=torch.float64)
    spread = torch.linspace(-0.99, 0.99, 13, dtype=torch.float64)
    bound = torch.where(near < 200, torch.full_like(near, 0.3), 4.5 / near.sqrt())
    a = torch.cat([a, near[:, None].expand(-1, 13).flatten().to(dtype)]).to(device)
    x = torch.cat([x, (near[:, None] * (1 + spread[None, :] * bound[:, None])).flatten().to(dtype)]).to(device)
    # float64 on CUDA: eager's own CUDA and CPU results differ by up to 1.2e-9 (relative) on
    # this grid, and tritonfuse's CUDA kernel is within 2.3e-13 of the CPU's (H200)
    f64_rtol = 5e-9 if torch.device(device).type == "cuda" else 1e-10
    check(lambda p, q: fn(p * 1.0, q), a, x,
          atol=1e-6 if dtype == torch.float32 else 1e-14, rtol=1e-4 if dtype == torch.float32 else f64_rtol)
    _kernels_only()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_incomplete_gamma_in_place_and_broadcast(device, dtype):
    """Tensor.igamma_ / igammac_ (in place: functionalized to igamma / igammac), a broadcast
    row and a 0-d operand, 16-bit floats computed in float as eager's kernel does; one kernel."""
    a = (torch.rand(6, 40, dtype=torch.float32) * 30).to(dtype).to(device)
    x = (torch.rand(40, dtype=torch.float32) * 30).to(dtype).to(device)

    def fn(p, q):
        p = p * 1.0
        p.igamma_(q)
        r = (p * 10.0 + 0.5).igammac_(q[0])
        return r + torch.special.gammaincc(q, p)
    tolerance = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-6, rtol=1e-4)
    if torch.device(device).type == "cuda" and dtype == torch.bfloat16:
        # eager has no bfloat16 igamma kernel on CUDA ("igamma_cuda" not implemented): its
        # CPU kernel is the reference
        compiled = torch.compile(fn, backend="tritonfuse")
        torch.testing.assert_close(compiled(a, x).cpu(), fn(a.cpu(), x.cpu()), **tolerance)
    else:
        check(fn, a, x, **tolerance)
    _kernels_only()
    assert kernel_count() == 1


def _loop_helpers_kernel():
    import triton
    import triton.language as tl

    from tritonfuse.runtime import triton_helpers as tf_helpers

    @triton.jit
    def kernel(a_ptr, x_ptr, out_ptr, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        a = tl.load(a_ptr + i)
        x = tl.load(x_ptr + i)
        r = tf_helpers.igamma_series(a, x) + tf_helpers.igammac_series(a, x) + tf_helpers.igammac_fraction(a, x + 2.0)
        r += tf_helpers.zeta(a, x) + tf_helpers.airy_ai_series(x) + tf_helpers.chebyshev_loop(a, x, 2.0 * a)
        tl.store(out_ptr + i, r)
    return kernel


@pytest.mark.parametrize("pointer", ["*fp32", "*fp64"])
def test_loop_helpers_compile_for_a_gpu(pointer):
    """The loop primitives compile for an sm_90 GPU (no GPU needed: Triton compiles ahead of
    time for a target): compiled Triton reads no non-constexpr global, which the interpreter
    columns do not check (zeta's MACHEP was one)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    source = ASTSource(fn=_loop_helpers_kernel(), constexprs={"BLOCK": 64},
                       signature={"a_ptr": pointer, "x_ptr": pointer, "out_ptr": pointer, "BLOCK": "constexpr"})
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    except RuntimeError as error:   # no CUDA toolchain in this Triton
        pytest.skip(f"Triton cannot compile for CUDA here: {error}")
    assert "ptx" in compiled.asm
