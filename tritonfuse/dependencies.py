"""Read and write sets of a computed buffer, and the simplified loop nest it runs in.

The body runs under a recording ``ops`` handler with symbolic loop variables ``x0, x1..``
(kept dims) and ``r0, ..`` (reduced dims). Adjacent dimensions that every access walks
as one (stride of the outer == size * stride of the inner) are merged, so a contiguous
4-d pointwise op becomes one flat loop and two nodes that iterate the same memory in
differently shaped loops still see equal indices.
"""
import functools
from dataclasses import dataclass
from typing import Dict, List, Tuple

import sympy

from . import sym
from .range_simplify import simplify_with_ranges
from .virtualized import set_ops_handler


@dataclass(frozen=True)
class MemoryDep:
    """One access: buffer ``name`` at ``index``, a sympy expression over the canonical
    loop variables of a loop nest with sizes ``x_sizes`` x ``r_sizes``."""
    name: str
    index: sympy.Expr
    x_sizes: Tuple[sympy.Expr, ...]
    r_sizes: Tuple[sympy.Expr, ...]
    indirect: bool = False


@dataclass
class LoopPlan:
    """The merged loop nest of one node. ``remap(expr)`` rewrites an index over the raw
    variables into the canonical variables x0.. (over x_sizes) and r0.. (over r_sizes),
    folding the divisions and modulos that the loop ranges make redundant (symbolic
    sizes leave them; see range_simplify.py)."""
    x_sizes: List[sympy.Expr]
    r_sizes: List[sympy.Expr]
    raw_x: List[sympy.Symbol]
    raw_r: List[sympy.Symbol]
    substitution: Dict[sympy.Symbol, sympy.Expr]
    raw_ranges: Dict[sympy.Symbol, sympy.Expr]   # raw variable -> its loop size

    def remap(self, expr):
        expr = simplify_with_ranges(sympy.sympify(expr), self.raw_ranges)
        expr = sympy.expand(expr.xreplace(self.substitution))
        return simplify_with_ranges(expr, self.ranges()) if expr.has(sym.FloorDiv, sym.ModularIndexing) else expr

    def ranges(self) -> Dict[sympy.Symbol, sympy.Expr]:
        """Canonical variable -> its loop size."""
        return {**dict(zip(sym.index_vars("x", len(self.x_sizes)), self.x_sizes)),
                **dict(zip(sym.index_vars("r", len(self.r_sizes)), self.r_sizes))}


class _Recorder:
    def __init__(self):
        self.loads = []
        self.stores = []
        self._indirect = 0

    def load(self, name, index):
        self.loads.append((name, index))
        return "value"

    def store(self, name, index, value):
        self.stores.append((name, index))

    def store_reduction(self, name, index, value):
        self.stores.append((name, index))

    def store_scatter(self, name, index, value, mode):
        self.stores.append((name, index))

    def index_expr(self, index, dtype):
        self.loads.append((None, index))
        return "value"

    def indirect_indexing(self, value, size):
        self._indirect += 1
        return sympy.Symbol(f"indirect{self._indirect}", integer=True)

    def masked(self, mask, body, other):
        return body()

    def __getattr__(self, name):
        return lambda *args, **kwargs: "value"


def split_sizes(sizes, x_numel):
    """Split a pointwise iteration space ``sizes`` into (x sizes, r sizes) whose x part
    multiplies to ``x_numel``; None when no split point exists."""
    acc = sympy.Integer(1)
    for j in range(len(sizes) + 1):
        if sym.same_size(acc, x_numel):
            return list(sizes[:j]), list(sizes[j:])
        if j < len(sizes):
            acc = acc * sizes[j]
    return None


def _mergeable(exprs, outer, inner, inner_size):
    for expr in exprs:
        if not (expr.has(outer) or expr.has(inner)):
            continue
        a, b = sympy.diff(expr, outer), sympy.diff(expr, inner)
        if a.has(outer) or a.has(inner) or b.has(outer) or b.has(inner):
            return False
        if sympy.expand(a - b * inner_size) != 0:
            return False
    return True


