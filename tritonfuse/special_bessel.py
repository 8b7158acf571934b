"""Bessel functions of the first and second kind (J0, J1, Y0, Y1) and modified Bessel
functions of the second kind (K0, K1 and their exponentially scaled forms), written once
in terms of the op table's primitives, for ``torch.special``'s lowerings
(lowering/pointwise_math.py).

They follow eager PyTorch's Cephes-derived formulas step for step, rational functions and
Chebyshev series of the same coefficients evaluated in the same order, so results agree
with eager's to rounding: below x = 5 (J, Y) a rational function of x^2 (with the log term
of Y), above it the Hankel asymptotic form; K below x = 2 a Chebyshev series in x^2 - 2 plus
the log(x/2) I(x) term, above it a series in 8/x - 2 times exp(-x)/sqrt(x).
"""
import math

from .math_composites import i0, i1, polynomial
from .virtualized import ops


def _c(value, dtype):
    return ops.constant(value, dtype)


def chbevl(t, coefficients, dtype):
    """Cephes' Chebyshev series 0.5 (b0 - b2), b_k = t b_(k+1) - b_(k+2) + c_k (eager's
    recurrence, term for term; ``t`` is already twice the Chebyshev argument)."""
    b0, b1, b2 = _c(coefficients[0], dtype), None, None
    for c in coefficients[1:]:
        b2, b1 = b1, b0
        step = ops.mul(t, b1) if b2 is None else ops.sub(ops.mul(t, b1), b2)
        b0 = ops.add(step, _c(c, dtype))
    return ops.mul(_c(0.5, dtype), b0 if b2 is None else ops.sub(b0, b2))


def _ratio(z, numerator, denominator, dtype):
    return ops.truediv(polynomial(z, numerator, dtype), polynomial(z, denominator, dtype))


# ---- J0, J1, Y0, Y1 ----------------------------------------------------------------------

J0_PP = (7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
         5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
         9.99999999999999997821e-01)
J0_PQ = (9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
         5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
         1.00000000000000000218e+00)
J0_QP = (-1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
         -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
         -5.14105326766599330220e+01, -6.05014350600728481186e+00)
J0_QQ = (6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
         7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
         2.42005740240291393179e+02)
J0_RP = (-4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14,
         9.70862251047306323952e+15)
J0_RQ = (4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07,
         1.11855537045356834862e+10, 2.11277520115489217587e+12, 3.10518229857422583814e+14,
         3.18121955943204943306e+16, 1.71086294081043136091e+18)
Y0_YP = (1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09,
         -9.82136065717911466409e+11, 8.75906394395366999549e+13, -3.46628303384729719441e+15,
         4.42733268572569800351e+16, -1.84950800436986690637e+16)
Y0_YQ = (1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08,
         8.64002487103935000337e+10, 2.02979612750105546709e+13, 3.17157752842975028269e+15,
         2.50596256172653059228e+17)

J1_PP = (7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
         5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
         1.00000000000000000254e+00)
J1_PQ = (5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
         5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
         9.99999999999999997461e-01)
J1_QP = (5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
         3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
         2.11688757100572135698e+02, 2.52070205858023719784e+01)
J1_QQ = (7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
         9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
         3.36093607810698293419e+02)
J1_RP = (-8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13,
         3.68295732863852883286e+15)
J1_RQ = (6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07,
         2.21511595479792499675e+10, 4.74914122079991414898e+12, 7.84369607876235854894e+14,
         8.95222336184627338078e+16, 5.32278620332680085395e+18)
Y1_YP = (1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14,
         -8.12770255501325109621e+15, 2.02439475713594898196e+17, -7.78877196265950026825e+17)
Y1_YQ = (5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07,
         1.87601316108706159478e+10, 3.88231277496238566008e+12, 6.20557727146953693363e+14,
         6.87141087355300489866e+16, 3.97270608116560655612e+18)

TWO_OVER_PI = 0.636619772367581343075535053490057448
SQRT_TWO_OVER_PI = 0.797884560802865355879892119868763737


def _hankel(a, order, dtype, second_kind):
    """The large-argument form of J (``second_kind`` False) or Y of order 0 or 1 at a > 5."""
    pp, pq, qp, qq = (J0_PP, J0_PQ, J0_QP, J0_QQ) if order == 0 else (J1_PP, J1_PQ, J1_QP, J1_QQ)
    five = _c(5.0, dtype)
    if order == 0:
        z = ops.truediv(_c(25.0, dtype), ops.mul(a, a))
    else:
        z = ops.mul(ops.truediv(five, a), ops.truediv(five, a))
    p = _ratio(z, pp, pq, dtype)
    q = ops.mul(ops.truediv(five, a), _ratio(z, qp, qq, dtype))
    phase = ops.sub(a, _c(math.pi / 4 if order == 0 else 3 * math.pi / 4, dtype))
    if second_kind:
        wave = ops.add(ops.mul(p, ops.sin(phase)), ops.mul(q, ops.cos(phase)))
    else:
        wave = ops.sub(ops.mul(p, ops.cos(phase)), ops.mul(q, ops.sin(phase)))
    return ops.truediv(ops.mul(wave, _c(SQRT_TWO_OVER_PI, dtype)), ops.sqrt(a))


