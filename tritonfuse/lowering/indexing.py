"""Indexing: indirect loads (index, gather, take, embedding, the unsafe and masked forms)
and indirect writes (scatter, scatter_add, scatter_reduce, index_put, index_add,
index_copy, index_fill, and the unsafe and masked forms that aot_autograd's
decompositions of embedding_dense_backward, nll_loss_backward and slice_scatter produce).

An indirect write copies its input into a buffer made for it (a fill when the input is a
constant such as zeros) and scatters into that buffer (``ir.Scatter``, ``ir.mutate``);
the scheduler runs the copy first and keeps the scatter out of its readers' kernels. Two
cases need no write at all and become pointwise, fusing both ways:

  * one index per line (``index.size(dim) == 1``, as in nll_loss_backward's one-hot
    scatter): ``out[p] = p[dim] == index[p with dim 0] ? combine(self[p], src) : self[p]``;
  * index_put with a boolean mask covering leading dims and one value:
    ``out = where(mask, value, self)`` (or ``self + where(mask, value, 0)`` accumulating).
"""
from typing import Callable, NamedTuple, Optional

import sympy
import torch

from .. import sym
from ..codegen.registry import deterministic_scatter, scatter_dtypes
from ..ir import Layout, Pointwise, Scatter, StorageBox, TensorBox, buffer_of, mutate, origins_of
from ..ops_table import reduction_identity
from ..virtualized import ops
from .registry import Unsupported, aten, broadcast_shapes, expand, make_loader, register_lowering
from .tensor_ops import _check_dtype, _meta
from .views import view

_INDEX_DTYPES = (torch.int64, torch.int32)
# scatter_reduce / scatter(reduce=) names -> ops_table.SCATTER_MODES
_REDUCE_MODES = {"sum": "sum", "add": "sum", "prod": "prod", "multiply": "prod", "amax": "max", "amin": "min"}

# The device types on which eager's own kernel lands colliding writes in no fixed order
# (the ops torch.use_deterministic_algorithms makes deterministic or refuses). Elsewhere
# eager is deterministic and so must the lowering be: a backend whose colliding writes
# land in no fixed order (codegen.registry.deterministic_scatter) leaves the op to eager.
EAGER_UNORDERED_WRITES = {
    "scatter": ("cuda",), "scatter_add": ("cuda",), "scatter_reduce": ("cuda",), "index_add": ("cuda",),
    "index_copy": ("cpu", "cuda"),
    "index_put": ("cpu", "cuda"),          # accumulate=False
    "index_put_accumulate": ("cpu",),      # CUDA sorts the indices
    "embedding_dense_backward": (),        # CUDA sorts; CPU threads own table rows
}

# Ops whose eager kernel is deterministic on a device only at a cost that a compiled step
# should not pay. On CUDA, embedding_dense_backward sorts the indices: about 20 launches per
# embedding and step (0.14 ms of device time and as many host launches in an H100 Llama
# training step of 2.8 ms, where Inductor makes 3 kernels). As torch.compile's default
# compiler does, the lowering adds a table row's gradients there with float atomics, in no
# fixed order, unless torch.use_deterministic_algorithms(True) is on: it decomposes into an
# index_add, whose eager CUDA kernel adds with atomics too (decompositions.py).
# index_put(accumulate=True) on CUDA (also _unsafe_masked_index_put_accumulate, and the
# backward of advanced indexing and of nearest upsampling) sorts the indices in eager too;
# torch.compile's default compiler adds with atomics there, and so does the lowering.
UNORDERED_AS_TORCH_COMPILE = {"embedding_dense_backward": ("cuda",), "index_put_accumulate": ("cuda",)}


def unordered_writes_allowed(device_type: str, eager_op: str) -> bool:
    """Whether a lowering of ``eager_op`` may land colliding float writes in no fixed order
    on ``device_type`` (outside torch.use_deterministic_algorithms)."""
    return device_type in EAGER_UNORDERED_WRITES.get(eager_op, ()) + UNORDERED_AS_TORCH_COMPILE.get(eager_op, ())


