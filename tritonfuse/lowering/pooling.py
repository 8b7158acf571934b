"""Pooling and its backwards as pointwise kernels with unrolled window reads.

Each output element reads its window with one (masked where it can leave the input) load
per window position, so a pool fuses with what produces its input and with what reads
its output. A backward reads, for each input element, the few outputs whose windows
cover it (a gather: no atomics, no scatter). Windows of more than MAX_WINDOW positions
fall back to aten, as in Inductor; so do cases whose output positions need more reads.

    max_pool{2,3}d_with_indices (+ backward)     avg_pool{2,3}d (+ backward)
    _adaptive_avg_pool{2,3}d (+ 2d backward)     adaptive_max_pool{2,3}d
    (avg_pool1d, max_pool1d, adaptive_avg_pool1d and adaptive_max_pool1d arrive as their 2d forms)

Window geometry (eager's): output o covers input o * stride - padding + k * dilation,
k in [0, kernel). Spatial dims are the trailing ones; any leading dims are batch dims.
Sizes may be symbolic (the window itself is static): a bounds check that cannot be ruled
out for every size is kept. Adaptive pools, whose windows follow from the sizes, need
static sizes and fall back otherwise.
"""
import itertools
import math

import sympy
import torch

from .. import sym
from ..ir import Pointwise, TensorBox, origins_of, realize, storage_of
from ..virtualized import ops
from .registry import SUPPORTED_DTYPES, Unsupported, aten, register_lowering, static_sizes
from .tensor_ops import in_range, int_value

MAX_WINDOW = 25   # unrolled reads per output element (Inductor's limit too)


def _meta():
    from ..graph import current_graph
    return current_graph().current_node.meta["val"]


def _ntuple(value, n, default=None):
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    if isinstance(value, int):
        return [value] * n
    value = static_sizes(value, "a pooling window")
    return value * n if len(value) == 1 else value


def accumulate_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def check_input(x, spatial, integers=False):
    """``integers``: int64 values too (eager's CPU average pool takes them)."""
    dtype = x.get_dtype()
    if dtype not in SUPPORTED_DTYPES or not (dtype.is_floating_point or (integers and dtype == torch.int64)):
        raise Unsupported(f"pooling of {dtype}")
    if len(x.get_size()) not in (spatial + 1, spatial + 2):
        raise Unsupported("pooling input of unexpected rank")
    if any(s == 0 for s in x.get_size()):
        raise Unsupported("pooling of an empty tensor")


def realize_if_costly(x):
    """A window reads its input several times: an unrealized input that is more than one
    load of cheap math is computed once into a buffer instead of once per read."""
    from ..graph import count_ops
    box = storage_of(x)
    if box is not None and not box.is_realized() and isinstance(box.data, Pointwise):
        loads, expensive = count_ops(box.data)
        if loads > 1 or expensive:
            realize(x)


def may_reach(position, bound):
    """Whether ``position`` may be >= ``bound`` for some size (False only when ruled out)."""
    return not bool((sympy.sympify(bound) - position).is_positive)


def all_of(masks):
    result = None
    for mask in masks:
        if mask is not None:
            result = mask if result is None else ops.logical_and(result, mask)
    return result


def masked_read(source, index, mask, dtype, other=0.0):
    """``source`` at ``index`` as ``dtype``; ``other`` where ``mask`` is false (None: no mask)."""
    loader = source.make_loader()

    def read():
        value = loader(index)
        return value if source.get_dtype() == dtype else ops.to_dtype(value, dtype)
    if mask is None:
        return read()
    return ops.masked(mask, read, other)


def make_output(x, dtype, size, inner_fn, origin):
    origins = tuple(dict.fromkeys(origins_of([x]) + (origin,)))
    return TensorBox.create(Pointwise(x.get_device(), dtype, inner_fn, sym.sizes_of(size), origins=origins))


