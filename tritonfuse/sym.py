"""Sympy helpers for index arithmetic.

All indices are non-negative integers, so floor division and modulo need no sign care.
``FloorDiv(a, b)`` is ``a // b``; ``ModularIndexing(a, b, c)`` is ``(a // b) % c``. They
simplify the common cases eagerly so that generated index expressions stay short.
"""
import functools
import operator

import sympy


def sint(value) -> sympy.Expr:
    return sympy.Integer(value) if isinstance(value, int) else sympy.sympify(value)


def product(items) -> sympy.Expr:
    return functools.reduce(operator.mul, items, sympy.Integer(1))


class FloorDiv(sympy.Function):
    nargs = (2,)
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        if divisor.is_Integer and base.is_Add:
            # (a*k + b) // k == a + b // k when every term but b is a multiple of k
            multiples, rest = [], []
            for term in base.args:
                coeff = term.as_coeff_Mul()[0]
                if coeff.is_Integer and int(coeff) % int(divisor) == 0:
                    multiples.append(term / divisor)
                else:
                    rest.append(term)
            if multiples:
                return sympy.Add(*multiples) + FloorDiv(sympy.Add(*rest), divisor)
        if divisor.is_Integer and base.is_Mul:
            coeff, rest = base.as_coeff_Mul()
            if coeff.is_Integer and int(coeff) % int(divisor) == 0:
                return (coeff / divisor) * rest
        return None


class ModularIndexing(sympy.Function):
    nargs = (3,)
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor, modulus):
        if modulus == 1 or base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer and modulus.is_Integer:
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        if divisor.is_Integer and modulus.is_Integer and base.is_Add and divisor == 1:
            # drop terms that are multiples of the modulus
            kept = []
            for term in base.args:
                coeff = term.as_coeff_Mul()[0]
                if not (coeff.is_Integer and int(coeff) % int(modulus) == 0):
                    kept.append(term)
            if len(kept) != len(base.args):
                return ModularIndexing(sympy.Add(*kept), divisor, modulus)
        return None


def index_vars(prefix: str, count: int):
    return [sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True) for i in range(count)]


def contiguous_strides(sizes):
    strides = []
    acc = sympy.Integer(1)
    for size in reversed(sizes):
        strides.append(acc)
        acc = acc * size
    return list(reversed(strides))


def to_int(expr) -> int:
    return int(sympy.sympify(expr))


def unflatten(flat: sympy.Expr, sizes):
    """Split a flat row-major index into one index per dimension of ``sizes``."""
    result = []
    divisor = sympy.Integer(1)
    for size in reversed(sizes):
        if size == 1:
            result.append(sympy.Integer(0))
        else:
            result.append(ModularIndexing(flat, divisor, size))
        divisor = divisor * size
    result.reverse()
    if sizes and sizes[0] != 1:
        # the outermost index needs no modulo
        inner = product(sizes[1:])
        result[0] = FloorDiv(flat, inner)
    return result


def simplify_index(expr):
    """Fold the pieces that unflattening a flat index leaves behind back together:

        k*m*FloorDiv(u, d*m) + k*ModularIndexing(u, d, m)      -> k*FloorDiv(u, d)
        k*m*ModularIndexing(u, d*m, n) + k*ModularIndexing(u, d, m) -> k*ModularIndexing(u, d, m*n)

    so that a reshape read back through its own layout is the plain flat index again."""
    expr = sympy.expand(sympy.sympify(expr))
    changed = True
    while changed and expr.is_Add:
        changed = False
        terms = [t.as_coeff_Mul() for t in expr.args]
        for i, (k, mod) in enumerate(terms):
            if not isinstance(mod, ModularIndexing):
                continue
            u, d, m = mod.args
            for j, (c, other) in enumerate(terms):
                if j == i or c != k * m:
                    continue
                if isinstance(other, FloorDiv) and other.args == (u, d * m):
                    merged = k * FloorDiv(u, d)
                elif isinstance(other, ModularIndexing) and other.args[:2] == (u, d * m):
                    merged = k * ModularIndexing(u, d, m * other.args[2])
                else:
                    continue
                rest = [c2 * t2 for n, (c2, t2) in enumerate(terms) if n not in (i, j)]
                expr = sympy.expand(sympy.Add(merged, *rest))
                changed = True
                break
            if changed:
                break
    return expr
