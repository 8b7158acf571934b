"""Decompositions written here, for ops whose torch decomposition is missing or keeps an op
tritonfuse cannot lower (a prim such as prims.frexp, a mutation such as copy_ into a view,
or sort + searchsorted). Each is written in aten ops that have lowerings, with eager's
semantics (decompositions.py adds them to the table handed to aot_autograd). A function
returns NotImplemented for a case it leaves to the aten op.

    isin                         compare every element with every test element, any()
    put                          index_put on the flattened tensor
    scatter_reduce / index_reduce  (mean) sum and count by scatter_add / index_add, divide
    as_strided_scatter           index_put at the view's storage positions
    frexp                        exponent from log2, corrected by one; mantissa by two scalings
    mm / bmm with k = 1          the outer product as a broadcast mul
    cat of one tensor repeated   the tensor expanded along a new dim, copied, merged
"""
import torch

aten = torch.ops.aten


# isin compares every pair: above this many pairs (or with sizes known only at run time)
# eager's sort-based kernel does less work, and the op stays aten
ISIN_MAX_PAIRS = 1 << 24


def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """Each element compared with every test element: one reduction (any) per element."""
    if isinstance(elements, torch.Tensor) and isinstance(test_elements, torch.Tensor):
        pairs = elements.numel() * test_elements.numel()
        if not isinstance(pairs, int) or pairs > ISIN_MAX_PAIRS:
            return NotImplemented
    if not isinstance(test_elements, torch.Tensor):        # Tensor_Scalar
        found = elements == test_elements
    elif not isinstance(elements, torch.Tensor):           # Scalar_Tensor
        found = (test_elements == elements).any()
    elif test_elements.numel() == 0:
        found = torch.zeros_like(elements, dtype=torch.bool)
    else:
        dtype = torch.promote_types(elements.dtype, test_elements.dtype)
        found = (elements.to(dtype).unsqueeze(-1) == test_elements.to(dtype).flatten()).any(-1)
    return found.logical_not() if invert else found


def put(self, index, source, accumulate=False):
    """put treats ``self`` as one dim in row-major order (whatever its strides)."""
    flat = self.flatten()
    flat = aten.index_put(flat, [index.flatten()], source.flatten(), accumulate)
    return flat.reshape(self.shape)


def _mean(self, values, include_self, add, clear):
    """ATen's mean of an indirect reduction: the sum of the values landing on an element
    (with ``self``, or from 0 where ``clear`` zeroes the landed-on elements) over their count
    (1 more with ``self``; an element nothing lands on keeps ``self``). ``add(t, v)``
    accumulates ``v`` into ``t`` at the reduction's positions; integers divide by floor."""
    ones = torch.ones_like(values)
    if include_self:
        total = add(self, values)
        counts = add(torch.ones_like(self), ones)
    else:
        total = add(clear(self), values)
        counts = add(torch.zeros_like(self), ones)
        counts = counts.masked_fill(counts == 0, 1)
    if total.dtype.is_floating_point:
        return total / counts
    return torch.div(total, counts, rounding_mode="floor")


def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    if reduce != "mean":
        return NotImplemented
    return _mean(self, src, include_self, add=lambda t, v: t.scatter_add(dim, index, v),
                 clear=lambda t: t.scatter(dim, index, 0))


def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    if reduce != "mean":
        return NotImplemented
    return _mean(self, source, include_self, add=lambda t, v: t.index_add(dim, index, v),
                 clear=lambda t: t.index_fill(dim, index, 0))


def as_strided_scatter(self, src, size, stride, storage_offset=None):
    """``src`` written at the storage positions of ``self.as_strided(size, stride, offset)``
    of a contiguous ``self`` (eager's clone keeps a contiguous layout; others stay aten)."""
    if not self.is_contiguous() or len(size) != src.dim():
        return NotImplemented
    positions = torch.full([], storage_offset or 0, dtype=torch.int64, device=self.device)
    for d, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        positions = positions + torch.arange(n, device=self.device).mul(st).view(shape)
    positions = positions.expand(list(size))
    flat = aten.index_put(self.flatten(), [positions.flatten()], src.flatten())
    return flat.view(self.shape)


