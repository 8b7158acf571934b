"""Sympy helpers for sizes and index arithmetic.

All indices are non-negative integers, so floor division and modulo need no sign care.
``FloorDiv(a, b)`` is ``a // b``; ``ModularIndexing(a, b, c)`` is ``(a // b) % c``. They
simplify the common cases eagerly so that generated index expressions stay short.

Sizes may be symbolic: when Dynamo hands over a graph with dynamic shapes, a size is a
sympy expression over Dynamo's size symbols (``s0``, ``s1``, ...), and generated code
takes those symbols as runtime values. ``SizeVars`` holds, for one compile, the example
value of every symbol (its *hint*) and the shape environment that records guards:
decisions that only affect speed read hints; decisions that affect the answer either
stay symbolic or add a guard. ``to_int`` refuses symbolic sizes, so that no code bakes
a runtime size in by accident.
"""
import contextlib
import re
import contextvars
import functools
import operator

import sympy


def sint(value) -> sympy.Expr:
    """A size or index as a sympy expression: ints, sympy expressions and torch SymInts."""
    if isinstance(value, bool):
        return sympy.Integer(int(value))
    if isinstance(value, int):
        return sympy.Integer(value)
    node = getattr(value, "node", None)       # torch.SymInt / SymFloat / SymBool
    if node is not None and hasattr(node, "expr"):
        current = _current_sizevars.get()
        expr = from_torch_sympy(node.expr)
        return expr if current is None else current.simplify(expr)
    return sympy.sympify(value)


def _torch_sympy_rewrites():
    """Dynamo's sympy functions -> ours (which every printer of ours knows), by class."""
    try:
        from torch.utils._sympy import functions as fn
    except ImportError:  # pragma: no cover - a torch without symbolic shapes
        return {}
    rewrites = {
        "FloorDiv": lambda a, b: FloorDiv(a, b),
        "CleanDiv": lambda a, b: FloorDiv(a, b),
        "CeilDiv": lambda a, b: _ceil_div(a, b),
        "ModularIndexing": lambda a, b, c: ModularIndexing(a, b, c),
        "PythonMod": lambda a, b: ModularIndexing(a, sympy.Integer(1), b),
        "Mod": lambda a, b: ModularIndexing(a, sympy.Integer(1), b),
        "Max": lambda *args: sympy.Max(*args),
        "Min": lambda *args: sympy.Min(*args),
        "PowByNatural": lambda a, b: sympy.Pow(a, b),
        "IntTrueDiv": lambda a, b: a / b,
        "FloatTrueDiv": lambda a, b: a / b,
        "ToFloat": lambda a: a,
        "Identity": lambda a: a,
        # math.floor / math.ceil / int() of a size ratio (``math.ceil(n / 3)`` in a model)
        "FloorToInt": lambda a: _integer_quotient(a, round_up=False),
        "CeilToInt": lambda a: _integer_quotient(a, round_up=True),
        "TruncToInt": lambda a: _integer_quotient(a, round_up=False),
    }
    return {getattr(fn, name): rewrite for name, rewrite in rewrites.items() if hasattr(fn, name)}


def _integer_quotient(value, round_up: bool):
    """``value`` (a ratio p / q of non-negative integer expressions, q positive) rounded
    down or up, as ``FloorDiv``; None (keep Dynamo's function, which no printer of ours
    prints: the graph then compiles per shape) for anything else."""
    numerator, denominator = sympy.fraction(sympy.together(value))
    if not (numerator.is_integer and numerator.is_nonnegative and denominator.is_integer
            and denominator.is_positive):
        return None
    return _ceil_div(numerator, denominator) if round_up else FloorDiv(numerator, denominator)


def _ceil_div(a, b):
    return FloorDiv(a + b - 1, b)


_TORCH_REWRITES = None


def to_torch_sympy(expr):
    """``expr`` with our sympy functions replaced by Dynamo's (for its ShapeEnv)."""
    try:
        from torch.utils._sympy import functions as fn
    except ImportError:  # pragma: no cover
        return expr
    expr = sympy.sympify(expr)
    if expr.is_Atom:
        return expr
    args = [to_torch_sympy(a) for a in expr.args]
    if isinstance(expr, FloorDiv):
        return fn.FloorDiv(*args)
    if isinstance(expr, ModularIndexing):
        return fn.ModularIndexing(*args)
    if isinstance(expr, sympy.Max):
        return fn.Max(*args)
    if isinstance(expr, sympy.Min):
        return fn.Min(*args)
    return expr.func(*args) if args != list(expr.args) else expr


