"""Max pooling's indices kept as int8 window offsets between forward and backward.

``max_pool2d_with_indices`` gives an int64 index into the input plane for every output
element, and a training graph saves them for the backward: a ResNet stem's pooled map
(32 x 64 x 56 x 56) makes 51 MB of indices, where the window position of the maximum
(0..8 for a 3x3 window) fits in one byte. As Inductor does (its low-memory max pool), the
decomposition below rewrites the op before aot_autograd partitions the graph:

    values, indices = max_pool2d_with_indices(x, ...)          (the op, traced as is)
    offsets  = window position of indices, as int8              (pointwise)
    restored = input index of offsets                           (pointwise, from iotas)
    return values, restored

``restored`` equals ``indices``, and it is pointwise in ``offsets``: the min-cut
partitioner saves the 1-byte offsets and recomputes the indices in the backward, where
they fuse into the max-pool backward's kernel. In the forward, ``indices`` feeds only the
offsets, so the pooling kernel stores int8 instead of int64.
"""
import threading

import torch

aten = torch.ops.aten
_tracing = threading.local()


def _pair(value, default=None):
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return default
    if isinstance(value, int):
        return (value, value)
    return tuple(value) * 2 if len(value) == 1 else tuple(value)


def max_pool2d_with_offsets(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """The decomposition of ``aten.max_pool2d_with_indices`` (see the module's doc)."""
    from .lowering.pooling import MAX_WINDOW
    kernel = _pair(kernel_size)
    steps, pads, dilations = _pair(stride, kernel), _pair(padding), _pair(dilation)
    if getattr(_tracing, "inside", False) or kernel[0] * kernel[1] > MAX_WINDOW or x.dim() not in (3, 4):
        # the op itself, traced as it is: larger windows stay aten's
        return NotImplemented
    _tracing.inside = True
    try:
        values, indices = aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation,
                                                               ceil_mode)
    finally:
        _tracing.inside = False
    width = x.shape[-1]
    rows = torch.arange(indices.shape[-2], device=x.device, dtype=torch.int64).view(-1, 1)
    cols = torch.arange(indices.shape[-1], device=x.device, dtype=torch.int64).view(1, -1)
    row_base = rows * steps[0] - pads[0]
    col_base = cols * steps[1] - pads[1]
    # the window position whose input index the op chose: compared with each position's
    # index, no division by the width (a symbolic width would make the division's zero
    # check part of every kernel)
    offsets = torch.zeros_like(indices, dtype=torch.int8)
    for row in range(kernel[0]):
        for col in range(kernel[1]):
            position = (row_base + row * dilations[0]) * width + col_base + col * dilations[1]
            offsets = torch.where(indices == position, row * kernel[1] + col, offsets)
    # the window row of each offset by comparisons rather than a division: offsets lie in
    # [0, kernel[0] * kernel[1]), and an integer division (floor semantics: a sign fix-up,
    # then the remainder's) in 64-bit lanes made the C++ backward of a 3x3 pool spend most
    # of its time decoding them
    wide = offsets.to(torch.int64)
    window_row = torch.zeros_like(wide) if kernel[0] == 1 else None
    for row in range(1, kernel[0]):   # +1 for each row past the first that the offset reaches
        reached = (wide >= row * kernel[1]).to(torch.int64)
        window_row = reached if window_row is None else window_row + reached
    window_col = wide - window_row * kernel[1]
    restored = (row_base + window_row * dilations[0]) * width + col_base + window_col * dilations[1]
    return values, restored


def table() -> dict:
    return {aten.max_pool2d_with_indices.default: max_pool2d_with_offsets}
