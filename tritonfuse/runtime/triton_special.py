"""Loops whose trip count is a value of the tensor, for Triton kernels: the recurrences of
torch.special's orthogonal polynomials (``tf_helpers.chebyshev_loop`` ...) and the Hurwitz
zeta series (``tf_helpers.zeta``). The C++ backend's twins are in
cpu_backend/include/tf_special_loops.h; the op table declares them.

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


# ---- Hurwitz zeta(x, q) ------------------------------------------------------------------

ZETA_MACHEP = 1.11022302462515654042E-16


@triton.jit
def _pow_f64(a, b):
    """a ** b for float64 a (negative a with an integer b keeps the sign of its odd powers)."""
    magnitude = tl.exp2(b * tl.log2(tl.abs(a)))
    odd = (b - 2.0 * tl.floor(b * 0.5)) != 0.0
    return tl.where((a < 0) & odd, -magnitude, magnitude)


@triton.jit
def _zeta_correction(s, a, b, k, x, w, done, coefficient):
    """One Euler-Maclaurin term of ATen's zeta; a lane whose term vanished is done."""
    a = a * (x + k)
    b = b / w
    t = a * b / coefficient
    s = tl.where(done, s, s + t)
    done = done | (tl.abs(t / s) < ZETA_MACHEP)
    k = k + 1.0
    a = a * (x + k)
    b = b / w
    k = k + 1.0
    return s, a, b, k, done


@triton.jit
def zeta(x, q):
    """ATen's Cephes-derived Hurwitz zeta, in float64 (the CPU accumulate type of float):
    the direct sum until its terms vanish (at least 9, and until a > 9: a trip count that
    follows q, run while any lane needs it), then up to 12 Euler-Maclaurin corrections."""
    x = tl.where(q != q, x, x)          # both blocks, even where one is a literal
    q = tl.where(x != x, q, q)
    out_dtype = (x + q).dtype
    x = x.to(tl.float64)
    q = q.to(tl.float64)
    special = tl.where(x == 1.0, float("inf"), float("nan"))
    at_pole = (q <= 0.0) & (q == tl.floor(q))
    special = tl.where((x != 1.0) & (x >= 1.0) & at_pole, float("inf"), special)
    done = (x <= 1.0) | (x != x) | ((q <= 0.0) & (at_pole | (x != tl.floor(x))))
    s = _pow_f64(q, -x)
    a = q
    b = tl.zeros_like(q)
    i = 0
    running = (~done) & ((a <= 9.0) | (i < 9))
    while tl.max(running.to(tl.int32)) > 0:
        a = tl.where(running, a + 1.0, a)
        b = tl.where(running, _pow_f64(a, -x), b)
        s = tl.where(running, s + b, s)
        converged = running & (-ZETA_MACHEP * s < b) & (b < ZETA_MACHEP * s)
        done = done | converged
        i += 1
        running = (~done) & ((a <= 9.0) | (i < 9))
    summed = done
    w = a
    s = tl.where(summed, s, s + b * w / (x - 1.0) - 0.5 * b)
    a = tl.full(q.shape, 1.0, tl.float64)
    k = tl.zeros_like(q)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, 12.0)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, -720.0)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, 30240.0)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, -1209600.0)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, 47900160.0)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, -1.8924375803183791606e9)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, 7.47242496e10)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, -2.950130727918164224e12)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, 1.1646782814350067249e14)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, -4.5979787224074726105e15)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, 1.8152105401943546773e17)
    s, a, b, k, done = _zeta_correction(s, a, b, k, x, w, done, -7.1661652561756670113e18)
    is_special = (x <= 1.0) | (x != x) | ((q <= 0.0) & (at_pole | (x != tl.floor(x))))
    return tl.where(is_special, special, s).to(out_dtype)


# ---- Airy Ai's power series ------------------------------------------------------------------

@triton.jit
def airy_ai_series(x):
    """ATen's power series of Ai for -2.09 <= x < 2.09: terms of f and g until the last one
    of f vanishes against f (the dtype's epsilon), lane by lane; c1 f - c2 g."""
    if x.dtype == tl.float64:
        eps = 2.220446049250313e-16
    else:
        eps = 1.1920928955078125e-07
    f = tl.full(x.shape, 1.0, x.dtype)
    g = x
    k = tl.full(x.shape, 1.0, x.dtype)
    m = tl.full(x.shape, 1.0, x.dtype)
    n = x
    z = x * x * x
    active = f == f
    while tl.max(active.to(tl.int32)) > 0:
        m_next = m * z
        k_next = k + 1.0
        m_next = m_next / k_next
        n_next = n * z
        k_next = k_next + 1.0
        n_next = n_next / k_next
        m_next = m_next / k_next
        f_next = f + m_next
        k_next = k_next + 1.0
        n_next = n_next / k_next
        g_next = g + n_next
        m = tl.where(active, m_next, m)
        n = tl.where(active, n_next, n)
        k = tl.where(active, k_next, k)
        f = tl.where(active, f_next, f)
        g = tl.where(active, g_next, g)
        active = active & (tl.abs(m / f) > eps)
    return 0.355028053887817239260 * f - 0.258819403792806798405 * g