def _merge_dims(exprs, variables, sizes):
    """Greedy right-to-left merge. Returns (sizes, surviving vars, substitution)."""
    variables, sizes = list(variables), [sym.sint(s) for s in sizes]
    substitution = {}
    for i, (v, s) in enumerate(zip(list(variables), list(sizes))):
        if s == 1:
            substitution[v] = sympy.Integer(0)
    keep = [i for i, s in enumerate(sizes) if s != 1]
    variables = [variables[i] for i in keep]
    sizes = [sizes[i] for i in keep]
    exprs = [e.xreplace(substitution) for e in exprs]
    i = len(variables) - 2
    while i >= 0:
        outer, inner = variables[i], variables[i + 1]
        if _mergeable(exprs, outer, inner, sizes[i + 1]):
            substitution[outer] = sympy.Integer(0)
            exprs = [sympy.expand(e.xreplace({outer: sympy.Integer(0)})) for e in exprs]
            sizes[i + 1] = sizes[i] * sizes[i + 1]
            del variables[i], sizes[i]
        i -= 1
    return sizes, variables, substitution


def _order_by_output(exprs, store_index, sizes, variables, substitution):
    """Loop over the kept dims in the order of the output's memory (largest stride
    outermost), so stores are contiguous whatever layout eager gave the output; then
    merge again (a transposed copy becomes one flat loop)."""
    store_index = sympy.expand(sympy.sympify(store_index).xreplace(substitution))
    strides = []
    for v in variables:
        derivative = sympy.diff(store_index, v)
        if derivative.free_symbols - sym.size_symbols(derivative):
            return sizes, variables, substitution
        strides.append(sym.hint(derivative))
    order = sorted(range(len(variables)), key=lambda i: -strides[i])
    if order == list(range(len(variables))):
        return sizes, variables, substitution
    exprs = [sympy.expand(e.xreplace(substitution)) for e in exprs]
    sizes, variables, more = _merge_dims(exprs, [variables[i] for i in order], [sizes[i] for i in order])
    return sizes, variables, {**substitution, **more}


def plan_and_deps(buffer, x_sizes, r_sizes):
    """(LoopPlan, reads, write) of ``buffer`` iterated as ``x_sizes`` x ``r_sizes``.

    For a pointwise buffer fused into a reduction kernel the caller passes its iteration
    sizes split in two, so that its variables line up with the kernel's. The analysis
    runs once per buffer and split (fusion asks again for every candidate pair)."""
    cache = buffer.__dict__.setdefault("_plan_cache", {})
    key = (tuple(x_sizes), tuple(r_sizes))
    if key not in cache:
        cache[key] = _analyze(buffer, x_sizes, r_sizes)
    return cache[key]


def _analyze(buffer, x_sizes, r_sizes):
    raw_x = sym.index_vars("x", len(x_sizes))
    raw_r = sym.index_vars("r", len(r_sizes))
    recorder = _Recorder()
    with set_ops_handler(recorder):
        buffer.run_body(raw_x, raw_r)
    raw_ranges = {**dict(zip(raw_x, map(sym.sint, x_sizes))), **dict(zip(raw_r, map(sym.sint, r_sizes)))}
    exprs = [sympy.expand(simplify_with_ranges(index, raw_ranges)) for _, index in recorder.loads + recorder.stores]
    new_x, x_vars, x_subs = _merge_dims(exprs, raw_x, x_sizes)
    store_index = exprs[len(recorder.loads)]
    if not _is_indirect(store_index):   # a scatter keeps its source's order
        new_x, x_vars, x_subs = _order_by_output(exprs, store_index, new_x, x_vars, x_subs)
    new_r, r_vars, r_subs = _merge_dims(exprs, raw_r, r_sizes)
    canonical_x = sym.index_vars("x", len(x_vars))
    canonical_r = sym.index_vars("r", len(r_vars))
    substitution = {**x_subs, **r_subs}
    rename = dict(zip(x_vars + r_vars, canonical_x + canonical_r))
    # compose: raw -> (0 | surviving raw) -> canonical
    full = {v: sympy.sympify(substitution.get(v, v)).xreplace(rename) for v in raw_x + raw_r}
    plan = LoopPlan(new_x, new_r, raw_x, raw_r, full, raw_ranges)
    xs, rs = tuple(new_x), tuple(new_r)
    reads = []
    for name, index in recorder.loads:
        if name is None:
            continue
        reads.append(MemoryDep(name, plan.remap(index), xs, rs, _is_indirect(index)))
    (store_name, store_index), = recorder.stores
    write = MemoryDep(store_name, plan.remap(store_index), xs, rs, _is_indirect(store_index))
    return plan, reads, write


