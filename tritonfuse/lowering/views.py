"""Views: lowerings that move no data. On a realized buffer a view is a new strided
layout (``ReinterpretView``); on an unrealized value it is an index remapping
(``GenericView``) folded into whoever reads it."""
import sympy
import torch

from .. import sym
from ..ir import GenericView, InputBuffer, Layout, ReinterpretView, TensorBox, buffer_of, realize, strided_layout_of
from ..range_simplify import simplify_with_ranges
from .registry import Unsupported, aten, expand, normalize_dim, register_lowering


def _with_strides(layout, size, stride, offset):
    return Layout(layout.device, layout.dtype, [sym.sint(s) for s in size], [sym.sint(s) for s in stride],
                  sym.sint(offset))


def _restride(x, size, stride, offset):
    layout = strided_layout_of(x)
    return TensorBox(ReinterpretView(buffer_of(x), Layout(layout.device, layout.dtype,
                                                          [sym.sint(s) for s in size],
                                                          [sym.sint(s) for s in stride],
                                                          sym.sint(offset))))


@register_lowering(aten.alias, aten.detach, aten.lift_fresh)
def alias(x):
    return x


@register_lowering(aten.expand)
def expand_(x, size, implicit=False):
    old = x.get_size()
    size = [old[i - (len(size) - len(old))] if s == -1 else s for i, s in enumerate(size)]
    return expand(x, size)


@register_lowering(aten.permute)
def permute(x, dims):
    dims = [normalize_dim(d, len(x.get_size())) for d in dims]
    layout = strided_layout_of(x)
    size = [x.get_size()[d] for d in dims]
    if layout is not None:
        return _restride(x, size, [layout.stride[d] for d in dims], layout.offset)
    inverse = [dims.index(i) for i in range(len(dims))]

    def restride(base):
        return _with_strides(base, size, [base.stride[d] for d in dims], base.offset)
    return TensorBox(GenericView(x.data, size, lambda index: [index[i] for i in inverse], restride))


@register_lowering(aten.t)
def t(x):
    return x if len(x.get_size()) < 2 else permute(x, [1, 0])


@register_lowering(aten.transpose)
def transpose(x, dim0, dim1):
    ndim = len(x.get_size())
    if ndim == 0:   # transpose(0, -1) of a 0-d tensor is the tensor
        return x
    dims = list(range(ndim))
    d0, d1 = normalize_dim(dim0, ndim), normalize_dim(dim1, ndim)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(x, dims)


@register_lowering(aten.unsqueeze)
def unsqueeze(x, dim):
    dim = normalize_dim(dim, len(x.get_size()) + 1)
    size = list(x.get_size())
    new_size = size[:dim] + [sympy.Integer(1)] + size[dim:]
    return view(x, new_size)


@register_lowering(aten.squeeze)
def squeeze(x, dim=None):
    size = list(x.get_size())
    if dim is None:
        dims = [i for i, s in enumerate(size) if s == 1]
    else:
        dims = dim if isinstance(dim, (list, tuple)) else [dim]
        dims = [normalize_dim(d, len(size)) for d in dims]
        dims = [d for d in dims if d < len(size) and size[d] == 1]   # squeeze(0) of a 0-d tensor: no dim
    new_size = [s for i, s in enumerate(size) if i not in dims]
    return view(x, new_size)


def _infer_size(size, numel):
    size = [sym.sint(s) for s in size]
    if -1 in size:
        known = sym.product([s for s in size if s != -1])
        size[size.index(-1)] = sympy.Integer(0) if known == 0 else sym.exact_div(numel, known)
    return size


