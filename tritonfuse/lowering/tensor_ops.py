"""Lowerings that create, copy or combine tensors: full/arange/iota, clone and casts, cat,
constant_pad_nd. (Indirect loads and writes: indexing.py.)"""
import operator

import sympy
import torch

from .. import sym
from ..ir import Layout, Pointwise, TensorBox, concat_into_slices
from ..virtualized import ops
from .registry import SUPPORTED_DTYPES, Unsupported, aten, broadcast_tensors, make_loader, register_lowering


def _meta():
    """The fake tensor eager would produce for the node being lowered."""
    from ..graph import current_graph
    return current_graph().current_node.meta["val"]


def _check_dtype(dtype):
    if dtype not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {dtype}")


def _constant_tensor(value, meta):
    _check_dtype(meta.dtype)
    size = sym.sizes_of(meta.shape)
    # (make_loader: the value may be a size or scalar known at run time, e.g. a sym_float)
    return TensorBox.create(Pointwise(meta.device, meta.dtype, make_loader(value, meta.dtype), size,
                                      origins=("full",)))


@register_lowering(aten.full, aten.full_like)
def full(size_or_like, fill_value, **kwargs):
    return _constant_tensor(fill_value, _meta())


@register_lowering(aten.new_full)
def new_full(x, size, fill_value, **kwargs):
    return _constant_tensor(fill_value, _meta())


@register_lowering(aten.zeros, aten.zeros_like, aten.new_zeros)
def zeros(*args, **kwargs):
    return _constant_tensor(0, _meta())


@register_lowering(aten.ones, aten.ones_like, aten.new_ones)
def ones(*args, **kwargs):
    return _constant_tensor(1, _meta())


@register_lowering(aten.empty, aten.empty_like, aten.new_empty, aten.empty_strided, aten.new_empty_strided,
                   aten.empty_permuted)
def empty(*args, **kwargs):
    """Uninitialized memory in eager: zeros here (any value is right), a buffer that fuses
    with its readers instead of an aten allocation between kernels."""
    return _constant_tensor(0, _meta())


@register_lowering(aten.scalar_tensor)
def scalar_tensor(value, **kwargs):
    return _constant_tensor(value, _meta())


@register_lowering(aten.fill)
def fill(x, value):
    if isinstance(value, TensorBox):   # fill.Tensor: a 0-d tensor's value everywhere
        if value.get_size():
            raise Unsupported("fill with a tensor of several elements")
        meta = _meta()
        _check_dtype(meta.dtype)
        loader = make_loader(value, meta.dtype)
        return TensorBox.create(Pointwise(meta.device, meta.dtype, lambda idx: loader([]),
                                          sym.sizes_of(meta.shape), origins=("fill",)))
    return _constant_tensor(value, _meta())


@register_lowering(aten.arange)
def arange(*args, **kwargs):
    meta = _meta()
    _check_dtype(meta.dtype)
    numbers = [a for a in args if isinstance(a, (int, float, sympy.Basic)) and not isinstance(a, bool)]
    if len(numbers) == 1:
        start, step = 0, 1
    else:
        start = numbers[0]
        step = numbers[2] if len(numbers) > 2 else kwargs.get("step", 1)
    start = kwargs.get("start", start)
    return _iota(meta, start, step)


@register_lowering(torch.ops.prims.iota)
def iota(length, *, start, step, dtype, device, requires_grad):
    return _iota(_meta(), start, step)


def _iota(meta, start, step):
    dtype = meta.dtype
    size = sym.sizes_of(meta.shape)

    def inner_fn(index):
        if not dtype.is_floating_point and isinstance(start, int) and isinstance(step, int):
            return ops.index_expr(index[0] * step + start, dtype)
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        position = ops.to_dtype(ops.index_expr(index[0], torch.int64), compute)
        value = ops.add(ops.constant(start, compute), ops.mul(position, ops.constant(step, compute)))
        return ops.to_dtype(value, dtype)
    return TensorBox.create(Pointwise(meta.device, dtype, inner_fn, size, origins=("arange",)))


def _copy_to(x: TensorBox, dtype, origin):
    _check_dtype(dtype)
    loader = make_loader(x, dtype)
    return TensorBox.create(Pointwise(x.get_device(), dtype, loader, list(x.get_size()), origins=(origin,)))


@register_lowering(aten.clone, aten.lift_fresh_copy)
def clone(x, memory_format=None):
    return _copy_to(x, x.get_dtype(), "clone")


@register_lowering(aten._to_copy)
def to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    if device is not None and torch.device(device) != x.get_device():
        raise Unsupported("copy to another device")
    return _copy_to(x, dtype or x.get_dtype(), "to_copy")