def frexp(x):
    """(mantissa in [0.5, 1) with x's sign, exponent) with x = mantissa * 2 ** exponent;
    (x, 0) for 0, inf and NaN, as eager's std::frexp. log2 gives the exponent up to one;
    the mantissa is x scaled twice by 2 ** -(exponent / 2), so neither factor overflows
    at the ends of the range (the largest exponents, subnormals)."""
    if not x.dtype.is_floating_point:
        return NotImplemented
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    value = x.to(compute)
    magnitude = value.abs()
    regular = torch.isfinite(value) & (value != 0)
    safe = torch.where(regular, magnitude, torch.ones_like(magnitude))
    exponent = torch.floor(torch.log2(safe)) + 1
    for _ in range(2):   # log2 rounds: move the mantissa into [0.5, 1)
        mantissa = _scale_by_power_of_two(safe, -exponent)
        exponent = torch.where(mantissa >= 1, exponent + 1, torch.where(mantissa < 0.5, exponent - 1, exponent))
    mantissa = _scale_by_power_of_two(value, -exponent)
    mantissa = torch.where(regular, mantissa, value)
    exponent = torch.where(regular, exponent, torch.zeros_like(exponent))
    return mantissa.to(x.dtype), exponent.to(torch.int32)


def _scale_by_power_of_two(value, power):
    half = torch.trunc(power / 2)
    return value * torch.exp2(half) * torch.exp2(power - half)


def outer_product(a, b):
    """``mm`` / ``bmm`` of a [.., M, 1] and a [.., 1, N] operand (k = 1) as their broadcast
    product, as Inductor decomposes it. Each output is one product rounded once, as the
    GEMM's is. A llama's rotary angles (inv_freq @ positions) were a cuBLAS launch per step
    that the min-cut partitioner never recomputes; as a mul they fuse into their readers."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    if (a.dtype != b.dtype or a.is_complex() or not statically_known_true(a.shape[-1] == 1)
            or not statically_known_true(b.shape[-2] == 1)):
        return NotImplemented
    return a * b


def cat_of_one_tensor(tensors, dim=0):
    """``cat([x, x, ...], dim)`` as ``x`` expanded along a new dim before ``dim``, copied
    and merged with ``dim``, as Inductor's joint-graph passes rewrite it. The min-cut
    partitioner never recomputes through a cat (it fuses into a cat, not out of one), so a
    llama's rotary table ``cat((freqs, freqs), -1)`` was saved for the backward in float32;
    as a copy it is recomputed there from inv_freq and the positions."""
    from torch._prims_common import suggest_memory_format
    if len(tensors) < 2 or any(t is not tensors[0] for t in tensors):
        return NotImplemented
    x = tensors[0]
    if x.dim() == 0 or (x.dim() in (4, 5) and suggest_memory_format(x) != torch.contiguous_format):
        return NotImplemented   # eager's cat keeps a channels-last layout
    d, copies, shape = dim % x.dim(), len(tensors), list(x.shape)
    expanded = x.unsqueeze(d).expand(shape[:d] + [copies] + shape[d:])
    return expanded.clone(memory_format=torch.contiguous_format).view(shape[:d] + [copies * shape[d]] + shape[d + 1:])


def table():
    """{aten overload: decomposition} for decompositions.decomposition_table."""
    return {
        aten.isin.Tensor_Tensor: isin, aten.isin.Tensor_Scalar: isin, aten.isin.Scalar_Tensor: isin,
        aten.put.default: put,
        aten.scatter_reduce.two: scatter_reduce,
        aten.index_reduce.default: index_reduce,
        aten.as_strided_scatter.default: as_strided_scatter,
        aten.frexp.Tensor: frexp,
        aten.mm.default: outer_product,
        aten.bmm.default: outer_product,
        aten.cat.default: cat_of_one_tensor,
    }