class Window:
    """The window of one pooling op over the trailing ``len(kernel)`` dims of ``in_size``."""

    def __init__(self, in_size, out_size, kernel, stride, padding, dilation):
        self.spatial = len(kernel)
        self.in_size = sym.sizes_of(in_size[-self.spatial:])
        self.out_size = sym.sizes_of(out_size[-self.spatial:])
        self.kernel, self.stride, self.padding, self.dilation = kernel, stride, padding, dilation
        if any(2 * p > (k - 1) * dl + 1 for p, k, dl in zip(padding, kernel, dilation)):
            raise Unsupported("padding larger than half the window")   # (eager rejects it too)

    def count(self):
        return math.prod(self.kernel)

    def positions(self, out_index):
        """(input index, in-bounds mask or None, flat position within the plane) for each
        window position, in eager's order (first dim outermost)."""
        lead = list(out_index[:-self.spatial])
        spatial = out_index[-self.spatial:]
        for offsets in itertools.product(*[range(k) for k in self.kernel]):
            index, masks = [], []
            for d, (o, k) in enumerate(zip(spatial, offsets)):
                start = k * self.dilation[d] - self.padding[d]
                first, last = start, (self.out_size[d] - 1) * self.stride[d] + start
                index.append(o * self.stride[d] + start)
                masks.append(in_range(index[-1], 0 if first < 0 else None,
                                      self.in_size[d] if may_reach(last, self.in_size[d]) else None))
            flat = sum((i * st for i, st in zip(index, sym.contiguous_strides(self.in_size))), sympy.Integer(0))
            yield lead + index, all_of(masks), flat

    def covering_outputs(self, in_index):
        """For a backward: (output index, mask that it exists) for every output whose
        window may cover ``in_index``: o = (i + padding) // stride - t, t small."""
        lead = list(in_index[:-self.spatial])
        spatial = in_index[-self.spatial:]
        per_dim = []
        for d, i in enumerate(spatial):
            extent = (self.kernel[d] - 1) * self.dilation[d] + 1
            s, p, n_out = self.stride[d], self.padding[d], self.out_size[d]
            top = sym.FloorDiv(i + p, sympy.Integer(s))
            lowest, highest = p // s, sym.FloorDiv(self.in_size[d] - 1 + p, sympy.Integer(s))   # the range of top
            options = []
            for t in range(-(-extent // s)):
                options.append((top - t, in_range(top - t, 0 if lowest - t < 0 else None,
                                                  n_out if may_reach(highest - t, n_out) else None)))
            per_dim.append(options)
        for combo in itertools.product(*per_dim):
            yield lead + [o for o, _ in combo], all_of([m for _, m in combo])

    def covering_count(self):
        return math.prod(-(-((k - 1) * dl + 1) // s) for k, dl, s in zip(self.kernel, self.dilation, self.stride))


def forward_window(x, out_shape, kernel_size, stride, padding, dilation, spatial, integers=False):
    """The window of a pool of ``x``, checked to unroll; ``x`` realized if costly to re-read."""
    check_input(x, spatial, integers)
    kernel = _ntuple(kernel_size, spatial)
    window = Window(x.get_size(), list(out_shape), kernel, _ntuple(stride, spatial, kernel),
                    _ntuple(padding, spatial, 0), _ntuple(dilation, spatial, 1))
    if window.count() > MAX_WINDOW:
        raise Unsupported(f"window of {window.count()} elements (more than {MAX_WINDOW}: aten is better)")
    realize_if_costly(x)
    return window


def backward_window(grad, x, kernel_size, stride, padding, dilation, spatial):
    """The window of the pool whose gradient ``grad`` is, checked to unroll its gather."""
    check_input(x, spatial)
    kernel = _ntuple(kernel_size, spatial)
    window = Window(x.get_size(), list(grad.get_size()), kernel, _ntuple(stride, spatial, kernel),
                    _ntuple(padding, spatial, 0), _ntuple(dilation, spatial, 1))
    if window.covering_count() > MAX_WINDOW:
        raise Unsupported(f"{window.covering_count()} outputs per input element (more than {MAX_WINDOW})")
    if window.covering_count() > 1:
        # each input element gathers the gradient of every output covering it: a gradient
        # still unrealized (a residual block's sum of branches, relu masks) would be
        # recomputed, all its loads, once per covering output
        realize_if_costly(grad)
    return window


# ---- max pooling ------------------------------------------------------------------------

def window_max(x, positions, acc):
    """The max over window ``positions`` ((input index, in-bounds mask or None, flat position)
    in eager's order; the first always exists): NaN wins, as in eager."""
    best = None
    for src, mask, _ in positions:
        value = masked_read(x, src, mask, acc, float("-inf"))
        best = value if best is None else ops.maximum(best, value)
    return best


def window_argmax(x, positions, acc):
    """The flat position of the max over ``positions`` by eager's rule: the first in-bounds
    position, then any greater value or any NaN."""
    # ``found``: whether an in-bounds position was seen (None: certainly, so far)
    best = position = found = None
    for src, mask, flat in positions:
        value = masked_read(x, src, mask, acc, float("-inf"))
        here = ops.index_expr(flat, torch.int64)
        if best is None:
            best, position, found = value, here, mask
            continue
        take = ops.logical_or(ops.gt(value, best), ops.isnan(value))
        if found is not None:
            take = ops.logical_or(take, ops.logical_not(found))
        if mask is not None:
            take = ops.logical_and(mask, take)
            found = None if found is None else ops.logical_or(found, mask)
        else:
            found = None
        best = ops.where(take, value, best)
        position = ops.where(take, here, position)
    return position


def _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, spatial):
    values_meta, _ = _meta()
    window = forward_window(x, values_meta.shape, kernel_size, stride, padding, dilation, spatial)
    dtype = x.get_dtype()
    acc = accumulate_dtype(dtype)

    def values(index):
        return ops.to_dtype(window_max(x, window.positions(index), acc), dtype)

    def indices(index):
        return window_argmax(x, window.positions(index), acc)

    size = list(values_meta.shape)
    return (make_output(x, dtype, size, values, "max_pool"),
            make_output(x, torch.int64, size, indices, "max_pool_indices"))


@register_lowering(aten.max_pool2d_with_indices)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 2)


@register_lowering(aten.max_pool3d_with_indices)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 3)


def _max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, spatial):
    window = backward_window(grad, x, kernel_size, stride, padding, dilation, spatial)
    dtype = x.get_dtype()
    acc = accumulate_dtype(dtype)

    def inner_fn(index):
        flat = ops.index_expr(sum((i * st for i, st in zip(index[-spatial:], sym.contiguous_strides(window.in_size))),
                                  sympy.Integer(0)), torch.int64)
        total = None
        for out_index, mask in window.covering_outputs(index):
            chosen = ops.eq(masked_read(indices, out_index, mask, torch.int64, -1), flat)
            term = ops.where(chosen, masked_read(grad, out_index, mask, acc), ops.constant(0, acc))
            total = term if total is None else ops.add(total, term)
        return ops.to_dtype(total, dtype)
    return make_output(grad, dtype, list(x.get_size()), inner_fn, "max_pool_backward")


