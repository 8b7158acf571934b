"""Layout ops as index remappings: each output element reads its source element directly
(no extra pass over memory), so these fuse with their producers and consumers.

    flip, roll                   views: out[i] = x[size - 1 - i], x[(i - shift) mod size]
    tril, triu                   the input where inside the triangle, else 0
    reflection_pad{1,2,3}d       out[i] = x[reflect(i - left)] / x[clamp(i - left)]: the
    replication_pad{1,2,3}d      source index is computed in the kernel (an indirect read)
    their backwards              each input element gathers the few padded positions that
                                 read it, one padded dim at a time

repeat and tile stay decompositions (decompositions.py): the expand + copy + view they
become is already one kernel with the same modular indexing.
"""
import sympy
import torch

from .. import sym
from ..ir import GenericView, Pointwise, TensorBox, origins_of, realize
from ..virtualized import ops
from .registry import SUPPORTED_DTYPES, Unsupported, aten, register_lowering, static_sizes
from .tensor_ops import in_range, int_value
from .views import view

MAX_GATHERED = 27   # reads per element that a chain of pad backwards may inline


def _dims(dims, ndim):
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % ndim for d in dims}) if ndim else []


@register_lowering(aten.flip)
def flip(x, dims):
    size = list(x.get_size())
    flipped = _dims(dims, len(size))

    def reindex(index):
        return [size[d] - 1 - i if d in flipped else i for d, i in enumerate(index)]
    return TensorBox(GenericView(x.data, size, reindex))   # (no strided form: strides would be negative)


@register_lowering(aten.roll)
def roll(x, shifts, dims=()):
    size = list(x.get_size())
    shifts = static_sizes([shifts] if isinstance(shifts, int) else shifts, "roll by a shift")
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:   # roll of the flattened tensor
        flat = roll(view(x, [sym.product(size)]), shifts, [0])
        return view(flat, size)
    totals = {}
    for shift, dim in zip(shifts, dims):
        d = dim % len(size)
        totals[d] = totals.get(d, 0) + shift
    # out[i] = x[(i - shift) mod n]: a non-negative left operand of the modulo, for any n
    starts = {d: _roll_start(shift, size[d]) for d, shift in totals.items()}
    starts = {d: start for d, start in starts.items() if start != 0}

    def reindex(index):
        return [sym.ModularIndexing(i + starts[d], sympy.Integer(1), size[d]) if d in starts else i
                for d, i in enumerate(index)]
    return TensorBox(GenericView(x.data, size, reindex)) if starts else x


def _roll_start(shift, n):
    """A non-negative k with (i - shift) mod n == (i + k) mod n; in [0, n) when n is static."""
    if sym.is_static(n):
        return sympy.Integer((-shift) % int(n)) if int(n) else sympy.Integer(0)
    if shift <= 0:
        return sympy.Integer(-shift)
    return n - sym.ModularIndexing(sympy.Integer(shift), sympy.Integer(1), n)


def _triangle(x, diagonal, keep_lower, origin):
    size = list(x.get_size())
    if len(size) < 2:
        raise Unsupported(f"{origin} of a tensor with fewer than 2 dims")
    loader = x.make_loader()
    dtype = x.get_dtype()

    def inner_fn(index):
        offset = ops.index_expr(index[-1] - index[-2], torch.int64)   # column - row
        bound = ops.constant(diagonal, torch.int64)
        inside = ops.le(offset, bound) if keep_lower else ops.ge(offset, bound)
        return ops.where(inside, loader(index), ops.constant(0, dtype))
    return _pointwise(x, dtype, size, inner_fn, origin)


@register_lowering(aten.tril)
def tril(x, diagonal=0):
    return _triangle(x, diagonal, True, "tril")


@register_lowering(aten.triu)
def triu(x, diagonal=0):
    return _triangle(x, diagonal, False, "triu")


def _pointwise(x, dtype, size, inner_fn, origin):
    origins = tuple(dict.fromkeys(origins_of([x]) + (origin,)))
    return TensorBox.create(Pointwise(x.get_device(), dtype, inner_fn, list(size), origins=origins))


# ---- reflection and replication padding ------------------------------------------------

def _reflect(position, size):
    """Mirror a (possibly out-of-range) position into [0, size): size-1 - |size-1 - |p||."""
    last = int_value(size - 1)
    return ops.sub(last, ops.abs(ops.sub(last, ops.abs(position))))


def _replicate(position, size):
    return ops.minimum(ops.maximum(position, ops.constant(0, torch.int64)), int_value(size - 1))