def bessel_j0(x, dtype):
    a = ops.abs(x)
    z = ops.mul(a, a)
    near = ops.mul(ops.mul(ops.sub(z, _c(5.78318596294678452118e+00, dtype)),
                           ops.sub(z, _c(3.04712623436620863991e+01, dtype))),
                   _ratio(z, J0_RP, J0_RQ, dtype))
    tiny = ops.sub(_c(1.0, dtype), ops.truediv(z, _c(4.0, dtype)))
    near = ops.where(ops.lt(a, _c(1e-5, dtype)), tiny, near)
    return ops.where(ops.le(a, _c(5.0, dtype)), near, _hankel(a, 0, dtype, second_kind=False))


def bessel_j1(x, dtype):
    """Odd: the rational form below 5 is odd in x; above it the sign of x times J1(|x|)."""
    a = ops.abs(x)
    z = ops.mul(x, x)
    near = ops.mul(ops.mul(ops.mul(_ratio(z, J1_RP, J1_RQ, dtype), x),
                           ops.sub(z, _c(1.46819706421238932572e+01, dtype))),
                   ops.sub(z, _c(4.92184563216946036703e+01, dtype)))
    far = _hankel(a, 1, dtype, second_kind=False)
    far = ops.where(ops.lt(x, _c(0.0, dtype)), ops.neg(far), far)
    return ops.where(ops.le(a, _c(5.0, dtype)), near, far)


def _second_kind(x, near, dtype, order):
    """Y: ``near`` below 5, the asymptotic form above, -inf at 0 and NaN below."""
    value = ops.where(ops.le(x, _c(5.0, dtype)), near, _hankel(x, order, dtype, second_kind=True))
    value = ops.where(ops.lt(x, _c(0.0, dtype)), _c(math.nan, dtype), value)
    return ops.where(ops.eq(x, _c(0.0, dtype)), _c(-math.inf, dtype), value)


def bessel_y0(x, dtype):
    z = ops.mul(x, x)
    log_term = ops.mul(ops.mul(_c(TWO_OVER_PI, dtype), ops.log(x)), bessel_j0(x, dtype))
    return _second_kind(x, ops.add(_ratio(z, Y0_YP, Y0_YQ, dtype), log_term), dtype, 0)


def bessel_y1(x, dtype):
    z = ops.mul(x, x)
    log_term = ops.sub(ops.mul(bessel_j1(x, dtype), ops.log(x)), ops.reciprocal(x))
    near = ops.add(ops.mul(x, _ratio(z, Y1_YP, Y1_YQ, dtype)), ops.mul(_c(TWO_OVER_PI, dtype), log_term))
    return _second_kind(x, near, dtype, 1)


# ---- K0, K1 and exp(x) K0, exp(x) K1 --------------------------------------------------------

K0_A = (1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
        1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
        1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
        -5.35327393233902768720e-01)
K0_B = (5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
        -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
        6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
        -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
        1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
        -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
        2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
        -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
        2.44030308206595545468e+00)
K1_A = (-7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
        -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
        -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
        -3.53155960776544875667e-01, 1.52530022733894777053e+00)
K1_B = (-5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
        1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
        -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
        3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
        -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
        2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
        -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
        1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
        2.72062619048444266945e+00)


def _modified_second_kind(x, dtype, order, scaled):
    """K0 / K1 (times exp(x) when ``scaled``): +inf at 0, NaN below."""
    a_coefficients, b_coefficients, first_kind = (K0_A, K0_B, i0) if order == 0 else (K1_A, K1_B, i1)
    two = _c(2.0, dtype)
    series = chbevl(ops.sub(ops.mul(x, x), two), a_coefficients, dtype)
    log_term = ops.mul(ops.log(ops.mul(_c(0.5, dtype), x)), first_kind(x, dtype))
    if order == 0:
        near = ops.sub(series, log_term)
    else:
        near = ops.add(log_term, ops.truediv(series, x))
    far = chbevl(ops.sub(ops.truediv(_c(8.0, dtype), x), two), b_coefficients, dtype)
    if scaled:
        near = ops.mul(near, ops.exp(x))
    else:
        far = ops.mul(ops.exp(ops.neg(x)), far)
    far = ops.truediv(far, ops.sqrt(x))
    value = ops.where(ops.le(x, two), near, far)
    value = ops.where(ops.lt(x, _c(0.0, dtype)), _c(math.nan, dtype), value)
    return ops.where(ops.eq(x, _c(0.0, dtype)), _c(math.inf, dtype), value)


def modified_bessel_k0(x, dtype):
    return _modified_second_kind(x, dtype, 0, scaled=False)


def modified_bessel_k1(x, dtype):
    return _modified_second_kind(x, dtype, 1, scaled=False)


def scaled_modified_bessel_k0(x, dtype):
    return _modified_second_kind(x, dtype, 0, scaled=True)


def scaled_modified_bessel_k1(x, dtype):
    return _modified_second_kind(x, dtype, 1, scaled=True)