def from_torch_sympy(expr):
    """``expr`` with Dynamo's own sympy functions (torch.utils._sympy) replaced by ours."""
    global _TORCH_REWRITES
    expr = sympy.sympify(expr)
    if expr.is_Atom:
        return expr
    if _TORCH_REWRITES is None:
        _TORCH_REWRITES = _torch_sympy_rewrites()
    args = [from_torch_sympy(a) for a in expr.args]
    rewrite = _TORCH_REWRITES.get(type(expr))
    rewritten = rewrite(*args) if rewrite is not None else None
    if rewritten is not None:
        return rewritten
    return expr.func(*args) if args != list(expr.args) else expr


def sizes_of(values) -> list:
    return [sint(v) for v in values]


def same_size(a, b) -> bool:
    """Whether two sizes are equal for every value of their symbols."""
    if a is b or a == b:
        return True
    a, b = sympy.sympify(a), sympy.sympify(b)
    if a.is_number and b.is_number:
        return bool(a == b)
    return sympy.expand(a - b) == 0


def same_sizes(a, b) -> bool:
    return len(a) == len(b) and all(same_size(x, y) for x, y in zip(a, b))


def is_static(expr) -> bool:
    return not sympy.sympify(expr).free_symbols


class SizeVars:
    """The size symbols of one compile: their example values and the shape environment.

    ``shape_env`` is Dynamo's ShapeEnv (None for a graph with static shapes). With
    ``specialize=True`` every symbol is replaced by its hint as it is read: the graph is
    compiled for the hints' concrete shapes (the per-shape fallback)."""

    def __init__(self, shape_env=None, specialize=False, hints=None):
        self.shape_env = shape_env
        self.specialize = specialize
        self.hints = {}
        if shape_env is not None:
            backed = getattr(shape_env, "backed_var_to_val", None)
            self.hints.update(backed if backed is not None else shape_env.var_to_val)
        self.hints.update(hints or {})
        self.replacements = dict(getattr(shape_env, "replacements", {}) or {})
        # guards can be added while Dynamo still builds its guard function: for graphs it
        # compiles before it returns (forward, inference), not for a lazily compiled backward
        self.allow_guards = False
        # conditions on symbolic sizes the generated code relies on (recorded as guards):
        # a cached compile is reused only where they hold
        self.assumptions = []

    def simplify(self, expr):
        expr = sympy.sympify(expr)
        if self.replacements and expr.free_symbols & set(self.replacements):
            expr = expr.xreplace(self.replacements)
        if self.specialize:
            expr = expr.xreplace({s: sympy.Integer(int(v)) for s, v in self.hints.items() if s in expr.free_symbols})
        return expr

    def hint(self, expr) -> int:
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        value = self.simplify(expr).xreplace({s: sympy.Integer(int(v)) for s, v in self.hints.items()})
        if isinstance(value, sympy.Basic) and not value.is_number:
            raise ValueError(f"no example value for the size {expr}")
        return int(value)

    def known_lt(self, a, b) -> bool:
        """Whether a < b holds for every size this compile serves: static sizes are
        compared; symbolic ones by what the shape environment can prove, or else by a
        guard recorded for the sizes' example values (Dynamo recompiles when it fails)."""
        condition = sympy.Lt(sympy.sympify(a), sympy.sympify(b))
        if condition in (sympy.true, sympy.false):
            return bool(condition)
        if self.shape_env is None or self.specialize:
            return self.hint(a) < self.hint(b)
        condition = to_torch_sympy(condition)
        try:
            static = self.shape_env._maybe_evaluate_static(condition)
        except Exception:  # noqa: BLE001 - an expression its range analysis does not know
            static = None
        if static is not None:
            return bool(static)
        if self.allow_guards and self.hint(a) < self.hint(b):
            try:
                holds = bool(self.shape_env.evaluate_expr(condition))
            except Exception:  # noqa: BLE001 - no guard could be recorded: assume nothing
                return False
            if holds:
                self.assumptions.append(sympy.Lt(sympy.sympify(a), sympy.sympify(b)))
            return holds
        return False

    def holds(self, conditions) -> bool:
        """Whether the conditions (as saved by a compile: text over size symbols) hold
        here, recording them as guards as the compile that saved them did."""
        if not conditions:
            return True
        by_name = {str(s): s for s in self.hints}
        for text in conditions:
            condition = sympy.sympify(text, locals={"FloorDiv": FloorDiv, "ModularIndexing": ModularIndexing})
            condition = condition.xreplace({s: by_name[s.name] for s in condition.free_symbols if s.name in by_name})
            if not isinstance(condition, sympy.core.relational.Relational) or \
                    not self.known_lt(condition.lhs, condition.rhs):
                return False
        return True

    def guard_lt(self, a, b) -> bool:
        """Whether a < b, for the example sizes; recorded as a guard when symbolic."""
        condition = sympy.Lt(sympy.sympify(a), sympy.sympify(b))
        if condition in (sympy.true, sympy.false):
            return bool(condition)
        if self.shape_env is not None and not self.specialize and self.allow_guards:
            try:
                return bool(self.shape_env.evaluate_expr(to_torch_sympy(condition)))
            except Exception:  # noqa: BLE001 - no guard can be added here: use the hint
                pass
        return self.hint(a) < self.hint(b)