class _Pass(NamedTuple):
    """One round of indirect writes: ``value_fn(i)`` is stored at its element, or combined
    with it by ``mode`` (ops_table.SCATTER_MODES). ``uniform``: every write carries the same
    value, so the order of colliding writes cannot change the result."""
    value_fn: Callable
    mode: Optional[str] = None
    uniform: bool = False


def _normalize_dim(dim, ndim):
    return dim + ndim if dim < 0 else dim


def _indirect(index_loader, position, dim_size):
    return ops.indirect_indexing(index_loader(position), dim_size)


def _clamped(index_loader, dtype, dim_size):
    """Index values clamped to [-dim_size, dim_size - 1] (valid, negatives wrapping); the
    size may be symbolic."""
    def bound(value):
        value = sympy.expand(value)
        return ops.constant(int(value), dtype) if value.is_Integer else ops.index_expr(value, dtype)

    def load(position):
        value = ops.maximum(index_loader(position), bound(-dim_size))
        return ops.minimum(value, bound(dim_size - 1))
    return load


# ---- indirect loads ---------------------------------------------------------------------

def _index_layout(x_size, indices, clamp=False):
    """Where ``x[indices]`` (advanced indexing, ``None`` for a full dim) reads ``x``.
    Returns (result size, source(index) -> index into ``x``). The index tensors broadcast
    to one shape, which takes the place of the indexed dims when they are adjacent and
    leads otherwise, as in eager. ``clamp``: indices are clamped into the dim (for masked
    writes, whose indices need not be valid where the mask is off)."""
    positions = [i for i, t in enumerate(indices) if t is not None]
    index_tensors = [indices[i] for i in positions]
    for t in index_tensors:
        if t.get_dtype() not in _INDEX_DTYPES:
            raise Unsupported(f"indexing with a {t.get_dtype()} tensor")
    index_shape = broadcast_shapes(*[t.get_size() for t in index_tensors])
    index_loaders = [expand(t, index_shape).make_loader() for t in index_tensors]
    if clamp:
        index_loaders = [_clamped(load, t.get_dtype(), x_size[d])
                         for load, t, d in zip(index_loaders, index_tensors, positions)]
    n_index = len(index_shape)
    rest_dims = [d for d in range(len(x_size)) if d not in positions]
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    before = positions[0] if adjacent else 0
    out_size = [x_size[d] for d in rest_dims[:before]] + list(index_shape) + [x_size[d] for d in rest_dims[before:]]

    def source(out_index):
        out_index = list(out_index)
        index_part = out_index[before:before + n_index]
        rest = iter(out_index[:before] + out_index[before + n_index:])
        result = []
        for d in range(len(x_size)):
            if d in positions:
                result.append(_indirect(index_loaders[positions.index(d)], index_part, x_size[d]))
            else:
                result.append(next(rest))
        return result
    return out_size, source


@register_lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(x, indices):
    """``x[indices]``. ``_unsafe_index`` is the same read without the bounds check; it is
    what every upsample overload becomes (torch decomposes them at the Autograd key into
    ``_unsafe_index`` at index vectors computed with eager's float arithmetic), so with the
    index vectors left unrealized an upsample is one kernel fused with what follows."""
    out_size, source = _index_layout(list(x.get_size()), indices)
    loader = x.make_loader()
    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), lambda idx: loader(source(idx)), out_size,
                                      origins=origins_of([x]) + ("index",)))


@register_lowering(aten._unsafe_masked_index)
def unsafe_masked_index(x, mask, indices, fill):
    """``x[indices]`` where ``mask`` holds, ``fill`` elsewhere; the indices may be out of
    range where the mask is false (slice_scatter's decomposition), so nothing is read there."""
    out_size, source = _index_layout(list(x.get_size()), indices)
    loader = x.make_loader()
    mask_loader = expand(mask, out_size).make_loader()
    dtype = x.get_dtype()

    def inner_fn(idx):
        condition = mask_loader(idx)
        if mask.get_dtype() != torch.bool:
            condition = ops.to_dtype(condition, torch.bool)
        return ops.masked(condition, lambda: loader(source(idx)), fill)
    return TensorBox.create(Pointwise(x.get_device(), dtype, inner_fn, out_size,
                                      origins=origins_of([x]) + ("masked_index",)))


