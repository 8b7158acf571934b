"""Index simplification that knows the ranges of the loop variables.

With static sizes, reshapes and views leave index pieces such as ``FloorDiv(16*x3 + x4,
16)`` that sympy folds at once (``x4 < 16`` is visible in the numbers). With symbolic
sizes the same pieces stay: ``ModularIndexing(x2, 1, s0)`` is ``x2`` only because the
loop runs ``x2`` over ``0 <= x2 < s0``, and ``FloorDiv(32*s0*x0 + 16*x3 + x4, 32*s0)`` is
``x0`` only because ``16*x3 + x4 < 32*s0``. Left in place they turn a contiguous load of
the inner loop into a gather (C++) and add a division per element (both backends).

Given each loop variable's size (``0 <= v < size``) and a lower bound for each size
symbol (Dynamo specializes 0 and 1, so a backed size is >= 2), this module rewrites, from
the innermost sub-expression out:

    FloorDiv(k*d + r, d)            -> k                 when 0 <= r < d
    FloorDiv(k*d + r, d)            -> k + FloorDiv(r, d) when 0 <= r
    ModularIndexing(a, b, m)        -> (a // b) with multiples of m dropped, when that
                                       rest is provably in [0, m)

``k`` is a sum of the terms that are integer multiples of ``d``. Bounds are symbolic
(polynomials in the size symbols); ``a <= b`` is proven by shifting every size symbol to
its lower bound (``s -> s + 2``) and checking that every coefficient of ``b - a`` is
non-negative, a sufficient test that needs no solver. Anything it cannot prove stays as
it was: the rewrite never changes what an index evaluates to inside its loop nest.
"""
import functools
import re

import sympy

from . import sym
from .sym import FloorDiv, ModularIndexing

# Dynamo's backed sizes s0, s1..: it specializes 0 and 1, so they are at least 2.
_BACKED_SIZE = re.compile(r"s\d+")
DEFAULT_SIZE_LOWER_BOUND = 2


def simplify_with_ranges(expr, ranges) -> sympy.Expr:
    """``expr`` with the FloorDiv / ModularIndexing that ``ranges`` ({loop variable:
    size}) make redundant folded away (see the module's text)."""
    expr = sympy.sympify(expr)
    if not expr.has(FloorDiv, ModularIndexing):
        return expr
    key = tuple(sorted(((v, sympy.sympify(s)) for v, s in ranges.items() if v in expr.free_symbols),
                       key=lambda item: item[0].name))
    symbols = set(sym.size_symbols(expr)).union(*(sym.size_symbols(size) for _, size in key))
    return _simplify_cached(expr, key, _size_lower_bounds_key(symbols))


def _size_lower_bounds_key(symbols):
    """(symbol, lower bound) of the size symbols: the shape environment's range where
    there is one, else 2 for a backed size."""
    bounds = []
    shape_env = sym.current_sizevars().shape_env
    ranges = getattr(shape_env, "var_to_range", None) or {}
    for s in sorted(symbols, key=lambda s: s.name):
        lower = None
        known = ranges.get(s)
        if known is not None:
            try:
                lower = int(known.lower)
            except (TypeError, ValueError, OverflowError):
                lower = None
        if lower is None and _BACKED_SIZE.fullmatch(s.name):
            lower = DEFAULT_SIZE_LOWER_BOUND
        if lower is not None:
            bounds.append((s, max(lower, 0)))
    return tuple(bounds)


@functools.lru_cache(maxsize=8192)
def _simplify_cached(expr, ranges_key, lower_bounds_key):
    return _Simplifier(dict(ranges_key), dict(lower_bounds_key)).visit(expr)