def _is_indirect(index) -> bool:
    return any(s.name.startswith("indirect") for s in sympy.sympify(index).free_symbols)


@functools.lru_cache(maxsize=4096)   # fusion asks again for every candidate pair
def flat_x_form(dep: MemoryDep):
    """``dep`` over the fewest x dims its own index allows (merged right to left), or None
    when the index involves reduction variables. Two accesses whose x loops differ only
    in how the same row-major positions are split into dims (one node merged (8, 1024)
    into (8192,), another could not) have equal flat forms when they touch the same
    element at every position."""
    if any(s.name.startswith("r") for s in dep.index.free_symbols):
        return None
    variables = sym.index_vars("x", len(dep.x_sizes))
    sizes, kept, substitution = _merge_dims([dep.index], variables, dep.x_sizes)
    canonical = dict(zip(kept, sym.index_vars("x", len(kept))))
    index = sympy.expand(dep.index.xreplace(substitution)).xreplace(canonical)
    return tuple(sympy.expand(s) for s in sizes), index


def coarsening_groups(fine, coarse):
    """The runs of consecutive dims of ``fine`` whose products are the dims of ``coarse``
    (both row-major over the same positions: ``(8192,)`` coarsens ``(8, 1024)``), or None
    when ``coarse`` is no such coarsening."""
    fine = [sym.sint(s) for s in fine]
    groups, k = [], 0
    for size in (sym.sint(s) for s in coarse):
        start, product = k, sympy.Integer(1)
        while k < len(fine) and sym.hint(product) < sym.hint(size):
            product = product * fine[k]
            k += 1
        if not sym.same_size(product, size) or k == start:
            return None
        groups.append(range(start, k))
    return groups if k == len(fine) else None


def _refining_substitution(coarse_sizes, fine_sizes):
    """{coarse canonical x var: the same row-major position in the fine x vars}."""
    coarse_vars, fine_vars = sym.index_vars("x", len(coarse_sizes)), sym.index_vars("x", len(fine_sizes))
    mapping = {}
    for var, group in zip(coarse_vars, coarsening_groups(fine_sizes, coarse_sizes)):
        strides = sym.contiguous_strides([sym.sint(fine_sizes[k]) for k in group])
        mapping[var] = sum((fine_vars[k] * stride for k, stride in zip(group, strides)), sympy.Integer(0))
    return mapping


def refine_plan(plan: LoopPlan, fine_x_sizes) -> LoopPlan:
    """``plan`` walking the finer row dims ``fine_x_sizes`` (a refinement of its own): the
    same positions in the same order, so a node whose rows merged further can share a
    loop nest with nodes whose rows could not."""
    if list(plan.x_sizes) == list(fine_x_sizes):
        return plan
    mapping = _refining_substitution(plan.x_sizes, fine_x_sizes)
    substitution = {raw: sympy.expand(sympy.sympify(expr).xreplace(mapping))
                    for raw, expr in plan.substitution.items()}
    return LoopPlan(list(fine_x_sizes), plan.r_sizes, plan.raw_x, plan.raw_r, substitution, plan.raw_ranges)


def refine_dep(dep: MemoryDep, fine_x_sizes) -> MemoryDep:
    """``dep`` over the finer row dims ``fine_x_sizes`` (see ``refine_plan``)."""
    if list(dep.x_sizes) == list(fine_x_sizes):
        return dep
    mapping = _refining_substitution(dep.x_sizes, fine_x_sizes)
    return MemoryDep(dep.name, sympy.expand(dep.index.xreplace(mapping)), tuple(fine_x_sizes), dep.r_sizes,
                     dep.indirect)


def extract_deps(buffer, x_sizes, r_sizes):
    _, reads, write = plan_and_deps(buffer, x_sizes, r_sizes)
    return reads, write