@register_lowering(aten.gather)
def gather(x, dim, index_tensor, sparse_grad=False):
    size = list(x.get_size())
    dim = _normalize_dim(dim, len(size))
    loader = x.make_loader()
    index_loader = index_tensor.make_loader()

    def inner_fn(index):
        source = list(index)
        source[dim] = _indirect(index_loader, index, size[dim])
        return loader(source)
    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), inner_fn, list(index_tensor.get_size()),
                                      origins=("gather",)))


@register_lowering(aten.embedding)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    weight_loader = weight.make_loader()
    index_loader = indices.make_loader()
    rows = weight.get_size()[0]
    index_ndim = len(indices.get_size())
    out_size = list(indices.get_size()) + [weight.get_size()[1]]

    def inner_fn(index):
        row = _indirect(index_loader, index[:index_ndim], rows)
        return weight_loader([row, index[index_ndim]])
    return TensorBox.create(Pointwise(weight.get_device(), weight.get_dtype(), inner_fn, out_size,
                                      origins=("embedding",)))


@register_lowering(aten.take)
def take(x, index):
    """``x.flatten()[index]`` (negative indices count from the end)."""
    size = list(x.get_size())
    loader, index_loader = x.make_loader(), index.make_loader()
    if index.get_dtype() not in _INDEX_DTYPES:
        raise Unsupported(f"take with a {index.get_dtype()} index")

    def inner_fn(i):
        flat = _indirect(index_loader, i, sym.product(size))
        return loader(sym.unflatten(flat, size))
    return TensorBox.create(Pointwise(x.get_device(), x.get_dtype(), inner_fn, list(index.get_size()),
                                      origins=origins_of([x]) + ("take",)))


# ---- indirect writes: the shared machinery ----------------------------------------------

def _fresh_copy(x: TensorBox, dtype, layout_like=None):
    """A new buffer holding ``x`` as ``dtype``, for a scatter to write into: laid out as
    ``layout_like`` (eager's result, when it has x's rank: not for a 0-d x seen as a vector)
    when that is dense, else contiguous."""
    from ..graph import _is_dense
    size = list(x.get_size())
    layout = None
    if layout_like is not None and dtype == layout_like.dtype and layout_like.dim() == len(size):
        shape, stride = sym.sizes_of(layout_like.shape), sym.sizes_of(layout_like.stride())
        if _is_dense(shape, stride):
            layout = Layout(x.get_device(), dtype, shape, stride)
    origins = origins_of([x]) or ("copy",)
    return StorageBox(Pointwise(x.get_device(), dtype, make_loader(x, dtype), size, origins=origins)).realize(layout)