@register_lowering(torch.ops.prims.convert_element_type)
def convert_element_type(x, dtype):
    return _copy_to(x, dtype, "convert_element_type")


@register_lowering(aten.copy)
def copy(dst, src, non_blocking=False):
    if src.get_device() != dst.get_device():
        raise Unsupported("copy across devices")
    (src,) = [src] if list(src.get_size()) == list(dst.get_size()) else [broadcast_tensors(src, dst)[0]]
    return _copy_to(src, dst.get_dtype(), "copy")


def in_range(index_value, low, high):
    """A bool value: low <= index < high, computed from a sympy index (bounds may be
    symbolic; a bound that is None is not checked; None when neither is)."""
    if low is None and high is None:
        return None
    position = ops.index_expr(index_value, torch.int64)
    above = ops.ge(position, int_value(low)) if low is not None else None
    below = ops.lt(position, int_value(high)) if high is not None else None
    if above is None or below is None:
        return below if above is None else above
    return ops.logical_and(above, below)


def int_value(value):
    """An int64 op value of a size or index (a constant when static)."""
    value = sym.sint(value)
    return ops.constant(int(value), torch.int64) if value.is_Integer else ops.index_expr(value, torch.int64)


@register_lowering(aten.cat)
def cat(tensors, dim=0):
    tensors = [t for t in tensors if t.numel() != 0 or len(t.get_size()) != 1]
    if not tensors:
        raise Unsupported("cat of empty tensors")
    meta = _meta()
    dtype = meta.dtype
    _check_dtype(dtype)
    ndim = len(tensors[0].get_size())
    dim = dim + ndim if dim < 0 else dim
    offsets, start = [], sympy.Integer(0)
    for t in tensors:
        offsets.append(start)
        start = start + t.get_size()[dim]
    loaders = [make_loader(t, dtype) for t in tensors]
    size = sym.sizes_of(meta.shape)
    if _into_slices(tensors, loaders):
        return concat_into_slices(tensors, loaders, offsets, dim, _dense_layout_of(meta), ("cat",))

    def inner_fn(index):
        result = None
        for k in reversed(range(len(tensors))):
            low = offsets[k]
            high = low + tensors[k].get_size()[dim]
            shifted = list(index)
            shifted[dim] = index[dim] - low

            def body(load=loaders[k], idx=shifted):
                return load(idx)
            if result is None:  # the last input takes every index the others don't
                result = ops.masked(in_range(index[dim], low, high), body, 0)
                continue
            inside = in_range(index[dim], low, high)
            result = ops.where(inside, ops.masked(inside, body, 0), result)
        return result
    return TensorBox.create(Pointwise(meta.device, dtype, inner_fn, size, origins=("cat",)))


def _into_slices(tensors, loaders) -> bool:
    """Whether to compute each input of a cat into its slice of the cat's memory rather
    than as one pointwise node. The pointwise node computes, at every element, every
    input's value and keeps one (the masked branches run all the same): right when the
    inputs are cheap (loads), or when a kernel reads the cat (a pointwise op or a
    reduction: the cat is then computed in that kernel and never stored). Slices when
    only what needs memory reads it (a matmul, a fallback, the graph's output) and some
    input is a computation with transcendental math (the gradients of q/k/v through
    rotary embeddings, cat'ed for a merged projection's matmul), or of several loads when
    the inputs' sizes are equal: each input's work is then done once, where it is
    stored. (Inductor's cat chooses between its pointwise cat and ConcatKernel alike.)"""
    from .. import config
    from ..graph import count_ops, current_graph
    if not config.cat_slices or _read_by_a_kernel(current_graph().current_node):
        return False
    # what reading one element of each input costs (through its views and cast)
    costs = [count_ops(Pointwise(t.get_device(), t.get_dtype(), load, list(t.get_size())))
             for t, load in zip(tensors, loaders)]
    if any(expensive for _, expensive in costs):
        return True
    # inputs of several loads each: slices where they share one kernel (equal sizes), so
    # that no launch is added
    equal = all(sym.same_sizes(t.get_size(), tensors[0].get_size()) for t in tensors)
    return equal and any(loads > 2 for loads, _ in costs)


# readers that take their operands from memory, never computing them in their own loads
# (by default; under max-autotune a GEMM template's prologue fusion stays with single ops)
_MEMORY_READERS = (aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.convolution)
# ops that return a view of their input, or a reshape of it, whatever their schema says
_VIEW_LIKE = (aten._unsafe_view, aten.reshape, aten.view)