def _view_strides(old_size, old_stride, new_size):
    """Strides for viewing a strided tensor with a new shape, or None (torch's computeStride).
    Sizes may be symbolic: equalities are checked for every value of the symbols, orderings
    on the example values."""
    same, hint = sym.same_size, sym.hint
    if not old_size:
        return [sympy.Integer(1)] * len(new_size)
    new_stride = [sympy.Integer(0)] * len(new_size)
    view_d = len(new_size) - 1
    chunk_base_stride = old_stride[-1]
    tensor_numel = sympy.Integer(1)
    view_numel = sympy.Integer(1)
    for tensor_d in range(len(old_size) - 1, -1, -1):
        tensor_numel = tensor_numel * old_size[tensor_d]
        if tensor_d == 0 or (old_size[tensor_d - 1] != 1 and
                             not same(old_stride[tensor_d - 1], tensor_numel * chunk_base_stride)):
            while view_d >= 0 and (hint(view_numel) < hint(tensor_numel) or new_size[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base_stride
                view_numel = view_numel * new_size[view_d]
                view_d -= 1
            if not same(view_numel, tensor_numel):
                return None
            if tensor_d > 0:
                chunk_base_stride = old_stride[tensor_d - 1]
                tensor_numel = sympy.Integer(1)
                view_numel = sympy.Integer(1)
    if view_d != -1:
        return None
    return [sympy.expand(s) for s in new_stride]


@register_lowering(aten.view, aten._unsafe_view, aten.reshape)
def view(x, size):
    if isinstance(size, torch.dtype):
        raise Unsupported("view as another dtype")
    old_size = [sym.sint(s) for s in x.get_size()]
    new_size = _infer_size(size, sym.product(old_size))
    if sym.same_sizes(new_size, old_size):
        return x
    layout = strided_layout_of(x)
    if layout is not None:
        strides = _view_strides(old_size, list(layout.stride), new_size)
        if strides is not None:
            return _restride(x, new_size, strides, layout.offset)

    def unflattened(index):
        flat = sum((i * st for i, st in zip(index, sym.contiguous_strides(new_size))), sympy.Integer(0))
        return sym.unflatten(flat, old_size)

    def restride(base):
        strides = _view_strides(old_size, list(base.stride), new_size)
        return None if strides is None else _with_strides(base, new_size, strides, base.offset)
    return TensorBox(GenericView(x.data, new_size, _within_ranges(unflattened, new_size), restride))


def _within_ranges(reindex, size):
    """``reindex``, worked out once over the view's own index variables and simplified with
    their ranges (``0 <= v < size``), then applied by substitution.

    A reshape's index is the flat index, split again: every dimension's piece holds the
    whole flat index (``FloorDiv(flat, W*C)``, ``ModularIndexing(flat, C, W)``, ...), so
    reshapes read through reshapes (a Swin block's window partition, roll and reverse)
    nest copies of copies. Folded with the ranges first, each piece keeps only the
    variables it needs (``ModularIndexing(v1*ws + v2, 1, H)`` is ``v1*ws + v2``), and the
    composed index stays small. Loaders are called with in-range indices (or under a
    mask), where the folded pieces give the same values."""
    variables = sym.index_vars("view", len(size))
    ranges = dict(zip(variables, size))
    pieces = [simplify_with_ranges(piece, ranges) for piece in reindex(variables)]

    def apply(index):
        replacement = dict(zip(variables, index))
        return [piece.xreplace(replacement) for piece in pieces]
    return apply


@register_lowering(aten.slice)
def slice_(x, dim=0, start=None, end=None, step=1):
    size = list(x.get_size())
    dim = normalize_dim(dim, len(size))
    length = size[dim]
    if sym.is_static(length) and all(v is None or isinstance(v, int) for v in (start, end)):
        length = sym.to_int(length)
        start = 0 if start is None else start
        end = length if end is None else end
        start = max(0, min(length, start + length if start < 0 else start))
        end = max(start, min(length, end + length if end < 0 else end))
        new_len = sympy.Integer((end - start + step - 1) // step)
    else:   # symbolic bounds: the result's length is the one Dynamo recorded
        start = sympy.Integer(0) if start is None else sym.sint(start)
        if start.is_Integer and int(start) < 0:
            start = start + length
        new_len = sym.sint(_meta_size(dim))
    new_size = size[:dim] + [new_len] + size[dim + 1:]
    layout = strided_layout_of(x)
    if layout is not None:
        stride = list(layout.stride)
        offset = layout.offset + start * stride[dim]
        stride[dim] = stride[dim] * step
        return _restride(x, new_size, stride, offset)

    def reindex(index):
        index = list(index)
        index[dim] = index[dim] * step + start
        return index

    def restride(base):
        stride = list(base.stride)
        offset = base.offset + start * stride[dim]
        stride[dim] = stride[dim] * step
        return _with_strides(base, new_size, stride, offset)
    return TensorBox(GenericView(x.data, new_size, reindex, restride))


def _meta_size(dim):
    from ..graph import current_graph
    return current_graph().current_node.meta["val"].shape[dim]


@register_lowering(aten.select)
def select(x, dim, index):
    size = list(x.get_size())
    dim = normalize_dim(dim, len(size))
    if isinstance(index, int) and index < 0:
        index = size[dim] + index
    new_size = size[:dim] + size[dim + 1:]
    layout = strided_layout_of(x)
    if layout is not None:
        stride = list(layout.stride)
        offset = layout.offset + index * stride[dim]
        return _restride(x, new_size, stride[:dim] + stride[dim + 1:], offset)

    def reindex(idx):
        return list(idx[:dim]) + [sym.sint(index)] + list(idx[dim:])

    def restride(base):
        stride = list(base.stride)
        return _with_strides(base, new_size, stride[:dim] + stride[dim + 1:], base.offset + index * stride[dim])
    return TensorBox(GenericView(x.data, new_size, reindex, restride))


@register_lowering(aten.as_strided)
def as_strided(x, size, stride, storage_offset=None):
    base = buffer_of(x)
    if base is None:
        realize(x)
        base = buffer_of(x)
    if isinstance(base, InputBuffer) and getattr(base, "storage_offset", 0):
        raise Unsupported("as_strided of an input with a storage offset")
    if storage_offset is None:
        layout = strided_layout_of(x)
        storage_offset = layout.offset
    layout = base.layout
    return TensorBox(ReinterpretView(base, Layout(layout.device, layout.dtype, [sym.sint(s) for s in size],
                                                  [sym.sint(s) for s in stride], sym.sint(storage_offset))))


@register_lowering(aten.diagonal)
def diagonal(x, offset=0, dim1=0, dim2=1):
    """The diagonal of dims ``dim1``/``dim2`` (shifted by ``offset``) as the last dim."""
    size = list(x.get_size())
    ndim = len(size)
    d1, d2 = normalize_dim(dim1, ndim), normalize_dim(dim2, ndim)
    if not (sym.is_static(size[d1]) and sym.is_static(size[d2])):
        raise Unsupported("the diagonal of symbolic dims")
    row_start, col_start = (0, offset) if offset >= 0 else (-offset, 0)
    length = max(0, min(sym.to_int(size[d1]) - row_start, sym.to_int(size[d2]) - col_start))
    kept = [d for d in range(ndim) if d not in (d1, d2)]
    new_size = [size[d] for d in kept] + [sympy.Integer(length)]

    def restride(base):
        stride = list(base.stride)
        start = base.offset + row_start * stride[d1] + col_start * stride[d2]
        return _with_strides(base, new_size, [stride[d] for d in kept] + [stride[d1] + stride[d2]], start)

    layout = strided_layout_of(x)
    if layout is not None:
        return TensorBox(ReinterpretView(buffer_of(x), restride(layout)))

    def reindex(index):
        full = [None] * ndim
        for d, i in zip(kept, index[:-1]):
            full[d] = i
        full[d1], full[d2] = index[-1] + row_start, index[-1] + col_start
        return full
    return TensorBox(GenericView(x.data, new_size, reindex, restride))


@register_lowering(aten.unfold)
def unfold(x, dim, window, step):
    """Every ``window``-long slice of dim ``dim``, ``step`` apart: that dim counts the
    slices and a new last dim walks each one."""
    size = list(x.get_size())
    if not size:   # a 0-d tensor has one slice of at most one element
        if window != 1:
            raise Unsupported("unfold of a 0-d tensor into empty slices")
        return view(x, [1])
    dim = normalize_dim(dim, len(size))
    if not sym.is_static(size[dim]):
        raise Unsupported("unfold of a symbolic dim")
    count = (sym.to_int(size[dim]) - window) // step + 1
    new_size = size[:dim] + [sympy.Integer(count)] + size[dim + 1:] + [sympy.Integer(window)]

    def restride(base):
        stride = list(base.stride)
        return _with_strides(base, new_size, stride[:dim] + [stride[dim] * step] + stride[dim + 1:] + [stride[dim]],
                             base.offset)

    layout = strided_layout_of(x)
    if layout is not None:
        return TensorBox(ReinterpretView(buffer_of(x), restride(layout)))

    def reindex(index):
        return list(index[:dim]) + [index[dim] * step + index[-1]] + list(index[dim + 1:-1])
    return TensorBox(GenericView(x.data, new_size, reindex, restride))


# ---- view copies: the view's values in a tensor of their own ---------------------------------

def _narrow(x, dim, start, length):
    return slice_(x, dim, start, start + length)


def _split_with_sizes(x, split_sizes, dim=0):
    starts = [sum(split_sizes[:k]) for k in range(len(split_sizes))]
    return [slice_(x, dim, start, start + length) for start, length in zip(starts, split_sizes)]


def _static_length(x, dim):
    length = x.get_size()[normalize_dim(dim, len(x.get_size()))]
    if not sym.is_static(length):
        raise Unsupported("splitting a dim of symbolic length into pieces")
    return sym.to_int(length)


def _split(x, split_size, dim=0):
    length = _static_length(x, dim)
    sizes = [min(split_size, length - start) for start in range(0, length, split_size)] or [0]
    return _split_with_sizes(x, sizes, dim)


def _unbind(x, dim=0):
    return [select(x, dim, k) for k in range(_static_length(x, dim))]


def _copied(view_fn):
    """The lowering of a ``*_copy`` op: its view, copied so that it never aliases its input."""
    def lowering(x, *args, **kwargs):
        from .tensor_ops import clone
        result = view_fn(x, *args, **kwargs)
        if isinstance(result, (list, tuple)):
            return [clone(part) for part in result]
        return clone(result)
    return lowering


register_lowering(aten.unsafe_split)(_split)
register_lowering(aten.unsafe_split_with_sizes)(_split_with_sizes)
for _copy_op, _view_fn in [
        (aten.view_copy, view), (aten.expand_copy, expand_), (aten.permute_copy, permute), (aten.t_copy, t),
        (aten.transpose_copy, transpose), (aten.squeeze_copy, squeeze), (aten.unsqueeze_copy, unsqueeze),
        (aten.alias_copy, alias), (aten.slice_copy, slice_), (aten.select_copy, select),
        (aten.diagonal_copy, diagonal), (aten.narrow_copy, _narrow), (aten.unbind_copy, _unbind),
        (aten.split_copy, _split), (aten.split_with_sizes_copy, _split_with_sizes)]:
    register_lowering(_copy_op)(_copied(_view_fn))