def _scatter_into(x, ranges, output_indexer, passes, origin, sources=(), eager_op=None):
    """``x`` after, for each ``_Pass`` of ``passes`` in turn, ``value_fn(i)`` (in x's dtype) is
    written to element ``output_indexer(i)`` for every ``i`` in ``ranges``, or combined with
    it by ``mode``. ``sources``: the tensors the values come from (their ops name the
    scatter's kernel). ``eager_op``: the EAGER_UNORDERED_WRITES entry (default ``origin``)."""
    dtype, device = x.get_dtype(), x.get_device()
    _check_dtype(dtype)
    if sym.product(ranges) == 0:   # (a symbolic size is never 0: Dynamo specializes 0 and 1)
        return TensorBox.create(Pointwise(device, dtype, x.make_loader(), list(x.get_size()),
                                          origins=origins_of([x]) + (origin,)))
    eager_op = eager_op or origin
    if not all(_backend_combines(device, dtype, p.mode) for p in passes):
        if dtype in (torch.float16, torch.bfloat16) \
                and all(_backend_combines(device, torch.float32, p.mode) for p in passes):
            # combine in a float32 copy, round once at the end
            wide = [p._replace(value_fn=lambda i, fn=p.value_fn: ops.to_dtype(fn(i), torch.float32)) for p in passes]
            return _cast(_scatter_into(_cast(x, torch.float32), ranges, output_indexer, wide, origin, sources,
                                       eager_op), dtype)
        modes = ", ".join(str(p.mode) for p in passes if p.mode is not None)
        raise Unsupported(f"{modes} scatter into {dtype} tensors is not supported on {device.type}")
    _check_write_order(device, dtype, passes, eager_op)
    result = TensorBox(StorageBox(_fresh_copy(x, dtype, _meta())))
    origins = tuple(dict.fromkeys(origins_of([s for s in sources if isinstance(s, TensorBox)]) + (origin,)))
    for p in passes:
        scatter = Scatter(device, dtype, p.value_fn, list(ranges), origins=origins, output_indexer=output_indexer,
                          mode=p.mode)
        result = mutate(buffer_of(result), scatter)
    return result


def _backend_combines(device, dtype, mode) -> bool:
    return mode is None or dtype in scatter_dtypes(device.type, mode)


def _check_write_order(device, dtype, passes, eager_op):
    """Raise Unsupported where colliding writes whose order changes the result (stores of
    different values, float sums and products) would land in no fixed order while eager's
    land in one: on devices where eager's ``eager_op`` is deterministic, and everywhere
    under torch.use_deterministic_algorithms."""
    if deterministic_scatter(device.type):
        return
    if not any(not p.uniform and (p.mode is None or (p.mode in ("sum", "prod") and dtype.is_floating_point))
               for p in passes):
        return
    if torch.are_deterministic_algorithms_enabled():
        raise Unsupported("deterministic algorithms are enabled and colliding writes (atomics, racing stores) "
                          f"land in no fixed order on {device.type}")
    if not unordered_writes_allowed(device.type, eager_op):
        raise Unsupported(f"eager's {eager_op} is deterministic on {device.type}, and colliding writes (atomics, "
                          "racing stores) would land in no fixed order")


def scatter_sum_lowered(device, eager_op) -> bool:
    """Whether a float scatter-sum for ``eager_op`` is lowered on ``device``: its backend adds
    in a fixed order, or it may add in none there (decompositions.py asks before decomposing
    into one)."""
    return deterministic_scatter(device.type) or (not torch.are_deterministic_algorithms_enabled()
                                                  and unordered_writes_allowed(device.type, eager_op))


def _cast(x, dtype):
    return TensorBox.create(Pointwise(x.get_device(), dtype, make_loader(x, dtype), list(x.get_size()),
                                      origins=origins_of([x]) + ("to_copy",)))


def _value_loader(value, size, dtype):
    """A loader of ``value`` (tensor, broadcast to ``size``, or python scalar) as ``dtype``."""
    if isinstance(value, TensorBox):
        value = expand(value, size)
    return make_loader(value, dtype)


# ---- scatter, scatter_add, scatter_reduce ---------------------------------------------

@register_lowering(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src, None, True, "scatter")


@register_lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_with_reduce(x, dim, index, src, reduce):
    return _scatter(x, dim, index, src, _reduce_mode(reduce), True, "scatter")


@register_lowering(aten.scatter_add)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "sum", True, "scatter_add")


