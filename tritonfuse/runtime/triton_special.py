"""The recurrence loops of torch.special's orthogonal polynomials for Triton kernels
(``tf_helpers.chebyshev_loop`` ...; the C++ backend's twins are in
cpu_backend/include/tf_special_loops.h, the op table declares them).

Each lane has its own trip count (the degree n, a value of the tensor): the block loops
while any lane is still running, and a lane that is done keeps its value. The steps are
ATen's Math.h recurrences, operation for operation: p starts at 1, q is the degree-1 value
the caller passes, and the last q is returned. Callers pass n = 0 to lanes that take a
special case instead (tritonfuse/special_polynomials.py), so those cost no steps.
"""
import triton
import triton.language as tl


@triton.jit
def _any(active):
    return tl.max(active.to(tl.int32)) > 0


@triton.jit
def _start(n, q):
    """q as a block of n's shape (q is a literal where x is a Python scalar; the trip
    counts always form a block), and p = 1 beside it."""
    q = tl.where(n == n, q, q)
    return tl.full(q.shape, 1.0, q.dtype), q


@triton.jit
def chebyshev_loop(a, n, q):
    """r = a q - p for k = 2 .. n, stopping at a NaN q."""
    p, q = _start(n, q)
    k = 2
    active = (k <= n) & (q == q)
    while _any(active):
        r = a * q - p
        p = tl.where(active, q, p)
        q = tl.where(active, r, q)
        k += 1
        active = active & (k <= n) & (q == q)
    return q


@triton.jit
def hermite_h_loop(x, n, q):
    """r = (x + x) q - k p for k = 2, 4, .. below 2n."""
    p, q = _start(n, q)
    k = 2
    active = k < n + n
    while _any(active):
        r = (x + x) * q - k * p
        p = tl.where(active, q, p)
        q = tl.where(active, r, q)
        k += 2
        active = active & (k < n + n)
    return q


@triton.jit
def hermite_he_loop(x, n, q):
    """r = x q - k p for k = 1 .. n - 1."""
    p, q = _start(n, q)
    k = 1
    active = k < n
    while _any(active):
        r = x * q - k * p
        p = tl.where(active, q, p)
        q = tl.where(active, r, q)
        k += 1
        active = active & (k < n)
    return q


@triton.jit
def laguerre_loop(x, n, q):
    """r = (((k + k) + (1 - x)) q - k p) / (k + 1) for k = 1 .. n - 1, stopping at a NaN q."""
    p, q = _start(n, q)
    k = 1
    active = (k < n) & (q == q)
    while _any(active):
        r = (((k + k) + (1.0 - x)) * q - k * p) / (k + 1)
        p = tl.where(active, q, p)
        q = tl.where(active, r, q)
        k += 1
        active = active & (k < n) & (q == q)
    return q


@triton.jit
def legendre_loop(x, n, q):
    """r = ((k + k + 1) x q - k p) / (k + 1) for k = 1 .. n - 1, stopping at a NaN q."""
    p, q = _start(n, q)
    k = 1
    active = (k < n) & (q == q)
    while _any(active):
        r = ((k + k + 1) * x * q - k * p) / (k + 1)
        p = tl.where(active, q, p)
        q = tl.where(active, r, q)
        k += 1
        active = active & (k < n) & (q == q)
    return q