def _pad_dims(x, padding):
    """[(dim, left, right)] of a pad spec that lists the last dim first."""
    padding = static_sizes(padding, "padding")
    ndim = len(x.get_size())
    return [(ndim - 1 - k, padding[2 * k], padding[2 * k + 1]) for k in range(len(padding) // 2)]


def _pad(x, padding, source, origin):
    if x.get_dtype() not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {x.get_dtype()}")
    size = list(x.get_size())
    padded = _pad_dims(x, padding)
    if any(size[d] == 0 for d, _, _ in padded):
        raise Unsupported(f"{origin} of an empty dim")
    out_size = list(size)
    for d, left, right in padded:
        out_size[d] = size[d] + left + right
    loader = x.make_loader()

    def inner_fn(index):
        src = list(index)
        for d, left, _ in padded:
            position = source(ops.index_expr(index[d] - left, torch.int64), size[d])
            src[d] = ops.indirect_indexing(position, size[d])
        return loader(src)
    return _pointwise(x, x.get_dtype(), out_size, inner_fn, origin)


def _register_pad(op, source, origin):
    @register_lowering(op)
    def lowering(x, padding):
        return _pad(x, padding, source, origin)
    return lowering


for _n in (1, 2, 3):
    _register_pad(getattr(aten, f"reflection_pad{_n}d"), _reflect, "reflection_pad")
    _register_pad(getattr(aten, f"replication_pad{_n}d"), _replicate, "replication_pad")


def _reflection_sources(j, n, left, right):
    """The padded positions that read input position j of one dim (n may be symbolic):
    (position, the range [low, high] of j that it holds for, or None: every j). The copy
    itself, its mirror in the left pad, its mirror in the right."""
    return [(j + left, None), (left - j, (1, left)), (left + 2 * (n - 1) - j, (n - 1 - right, n - 2))]


def _replication_sources(j, n, left, right):
    """Position 0 is read by the left pad and itself, n - 1 by itself and the right pad."""
    sources = [(j + left, None)]
    sources += [(sympy.Integer(k), (0, 0)) for k in range(left)]
    sources += [(sympy.sympify(left + n + k), (n - 1, n - 1)) for k in range(right)]
    return sources


def _pad_backward(grad, x, padding, sources, origin):
    dtype = x.get_dtype()
    if dtype not in SUPPORTED_DTYPES or not dtype.is_floating_point:
        raise Unsupported(f"{origin} of {dtype}")
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    size = list(x.get_size())
    result, inlined = grad, 1
    for d, left, right in _pad_dims(x, padding):
        per_element = len([c for _, c in sources(sympy.Integer(0), size[d], left, right) if not _never(c)])
        if inlined * per_element > MAX_GATHERED:
            if per_element > MAX_GATHERED:
                raise Unsupported(f"{origin} reads {per_element} positions per element")
            realize(result)
            inlined = 1
        inlined *= per_element
        result = _gather_dim(result, d, size[d], left, right, sources, acc, origin)
    if dtype == acc:
        return result
    return _pointwise(result, dtype, size, lambda index, load=result.make_loader(): ops.to_dtype(load(index), dtype),
                      origin)


def _never(condition):
    """Whether a source's range of positions is empty for every size (an unknown one: kept)."""
    return condition is not None and bool((sympy.sympify(condition[0]) - condition[1]).is_positive)


def _gather_dim(grad, d, n, left, right, sources, acc, origin):
    """Sum, for each position j of dim d, the positions of the padded dim that read j."""
    loader = grad.make_loader()
    source_dtype = grad.get_dtype()
    out_size = list(grad.get_size())
    out_size[d] = n

    def inner_fn(index):
        total = None
        for position, condition in sources(index[d], n, left, right):
            if _never(condition):
                continue   # no position of this dim is read from there
            src = list(index)
            src[d] = position

            def read(src=src):
                value = loader(src)
                return value if source_dtype == acc else ops.to_dtype(value, acc)
            if condition is None:
                term = read()
            else:
                term = ops.masked(in_range(index[d], condition[0], condition[1] + 1), read, 0.0)
            total = term if total is None else ops.add(total, term)
        return total
    return _pointwise(grad, acc, out_size, inner_fn, origin)


for _n in (1, 2, 3):
    register_lowering(getattr(aten, f"reflection_pad{_n}d_backward"))(
        lambda grad, x, padding: _pad_backward(grad, x, padding, _reflection_sources, "reflection_pad_backward"))
    register_lowering(getattr(aten, f"replication_pad{_n}d_backward"))(
        lambda grad, x, padding: _pad_backward(grad, x, padding, _replication_sources, "replication_pad_backward"))