@register_lowering(aten.max_pool2d_with_indices_backward)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, 2)


@register_lowering(aten.max_pool3d_with_indices_backward)
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices, 3)


# ---- average pooling --------------------------------------------------------------------

def _divisor(window, out_spatial, count_include_pad, divisor_override, acc):
    """eager's divide factor for the window of output ``out_spatial`` (an op value)."""
    if divisor_override:
        return ops.constant(divisor_override, acc)
    full = all(p == 0 for p in window.padding) and not any(
        may_reach((o - 1) * s + k - 1, n) for o, s, k, n in zip(window.out_size, window.stride, window.kernel,
                                                                 window.in_size))
    if full:   # every window lies inside the input
        return ops.constant(window.count(), acc)
    count = None
    for d, o in enumerate(out_spatial):
        start = o * window.stride[d] - window.padding[d]
        begin = ops.index_expr(start, torch.int64)
        end = ops.minimum(ops.add(begin, ops.constant(window.kernel[d], torch.int64)),
                          int_value(window.in_size[d] + window.padding[d]))
        if not count_include_pad:
            begin = ops.maximum(begin, ops.constant(0, torch.int64))
            end = ops.minimum(end, int_value(window.in_size[d]))
        length = ops.sub(end, begin)
        count = length if count is None else ops.mul(count, length)
    return ops.to_dtype(count, acc)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, spatial):
    meta = _meta()
    window = forward_window(x, meta.shape, kernel_size, stride, padding, 1, spatial, integers=True)
    dtype = x.get_dtype()
    acc = accumulate_dtype(dtype)

    def inner_fn(index):
        total = None
        for src, mask, _ in window.positions(index):
            value = masked_read(x, src, mask, acc)
            total = value if total is None else ops.add(total, value)
        divisor = _divisor(window, index[-spatial:], count_include_pad, divisor_override, acc)
        if not dtype.is_floating_point:   # int64 (eager's CPU kernel): divided with truncation, as C++ does
            return ops.truncdiv(total, divisor)
        return ops.to_dtype(ops.truediv(total, divisor), dtype)
    return make_output(x, dtype, list(meta.shape), inner_fn, "avg_pool")


@register_lowering(aten.avg_pool2d)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2)


@register_lowering(aten.avg_pool3d)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3)


