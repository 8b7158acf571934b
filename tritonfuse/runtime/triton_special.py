"""Loops whose trip count is a value of the tensor, for Triton kernels: the recurrences of
torch.special's orthogonal polynomials (``tf_helpers.chebyshev_loop`` ...), the Hurwitz
zeta series (``tf_helpers.zeta``), Airy Ai's power series and the incomplete gamma
functions' series and continued fraction (``tf_helpers.igamma_series`` ...). The C++ backend's twins are in
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

# ATen's MACHEP, 1.11022302462515654042E-16, written out where it is used: compiled Triton
# reads no global that is not a constexpr (the interpreter does, which hid it).


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
    done = done | (tl.abs(t / s) < 1.11022302462515654042E-16)
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
        converged = running & (-1.11022302462515654042E-16 * s < b) & (b < 1.11022302462515654042E-16 * s)
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


# ---- The incomplete gamma functions' loops ---------------------------------------------------
# ATen's Math.h loops (tritonfuse/special_igamma.py says which lane takes which), each until its
# terms vanish against its sum (the dtype's MACHEP) or 2000 steps, in the operands' dtype
# (2000 written out: compiled Triton reads no global that is not a constexpr).


@triton.jit
def _igamma_start(a, x):
    """Both operands as blocks and the dtype's MACHEP. special_igamma.py passes blocks of one
    dtype (a where with the operand); a float literal would come out float32 here."""
    a = tl.where(x != x, a, a)
    x = tl.where(a != a, x, x)
    if x.dtype == tl.float64:
        machep = 1.11022302462515654042E-16
    else:
        machep = 5.9604644775390625E-8
    return a, x, machep


@triton.jit
def igamma_series(a, x):
    """P's power series (DLMF 8.11.4): r += 1, c *= x / r, ans += c; returns ans."""
    a, x, machep = _igamma_start(a, x)
    r = a
    c = tl.full(a.shape, 1.0, a.dtype)
    ans = tl.full(a.shape, 1.0, a.dtype)
    active = ans == ans
    i = 0
    while _any(active):
        r_next = r + 1.0
        c_next = c * (x / r_next)
        ans_next = ans + c_next
        r = tl.where(active, r_next, r)
        c = tl.where(active, c_next, c)
        ans = tl.where(active, ans_next, ans)
        i += 1
        active = active & (c_next > machep * ans_next) & (i < 2000)
    return ans


@triton.jit
def igammac_series(a, x):
    """Q's series for small x (DLMF 8.7.3): fac *= -x / n, sum += fac / (a + n); returns sum."""
    a, x, machep = _igamma_start(a, x)
    fac = tl.full(a.shape, 1.0, a.dtype)
    total = tl.zeros(a.shape, a.dtype)
    active = fac == fac
    n = 1
    while _any(active):
        fac_next = fac * (-x / n)
        term = fac_next / (a + n)
        total_next = total + term
        fac = tl.where(active, fac_next, fac)
        total = tl.where(active, total_next, total)
        n += 1
        active = active & (tl.abs(term) > machep * tl.abs(total_next)) & (n < 2000)
    return total


@triton.jit
def igammac_fraction(a, x):
    """Q's continued fraction (DLMF 8.9.2) as Math.h's recurrence of p_k / q_k, rescaled when
    p_k grows past BIG; returns the last ratio."""
    a, x, machep = _igamma_start(a, x)
    if x.dtype == tl.float64:
        big = 4.503599627370496e15
        big_inverse = 2.22044604925031308085e-16
    else:
        big = 16777216.0
        big_inverse = 5.9604644775390625E-8
    y = 1.0 - a
    z = x + y + 1.0
    c = tl.zeros(a.shape, a.dtype)
    pkm2 = tl.full(a.shape, 1.0, a.dtype)
    qkm2 = x
    pkm1 = x + 1.0
    qkm1 = z * x
    ans = pkm1 / qkm1
    active = c == c
    i = 0
    while _any(active):
        c_next = c + 1.0
        y_next = y + 1.0
        z_next = z + 2.0
        yc = y_next * c_next
        pk = pkm1 * z_next - pkm2 * yc
        qk = qkm1 * z_next - qkm2 * yc
        nonzero = qk != 0.0
        r = pk / tl.where(nonzero, qk, 1.0)
        t = tl.where(nonzero, tl.abs((ans - r) / r), 1.0)
        rescale = tl.abs(pk) > big
        ans = tl.where(active & nonzero, r, ans)
        c = tl.where(active, c_next, c)
        y = tl.where(active, y_next, y)
        z = tl.where(active, z_next, z)
        pkm2 = tl.where(active, tl.where(rescale, pkm1 * big_inverse, pkm1), pkm2)
        qkm2 = tl.where(active, tl.where(rescale, qkm1 * big_inverse, qkm1), qkm2)
        pkm1 = tl.where(active, tl.where(rescale, pk * big_inverse, pk), pkm1)
        qkm1 = tl.where(active, tl.where(rescale, qk * big_inverse, qk), qkm1)
        i += 1
        active = active & (t > machep) & (i < 2000)
    return ans
