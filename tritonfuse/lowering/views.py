"""Views: lowerings that move no data. On a realized buffer a view is a new strided
layout (``ReinterpretView``); on an unrealized value it is an index remapping
(``GenericView``) folded into whoever reads it."""
import sympy
import torch

from .. import sym
from ..ir import GenericView, InputBuffer, Layout, ReinterpretView, TensorBox, buffer_of, realize, strided_layout_of
from .registry import Unsupported, aten, expand, register_lowering


def _normalize_dim(dim, ndim):
    return dim + ndim if dim < 0 else dim


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
    dims = [_normalize_dim(d, len(x.get_size())) for d in dims]
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
    dims = list(range(ndim))
    d0, d1 = _normalize_dim(dim0, ndim), _normalize_dim(dim1, ndim)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(x, dims)


@register_lowering(aten.unsqueeze)
def unsqueeze(x, dim):
    dim = _normalize_dim(dim, len(x.get_size()) + 1)
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
        dims = [_normalize_dim(d, len(size)) for d in dims]
        dims = [d for d in dims if size[d] == 1]
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


@register_lowering(aten.view, aten._unsafe_view, aten.reshape, aten.view_copy)
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

    def reindex(index):
        flat = sum((i * st for i, st in zip(index, sym.contiguous_strides(new_size))), sympy.Integer(0))
        return sym.unflatten(flat, old_size)

    def restride(base):
        strides = _view_strides(old_size, list(base.stride), new_size)
        return None if strides is None else _with_strides(base, new_size, strides, base.offset)
    return TensorBox(GenericView(x.data, new_size, reindex, restride))


@register_lowering(aten.slice)
def slice_(x, dim=0, start=None, end=None, step=1):
    size = list(x.get_size())
    dim = _normalize_dim(dim, len(size))
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
    dim = _normalize_dim(dim, len(size))
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