def _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                       spatial):
    window = backward_window(grad, x, kernel_size, stride, padding, 1, spatial)
    dtype = x.get_dtype()
    acc = accumulate_dtype(dtype)

    def inner_fn(index):
        total = None
        for out_index, mask in window.covering_outputs(index):
            # the output's window must reach this element: i < o * stride - padding + kernel
            reach = all_of([in_range(i - (o * s - p), None, k) for i, o, s, p, k in zip(
                index[-spatial:], out_index[-spatial:], window.stride, window.padding, window.kernel)])
            valid = all_of([mask, reach])
            divisor = _divisor(window, out_index[-spatial:], count_include_pad, divisor_override, acc)
            share = ops.truediv(masked_read(grad, out_index, valid, acc), divisor)
            term = share if valid is None else ops.where(valid, share, ops.constant(0, acc))  # (0 / 0 there)
            total = term if total is None else ops.add(total, term)
        return ops.to_dtype(total, dtype)
    return make_output(grad, dtype, list(x.get_size()), inner_fn, "avg_pool_backward")


@register_lowering(aten.avg_pool2d_backward)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override, 2)


@register_lowering(aten.avg_pool3d_backward)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override, 3)


# ---- adaptive average pooling -----------------------------------------------------------

def _adaptive_bounds(o, in_size, out_size):
    """eager's window of output o: [floor(o * in / out), ceil((o + 1) * in / out))."""
    start = sym.FloorDiv(o * in_size, sympy.Integer(out_size))
    end = sym.FloorDiv((o + 1) * in_size + out_size - 1, sympy.Integer(out_size))
    return start, end