@register_lowering(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    return _scatter(x, dim, index, src, _reduce_mode(reduce), include_self, "scatter_reduce")


def _reduce_mode(reduce):
    if reduce not in _REDUCE_MODES:
        raise Unsupported(f"scatter reduction {reduce!r}")
    return _REDUCE_MODES[reduce]


def _scatter(x, dim, index, src, mode, include_self, origin):
    size = list(x.get_size())
    if not size:
        raise Unsupported("scatter into a 0-d tensor")
    if index.get_dtype() not in _INDEX_DTYPES:
        raise Unsupported(f"scatter with a {index.get_dtype()} index")
    dim = _normalize_dim(dim, len(size))
    ranges = list(index.get_size())
    dtype = x.get_dtype()
    index_loader = index.make_loader()
    src_loader = make_loader(src, dtype)   # src[i] for i in the index's shape (src may be larger)
    if _one_index_per_line(size, ranges, dim):
        return _one_hot_scatter(x, dim, index_loader, src_loader, mode, include_self, origin)

    def output_indexer(i):
        target = list(i)
        target[dim] = _indirect(index_loader, i, size[dim])
        return target
    passes = [_Pass(src_loader, mode, uniform=not isinstance(src, TensorBox))]
    if not include_self:   # the elements written start from the reduction's identity
        identity = reduction_identity(mode, dtype)
        passes.insert(0, _Pass(lambda i: ops.constant(identity, dtype), uniform=True))
    return _scatter_into(x, ranges, output_indexer, passes, origin, [src])


def _one_index_per_line(size, index_size, dim) -> bool:
    return index_size[dim] == 1 and all(sym.same_size(a, b) for d, (a, b) in enumerate(zip(size, index_size))
                                        if d != dim)


_COMBINE_OPS = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}   # SCATTER_MODES -> ops


def _one_hot_scatter(x, dim, index_loader, src_loader, mode, include_self, origin):
    """A scatter whose index has one entry per line along ``dim``: each element compares its
    position with its line's index (eager raises on an index out of range; here such a
    line is left unchanged)."""
    x_loader = x.make_loader()
    dtype = x.get_dtype()

    def inner_fn(p):
        line = list(p)
        line[dim] = sympy.Integer(0)
        hit = ops.eq(ops.to_dtype(index_loader(line), torch.int64), ops.index_expr(p[dim], torch.int64))
        old, new = x_loader(p), src_loader(line)
        if mode is not None and include_self:
            new = getattr(ops, _COMBINE_OPS[mode])(old, new)
        return ops.where(hit, new, old)
    return TensorBox.create(Pointwise(x.get_device(), dtype, inner_fn, list(x.get_size()),
                                      origins=tuple(dict.fromkeys(origins_of([x]) + (origin,)))))


# ---- index_put, index_add ---------------------------------------------------------------

@register_lowering(aten.index_put, aten._unsafe_index_put)
def index_put(x, indices, values, accumulate=False):
    if any(t is not None and t.get_dtype() == torch.bool for t in indices):
        return _mask_put(x, indices, values, accumulate)
    out_size, source = _index_layout(list(x.get_size()), indices)
    value_loader = _value_loader(values, out_size, x.get_dtype())
    return _scatter_into(x, out_size, source, [_Pass(value_loader, "sum" if accumulate else None)], "index_put",
                         [values], "index_put_accumulate" if accumulate else "index_put")


@register_lowering(aten._unsafe_masked_index_put_accumulate)
def unsafe_masked_index_put_accumulate(x, mask, indices, values):
    """index_put(accumulate=True) of ``values`` where ``mask`` holds (embedding_dense_backward's
    decomposition). Where it does not, the indices need not be valid: they are clamped
    and 0 is added."""
    out_size, source = _index_layout(list(x.get_size()), indices, clamp=True)
    dtype = x.get_dtype()
    mask_loader = expand(mask, out_size).make_loader()
    value_loader = _value_loader(values, out_size, dtype)

    def value_fn(i):
        return ops.where(mask_loader(i), value_loader(i), ops.constant(0, dtype))
    return _scatter_into(x, out_size, source, [_Pass(value_fn, "sum")], "index_put", [values], "index_put_accumulate")