def _dense_layout_of(meta) -> Layout:
    """Eager's layout of ``meta`` where it is dense (a channels_last cat stays so), else
    contiguous."""
    from ..graph import _is_dense
    size, stride = sym.sizes_of(meta.shape), sym.sizes_of(meta.stride())
    if _is_dense(size, stride):
        return Layout(meta.device, meta.dtype, size, stride)
    return Layout.contiguous(meta.device, meta.dtype, size)


def _read_by_a_kernel(node) -> bool:
    """Whether a lowered op other than a matmul reads FX node ``node``'s value, directly or
    through views: a kernel that can compute the value in its loads."""
    from .registry import lowerings
    seen, todo = set(), list(node.users)
    while todo:
        user = todo.pop()
        if user in seen or user.op != "call_function":
            continue
        seen.add(user)
        target = user.target
        schema = getattr(target, "_schema", None)
        packet = getattr(target, "overloadpacket", None)
        if target is operator.getitem or packet in _VIEW_LIKE or (schema is not None and any(
                r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)):
            todo.extend(user.users)   # a view (or one of a split's): its readers read the cat
        elif target in lowerings and packet not in _MEMORY_READERS:
            return True
    return False


@register_lowering(aten.constant_pad_nd)
def constant_pad_nd(x, pad, value=0):
    meta = _meta()
    dtype = meta.dtype
    _check_dtype(dtype)
    size = list(x.get_size())
    ndim = len(size)
    loader = x.make_loader()
    pads = []  # (dim, before)
    for i in range(len(pad) // 2):
        pads.append((ndim - 1 - i, pad[2 * i]))
    out_size = sym.sizes_of(meta.shape)

    def inner_fn(index):
        source = list(index)
        mask = None
        for d, before in pads:
            source[d] = index[d] - before
            inside = in_range(index[d], before, before + size[d])
            mask = inside if mask is None else ops.logical_and(mask, inside)
        if mask is None:
            return loader(source)
        return ops.masked(mask, lambda: loader(source), value)
    return TensorBox.create(Pointwise(meta.device, dtype, inner_fn, out_size, origins=("constant_pad_nd",)))


@register_lowering(aten.slice_scatter)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """``x`` with ``x[..., start:end:step, ...]`` replaced by ``src``: one pointwise
    ``where(inside the slice, src[(i - start) / step], x)``. Inside the slice a step-1
    read of ``src`` is contiguous along ``dim`` (a masked vector load, not the gather that
    torch's decomposition into index arithmetic gives)."""
    return _slice_scatter(x.make_loader(), src, list(x.get_size()), dim, start, step)


@register_lowering(aten.slice_backward)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    """The gradient of ``x[..., start:end:step, ...]``: zeros with ``grad_output`` in the slice."""
    return _slice_scatter(None, grad_output, sym.sizes_of(input_sizes), dim, start, step)


def _slice_scatter(base_loader, src, size, dim, start, step):
    meta = _meta()
    dtype = meta.dtype
    _check_dtype(dtype)
    if not isinstance(step, int) or step < 1:
        raise Unsupported(f"slice_scatter with step {step}")
    dim = dim + len(size) if dim < 0 else dim
    length = size[dim]
    start = sympy.Integer(0) if start is None else sym.sint(start)
    if start.is_Integer and int(start) < 0:
        start = start + length
    if start.is_number and sym.is_static(length):
        start = sympy.Integer(max(0, min(int(start), sym.to_int(length))))
    elif not start.is_number and not (start.is_nonnegative or sym.current_sizevars().known_lt(-1, start)):
        raise Unsupported(f"slice_scatter with a symbolic start {start} of unknown sign")
    end = start + src.get_size()[dim] * step   # src holds exactly the slice's elements
    src_loader = make_loader(src, dtype)

    # bounds that every index meets need no test (the backward of a slice over a whole dim)
    low = None if start == 0 else start
    high = None if sym.same_size(end, length) else end

    def inner_fn(index):
        position = index[dim]
        inside = in_range(position, low, high)
        if step != 1:
            # a negative (position - start) is outside already; its remainder only needs to be 0 on multiples
            on_step = ops.eq(ops.index_expr(sym.ModularIndexing(position - start + step * end, 1, step),
                                            torch.int64), ops.constant(0, torch.int64))
            inside = on_step if inside is None else ops.logical_and(inside, on_step)
        source = list(index)
        source[dim] = (position - start) if step == 1 else sym.FloorDiv(position - start, step)
        if inside is None:   # the slice is the whole dim
            return src_loader(source)
        value = ops.masked(inside, lambda: src_loader(source), 0)
        if base_loader is None:
            return value
        return ops.where(inside, value, base_loader(index))
    return TensorBox.create(Pointwise(meta.device, dtype, inner_fn, list(size), origins=("slice_scatter",)))