class _Simplifier:
    def __init__(self, ranges, size_lower_bounds):
        self.ranges = ranges
        self.size_lower_bounds = size_lower_bounds
        # sub-expression -> rewritten: an index through nested views (a Swin block's window
        # partition and roll) repeats the same pieces many times over
        self._visited = {}

    # ---- rewriting ----------------------------------------------------------------------
    def visit(self, expr):
        if expr.is_Atom:
            return expr
        done = self._visited.get(expr)
        if done is None:
            done = self._visited[expr] = self._rewrite(expr)
        return done

    def _rewrite(self, expr):
        if not expr.has(FloorDiv, ModularIndexing):
            return expr
        args = [self.visit(a) for a in expr.args]
        if isinstance(expr, FloorDiv):
            return self.floordiv(*args)
        if isinstance(expr, ModularIndexing):
            return self.modular(*args)
        return expr.func(*args) if args != list(expr.args) else expr

    def floordiv(self, base, divisor):
        """FloorDiv(base, divisor), with the multiples of the divisor taken out."""
        folded = self._split_quotient(base, divisor)
        if folded is None:
            return FloorDiv(base, divisor)
        quotient, rest = folded
        if rest == 0:
            return quotient
        bounds = self.bounds(rest)
        if bounds is None or not self.nonneg(bounds[0]):
            return FloorDiv(base, divisor)
        if self.nonneg(divisor - 1 - bounds[1]):
            return quotient
        coarse = self._coarse_quotient(rest, divisor)
        return quotient + (coarse if coarse is not None else FloorDiv(rest, divisor))

    def _coarse_quotient(self, rest, divisor):
        """FloorDiv(g*q + r, g*e) -> FloorDiv(q, e) when 0 <= r < g, for a common factor g of
        the divisor and some terms (``FloorDiv(16*s*x1 + 16*x2 + x3, 32*s)`` with
        ``16*x2 + x3 < 16*s`` is ``FloorDiv(x1, 2)``); None when no such g is found."""
        terms = sympy.Add.make_args(rest)
        for term in terms:
            try:
                common = sympy.gcd(term, divisor)
            except (sympy.PolynomialError, TypeError, ValueError):
                continue
            if common == 1 or not self._loop_free(common) or not self.nonneg(common - 1) or \
                    not self._is_multiple(divisor, common):
                continue
            high = [t for t in terms if self._is_multiple(t, common)]
            low = sympy.Add(*[t for t in terms if t not in high])
            bounds = self.bounds(low)
            if bounds is None or not self.nonneg(bounds[0]) or not self.nonneg(common - 1 - bounds[1]):
                continue
            return self.floordiv(sympy.expand(sympy.Add(*high) / common), sympy.cancel(divisor / common))
        return None

    def modular(self, base, divisor, modulus):
        """ModularIndexing(base, divisor, modulus) = FloorDiv(base, divisor) % modulus."""
        if not self._loop_free(modulus) or not self._loop_free(divisor):
            return ModularIndexing(base, divisor, modulus)
        original = ModularIndexing(base, divisor, modulus)
        quotient = self.floordiv(base, divisor)
        rest = sympy.Add(*[t for t in sympy.Add.make_args(sympy.expand(quotient))
                           if not self._is_multiple(t, modulus)])
        bounds = self.bounds(rest)
        if bounds is None or not self.nonneg(bounds[0]):
            return original
        if self.nonneg(modulus - 1 - bounds[1]):
            return rest
        if rest != FloorDiv(base, divisor):   # multiples of the modulus dropped, or a quotient folded
            return ModularIndexing(rest, sympy.Integer(1), modulus)
        return original

    def _split_quotient(self, base, divisor):
        """(the sum of base's terms divided by divisor, what is left) over the terms that are
        integer multiples of the divisor; None when the divisor varies with the loops."""
        if not self._loop_free(divisor) or divisor == 0:
            return None
        quotient, rest = [], []
        for term in sympy.Add.make_args(sympy.expand(base)):
            if self._is_multiple(term, divisor):
                quotient.append(sympy.expand(term / divisor))
            else:
                rest.append(term)
        return sympy.Add(*quotient), sympy.Add(*rest)

    @staticmethod
    def _is_multiple(term, divisor) -> bool:
        """Whether term / divisor is a polynomial with integer coefficients."""
        if term == 0:
            return True
        if not divisor.is_Add:
            # monomials: the quotient's factors are a number and powers (sympy combines them)
            for factor in sympy.Mul.make_args(term / divisor):
                if factor.is_number:
                    if not factor.is_Integer:
                        return False
                elif factor.is_Pow and not (factor.exp.is_Integer and int(factor.exp) > 0):
                    return False
            return True
        numerator, denominator = sympy.fraction(sympy.cancel(term / divisor))
        if denominator != 1 and not (denominator.is_Integer and int(denominator) in (1, -1)):
            return False
        return all(t.as_coeff_Mul()[0].is_Integer for t in sympy.Add.make_args(sympy.expand(numerator)))

    # ---- bounds -------------------------------------------------------------------------
    def _loop_free(self, expr) -> bool:
        """Built from size symbols and numbers only."""
        return all(s in self.size_lower_bounds for s in sympy.sympify(expr).free_symbols)

    def bounds(self, expr):
        """(lowest, highest) value of ``expr`` over the loop ranges, as expressions in the
        size symbols; None when some term is beyond this analysis."""
        low, high = sympy.Integer(0), sympy.Integer(0)
        for term in sympy.Add.make_args(sympy.expand(expr)):
            found = self._term_bounds(term)
            if found is None:
                return None
            low, high = low + found[0], high + found[1]
        return sympy.expand(low), sympy.expand(high)

    def _term_bounds(self, term):
        factors = sympy.Mul.make_args(term)
        varying = [f for f in factors if not self._loop_free(f)]
        if not varying:
            return term, term
        if len(varying) != 1:
            return None
        factor = varying[0]
        coefficient = sympy.Mul(*[f for f in factors if f is not factor])
        atom = self._atom_bounds(factor)
        if atom is None:
            return None
        low, high = coefficient * atom[0], coefficient * atom[1]
        if self.nonneg(coefficient):
            return low, high
        if self.nonneg(-coefficient):
            return high, low
        return None

    def _atom_bounds(self, factor):
        if factor in self.ranges:
            return sympy.Integer(0), sympy.sympify(self.ranges[factor]) - 1
        if isinstance(factor, ModularIndexing) and self._loop_free(factor.args[2]):
            return sympy.Integer(0), factor.args[2] - 1
        if isinstance(factor, FloorDiv) and self._loop_free(factor.args[1]) and self.nonneg(factor.args[1] - 1):
            inner = self.bounds(factor.args[0])
            if inner is not None and self.nonneg(inner[0]):
                # a // d <= a / d for a number d, <= a for any d >= 1 (keeps bounds polynomial)
                divisor, high = factor.args[1], inner[1]
                if high.is_number:
                    return sympy.Integer(0), sympy.floor(high / divisor)
                return sympy.Integer(0), high / divisor if divisor.is_Integer else high
        return None

    def nonneg(self, expr) -> bool:
        """Whether ``expr`` (over size symbols) is >= 0 for every size at or above its lower
        bound: after shifting each symbol to its bound every coefficient is >= 0."""
        expr = sympy.sympify(expr)
        if expr.is_number:
            return bool(expr >= 0)
        if not self._loop_free(expr):
            return False
        shifted = sympy.expand(expr.xreplace({s: s + self.size_lower_bounds[s] for s in expr.free_symbols}))
        for term in sympy.Add.make_args(shifted):
            coefficient, rest = term.as_coeff_Mul()
            if coefficient < 0 or not _nonneg_monomial(rest):
                return False
        return True


def _nonneg_monomial(expr) -> bool:
    """A product of non-negative factors (shifted size symbols, their powers, floors)."""
    for factor in sympy.Mul.make_args(expr):
        base, exponent = factor.as_base_exp()
        if factor.is_number:
            if factor < 0:
                return False
        elif base.is_Symbol or isinstance(base, (FloorDiv, ModularIndexing)):
            if not (exponent.is_Integer and int(exponent) > 0):
                return False
        else:
            return False
    return True