_current_sizevars = contextvars.ContextVar("tritonfuse_sizevars", default=None)


@contextlib.contextmanager
def using_sizevars(sizevars: SizeVars):
    token = _current_sizevars.set(sizevars)
    try:
        yield sizevars
    finally:
        _current_sizevars.reset(token)


def current_sizevars() -> SizeVars:
    found = _current_sizevars.get()
    return found if found is not None else _STATIC


_STATIC = SizeVars()


def hint(expr) -> int:
    """The example value of a size (its value, when static): for decisions of speed only."""
    return current_sizevars().hint(expr)


def size_symbols(expr) -> set:
    """The size symbols (not loop variables) of an expression."""
    return {s for s in sympy.sympify(expr).free_symbols if is_size_symbol(s)}


def is_size_symbol(symbol) -> bool:
    """Dynamo's symbols: sizes s0, s77, unbacked ints u0, floats zf0 / zuf0; and the values of
    0-d CPU inputs that a graph on a GPU reads on the host, zh0 / uh0. Loop variables
    are x*, r*, y*, and code generators name their own values otherwise."""
    return _SIZE_SYMBOL.fullmatch(symbol.name) is not None


_SIZE_SYMBOL = re.compile(r"(s|u|uh|zf|zuf|zh)\d+")


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


def exact_div(a, b) -> sympy.Expr:
    """a / b for sizes known to divide (a view's -1 dim): a polynomial when the division
    cancels, else ``FloorDiv`` (never a rational, which generated code would print as /)."""
    quotient = sympy.cancel(sympy.sympify(a) / sympy.sympify(b))
    numerator, denominator = sympy.fraction(sympy.together(quotient))
    # integer coefficients on every term (terms may hold FloorDiv of a size: a pool's output
    # length, which sympy.Poly cannot take as a polynomial in that size)
    if denominator == 1 and all(c.is_Integer for c in sympy.expand(numerator).as_coefficients_dict().values()):
        return sympy.expand(numerator)
    return FloorDiv(sympy.expand(numerator), sympy.expand(denominator))


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
    """A static size as an int; a symbolic one raises (use ``hint`` for decisions)."""
    value = sympy.sympify(expr)
    if not value.is_number:
        raise TypeError(f"size {value} is symbolic")
    return int(value)


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


def _split_term(term):
    """(coefficient, the FloorDiv/ModularIndexing factor or None) of one product term."""
    factors = sympy.Mul.make_args(term)
    functions = [f for f in factors if isinstance(f, (FloorDiv, ModularIndexing))]
    if len(functions) != 1:
        return term, None
    return sympy.Mul(*[f for f in factors if f is not functions[0]]), functions[0]


def simplify_index(expr):
    """Fold the pieces that unflattening a flat index leaves behind back together:

        k*m*FloorDiv(u, d*m) + k*ModularIndexing(u, d, m) -> k*FloorDiv(u, d)
        k*m*ModularIndexing(u, d*m, n) + k*ModularIndexing(u, d, m) -> k*ModularIndexing(u, d, m*n)

    so that a reshape read back through its own layout is the plain flat index again
    (k, m and d may be symbolic sizes)."""
    expr = sympy.expand(sympy.sympify(expr))
    changed = True
    while changed and expr.is_Add:
        changed = False
        terms = [_split_term(t) for t in expr.args]
        for i, (k, mod) in enumerate(terms):
            if not isinstance(mod, ModularIndexing):
                continue
            u, d, m = mod.args
            for j, (c, other) in enumerate(terms):
                if j == i or other is None or sympy.expand(c - k * m) != 0:
                    continue
                if isinstance(other, FloorDiv) and other.args[0] == u and same_size(other.args[1], d * m):
                    merged = k * FloorDiv(u, d)
                elif isinstance(other, ModularIndexing) and other.args[0] == u and same_size(other.args[1], d * m):
                    merged = k * ModularIndexing(u, d, m * other.args[2])
                else:
                    continue
                rest = [c2 * t2 if t2 is not None else c2 for n, (c2, t2) in enumerate(terms) if n not in (i, j)]
                expr = sympy.expand(sympy.Add(merged, *rest))
                changed = True
                break
            if changed:
                break
    return expr