def _mask_put(x, indices, values, accumulate):
    """``x[mask] = value`` (or ``+=``) with one boolean mask over the leading dims and a
    single value: pointwise, no write."""
    if len([t for t in indices if t is not None]) != 1 or indices[0] is None:
        raise Unsupported("index_put with a boolean mask among other indices")
    mask = indices[0]
    mask_size = list(mask.get_size())
    size = list(x.get_size())
    if not sym.same_sizes(mask_size, size[:len(mask_size)]):
        raise Unsupported("index_put with a boolean mask of another shape")
    if values.numel() != 1:   # (static 1; a symbolic count is never 1)
        raise Unsupported("index_put of several values through a boolean mask (data-dependent count)")
    dtype = x.get_dtype()
    x_loader, mask_loader, value_loader = x.make_loader(), mask.make_loader(), make_loader(values, dtype)
    value_index = [sympy.Integer(0)] * len(values.get_size())

    def inner_fn(p):
        old, new = x_loader(p), value_loader(value_index)
        if accumulate:
            new = ops.add(old, new)
        return ops.where(mask_loader(p[:len(mask_size)]), new, old)
    return TensorBox.create(Pointwise(x.get_device(), dtype, inner_fn, size,
                                      origins=tuple(dict.fromkeys(origins_of([x]) + ("index_put",)))))


@register_lowering(aten.index_add)
def index_add(x, dim, index, source, alpha=1):
    if not x.get_size():
        return view(index_add(_vector(x), 0, index, _vector(source), alpha), [])
    dtype = x.get_dtype()
    source_loader = make_loader(source, dtype)

    def value_fn(i):
        value = source_loader(i)
        return value if alpha == 1 else ops.mul(value, ops.constant(alpha, dtype))
    return _along_dim(x, dim, index, list(source.get_size()), _Pass(value_fn, "sum"), "index_add", [source])


@register_lowering(aten.index_copy)
def index_copy(x, dim, index, source):
    if not x.get_size():
        return view(index_copy(_vector(x), 0, index, _vector(source)), [])
    return _along_dim(x, dim, index, list(source.get_size()), _Pass(make_loader(source, x.get_dtype())),
                      "index_copy", [source])


@register_lowering(aten.index_fill)
def index_fill(x, dim, index, value):
    if isinstance(value, TensorBox) and value.get_size():
        raise Unsupported("index_fill with a tensor of several elements")
    if not x.get_size():
        return view(index_fill(_vector(x), 0, index, value), [])
    size = list(x.get_size())
    dim_ = _normalize_dim(dim, len(size)) if size else 0
    ranges = size[:dim_] + (list(index.get_size()) or [sympy.Integer(1)]) + size[dim_ + 1:]
    value_loader = make_loader(value, x.get_dtype())
    return _along_dim(x, dim, index, ranges, _Pass(lambda i: value_loader([]), uniform=True), "index_fill")


def _vector(t):
    """A 0-d tensor as a 1-element vector (index_add/copy/fill of 0-d tensors: dim 0 of it)."""
    return view(t, [1]) if not t.get_size() else t


def _along_dim(x, dim, index, ranges, write, origin, sources=()):
    """index_add/copy/fill: for every ``i`` of ``ranges`` (x's shape with ``dim`` as long as
    the 1-d ``index``), element ``i`` with ``i[dim] = index[i[dim]]`` of x takes the ``_Pass``
    ``write``'s value."""
    size = list(x.get_size())
    if not size or len(ranges) != len(size) or len(index.get_size()) > 1:
        raise Unsupported(f"{origin} of tensors of other ranks")
    if index.get_dtype() not in _INDEX_DTYPES:
        raise Unsupported(f"{origin} with a {index.get_dtype()} index")
    dim = _normalize_dim(dim, len(size))
    index_loader = index.make_loader()
    index_ndim = len(index.get_size())   # 1, or 0 for a single index

    def output_indexer(i):
        target = list(i)
        target[dim] = _indirect(index_loader, [i[dim]][:index_ndim], size[dim])
        return target
    return _scatter_into(x, ranges, output_indexer, [write], origin, sources)