def _adaptive_window(in_size, out_size):
    """The longest window of an adaptive pool along one dim."""
    return max(-(-(o + 1) * in_size // out_size) - o * in_size // out_size for o in range(out_size))


def _adaptive_cover(in_size, out_size):
    """The most windows of an adaptive pool that hold one input position (one dim)."""
    counts = [0] * in_size
    for o in range(out_size):
        for i in range(o * in_size // out_size, -(-(o + 1) * in_size // out_size)):
            counts[i] += 1
    return max(counts)


def _adaptive_widths(in_sp, out_sp):
    widths = [_adaptive_window(i, o) for i, o in zip(in_sp, out_sp)]
    if math.prod(widths) > MAX_WINDOW:
        raise Unsupported(f"adaptive window of up to {math.prod(widths)} elements (more than {MAX_WINDOW})")
    return widths


def _adaptive_positions(index, in_sp, out_sp, widths):
    """(input index, mask or None, flat position in the plane) of each position of output
    ``index``'s adaptive window, in eager's order; a position past the window's end (the
    window is shorter than ``widths``) is masked off. Also the window's element count."""
    spatial = len(in_sp)
    bounds = [_adaptive_bounds(o, i, n) for o, i, n in zip(index[-spatial:], in_sp, out_sp)]
    strides = sym.contiguous_strides(in_sp)
    positions = []
    for offsets in itertools.product(*[range(w) for w in widths]):
        src = [start + t for (start, _), t in zip(bounds, offsets)]
        mask = all_of([in_range(s - end, None, 0) if t > 0 else None
                       for s, (_, end), t in zip(src, bounds, offsets)])
        flat = sum((s * st for s, st in zip(src, strides)), sympy.Integer(0))
        positions.append((list(index[:-spatial]) + src, mask, flat))
    count = None
    for start, end in bounds:
        length = ops.index_expr(end - start, torch.int64)
        count = length if count is None else ops.mul(count, length)
    return positions, count


def _adaptive_avg_pool(x, output_size, spatial):
    from .reductions import mean
    from .views import permute, view
    check_input(x, spatial)
    out_sp = static_sizes(output_size, "adaptive pooling")
    rank = len(x.get_size())
    if all(o == 1 for o in out_sp):   # a global pool (a CNN's head): the mean, for any size
        return mean(x, list(range(rank - spatial, rank)), keepdim=True)
    size = static_sizes(x.get_size(), "adaptive pooling")
    in_sp, lead = size[-spatial:], size[:-spatial]
    if all(i % o == 0 for i, o in zip(in_sp, out_sp)):
        # equal windows that tile the input: a mean over the window dims (a reduction)
        steps = [i // o for i, o in zip(in_sp, out_sp)]
        split = view(x, lead + [v for o, k in zip(out_sp, steps) for v in (o, k)])
        n = len(lead)
        order = list(range(n)) + [n + 2 * d for d in range(spatial)] + [n + 2 * d + 1 for d in range(spatial)]
        return mean(permute(split, order), list(range(n + spatial, n + 2 * spatial)))
    widths = _adaptive_widths(in_sp, out_sp)
    realize_if_costly(x)
    dtype = x.get_dtype()
    acc = accumulate_dtype(dtype)

    def inner_fn(index):
        positions, count = _adaptive_positions(index, in_sp, out_sp, widths)
        total = None
        for src, mask, _ in positions:
            value = masked_read(x, src, mask, acc)
            total = value if total is None else ops.add(total, value)
        return ops.to_dtype(ops.truediv(total, ops.to_dtype(count, acc)), dtype)
    return make_output(x, dtype, lead + out_sp, inner_fn, "adaptive_avg_pool")


def _adaptive_max_pool(x, output_size, spatial):
    """Values and flat in-plane indices (eager's CPU rule: the window's first position, then
    any greater value or NaN); the global and evenly divided cases arrive as amax/argmax and
    max_pool through torch's decomposition, the rest come here."""
    check_input(x, spatial)
    out_sp = static_sizes(output_size, "adaptive pooling")
    size = static_sizes(x.get_size(), "adaptive pooling")
    in_sp, lead = size[-spatial:], size[:-spatial]
    widths = _adaptive_widths(in_sp, out_sp)
    realize_if_costly(x)
    dtype = x.get_dtype()
    acc = accumulate_dtype(dtype)

    def values(index):
        positions, _ = _adaptive_positions(index, in_sp, out_sp, widths)
        return ops.to_dtype(window_max(x, positions, acc), dtype)

    def indices(index):
        positions, _ = _adaptive_positions(index, in_sp, out_sp, widths)
        return window_argmax(x, positions, acc)
    return (make_output(x, dtype, lead + out_sp, values, "adaptive_max_pool"),
            make_output(x, torch.int64, lead + out_sp, indices, "adaptive_max_pool_indices"))


@register_lowering(aten.adaptive_max_pool2d)
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max_pool(x, output_size, 2)


@register_lowering(aten.adaptive_max_pool3d)
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max_pool(x, output_size, 3)


@register_lowering(aten._adaptive_avg_pool2d)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg_pool(x, output_size, 2)


@register_lowering(aten._adaptive_avg_pool3d)
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg_pool(x, output_size, 3)


@register_lowering(aten._adaptive_avg_pool2d_backward)
def adaptive_avg_pool2d_backward(grad, x):
    spatial = 2
    check_input(x, spatial)
    if all(o == 1 for o in grad.get_size()[-spatial:]):
        return _global_avg_pool_backward(grad, x, spatial)
    in_sp = static_sizes(x.get_size()[-spatial:], "adaptive pooling")
    out_sp = static_sizes(grad.get_size()[-spatial:], "adaptive pooling")
    dtype = x.get_dtype()
    acc = accumulate_dtype(dtype)
    # the outputs whose windows hold input i: o in [floor(i * out / in), ceil((i + 1) * out / in))
    widths = [_adaptive_cover(i, o) for i, o in zip(in_sp, out_sp)]
    if math.prod(widths) > MAX_WINDOW:
        raise Unsupported(f"up to {math.prod(widths)} outputs per input element (more than {MAX_WINDOW})")

    def inner_fn(index):
        firsts = [sym.FloorDiv(i * o, sympy.Integer(n)) for i, o, n in zip(index[-spatial:], out_sp, in_sp)]
        total = None
        for offsets in itertools.product(*[range(w) for w in widths]):
            out_index = [f + t for f, t in zip(firsts, offsets)]
            masks, count = [], None
            for i, o, n_in, n_out, t in zip(index[-spatial:], out_index, in_sp, out_sp, offsets):
                start, end = _adaptive_bounds(o, n_in, n_out)
                if t > 0:   # o = first(i) always holds i; later ones may not exist or reach i
                    masks += [in_range(o, None, n_out), in_range(i - start, 0, None), in_range(i - end, None, 0)]
                length = ops.index_expr(end - start, torch.int64)
                count = length if count is None else ops.mul(count, length)
            value = masked_read(grad, list(index[:-spatial]) + out_index, all_of(masks), acc)
            term = ops.truediv(value, ops.to_dtype(count, acc))
            total = term if total is None else ops.add(total, term)
        return ops.to_dtype(total, dtype)
    return make_output(grad, dtype, list(x.get_size()), inner_fn, "adaptive_avg_pool_backward")


def _global_avg_pool_backward(grad, x, spatial):
    """Each input element's share of its plane's single output: grad / (plane size)."""
    dtype = x.get_dtype()
    acc = accumulate_dtype(dtype)
    plane = sym.product(x.get_size()[-spatial:])

    def inner_fn(index):
        value = masked_read(grad, list(index[:-spatial]) + [sympy.Integer(0)] * spatial, None, acc)
        return ops.to_dtype(ops.truediv(value, ops.to_dtype(int_value(plane), acc)), dtype)
    return make_output(grad, dtype, list(x.get_size()), inner_fn, "adaptive_avg_pool_backward")
