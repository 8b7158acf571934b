"""Split reductions: a reduction with too few outputs to fill a GPU is computed in two.

``x.sum()`` of 3M elements has one output: one Triton program would walk all of it while
every other SM idles. Split in two reductions instead:

    stage 1   partial[s, x] = reduce(input[x, r] for r in chunk s)    (split x outputs)
    stage 2   out[x]        = reduce(partial[s, x] for s in splits)   (tiny)

Only for reductions whose partial results combine exactly as the whole would (sum, prod,
max, min, any, all), and only on backends that ask for it: the C++ backend splits work
among its threads inside one kernel instead.
"""
import sympy

from .. import sym
from ..codegen.registry import split_reduction_target
from ..ir import Reduction, StorageBox, TensorBox
from ..ops_table import reduction_identity
from ..virtualized import ops
import torch

SPLITTABLE = ("sum", "prod", "max", "min", "any", "all")
MIN_REDUCTION = 4096        # elements per output below which one program is fast enough
MIN_CHUNK = 1024            # elements per program of stage 1
MAX_SPLIT = 1024
OUTER_X_PER_PROGRAM = 32    # outputs per program of an outer reduction (runtime heuristics)


def num_splits(device: torch.device, reduction_type: str, x_numel: int, r_numel: int, outer: bool) -> int:
    """How many chunks to cut the reduction into (1: do not split)."""
    target = split_reduction_target(device)   # programs the device wants in flight; 0: never split
    if not target or reduction_type not in SPLITTABLE or r_numel < MIN_REDUCTION:
        return 1
    programs = max(1, x_numel // OUTER_X_PER_PROGRAM) if outer else x_numel
    if programs * 2 > target:
        return 1
    want = min(-(-target // programs), r_numel // MIN_CHUNK, MAX_SPLIT)
    if want < 2:
        return 1
    for split in range(want, max(2, want // 2) - 1, -1):   # a divisor of r_numel needs no mask
        if r_numel % split == 0:
            return split
    return want


def build_reduction(device, dtype, src_dtype, inner_fn, ranges, reduction_ranges, reduction_type, origins,
                    outer: bool) -> TensorBox:
    """The realized reduction ``inner_fn`` over ``reduction_ranges`` for each index of
    ``ranges``: one Reduction, or the two stages of a split one when ``num_splits`` asks."""
    split = num_splits(device, reduction_type, sym.hint(sym.product(ranges)),
                       sym.hint(sym.product(reduction_ranges)), outer)   # speed only: example sizes
    if split > 1:
        return _split_reduction(device, dtype, src_dtype, inner_fn, ranges, reduction_ranges, reduction_type,
                                origins, split, outer)
    return TensorBox(_realized(Reduction(device, dtype, inner_fn, list(ranges), origins=origins,
                                         reduction_ranges=list(reduction_ranges), reduction_type=reduction_type,
                                         src_dtype=src_dtype)))


def _realized(reduction: Reduction) -> StorageBox:
    box = StorageBox(reduction)
    box.realize()
    return box


def _split_reduction(device, dtype, src_dtype, inner_fn, ranges, reduction_ranges, reduction_type, origins,
                    split: int, outer: bool) -> TensorBox:
    """The two-stage form of ``Reduction(inner_fn, ranges, reduction_ranges)``. Stage 1
    keeps its partials in ``src_dtype``, the dtype the reduction accumulates in (callers
    pass float32 for half inputs, int64 for integer sums); for an outer reduction the
    split is its outermost dim, so stage 1 writes contiguous rows."""
    r_numel = sympy.expand(sym.product(reduction_ranges))
    if sym.is_static(r_numel):
        chunk = sympy.Integer(-(-sym.to_int(r_numel) // split))
        exact = sym.same_size(chunk * split, r_numel)
    else:   # symbolic: chunks of ceil(r / split), the last one masked
        chunk, exact = sym.FloorDiv(r_numel + split - 1, sympy.Integer(split)), False
    identity = reduction_identity(reduction_type, src_dtype)

    def partial_fn(index, rindex):
        s, kept = (index[0], index[1:]) if outer else (index[-1], index[:-1])
        flat = s * chunk + rindex[0]
        rindices = sym.unflatten(flat, reduction_ranges)
        if exact:
            return inner_fn(kept, rindices)
        inside = ops.lt(ops.index_expr(flat, torch.int64), ops.index_expr(r_numel, torch.int64))
        return ops.masked(inside, lambda: inner_fn(kept, rindices), identity)

    split_size = sympy.Integer(split)
    partial_ranges = [split_size, *ranges] if outer else [*ranges, split_size]
    partials = _realized(Reduction(device, src_dtype, partial_fn, partial_ranges, origins=origins,
                                   reduction_ranges=[chunk], reduction_type=reduction_type,
                                   src_dtype=src_dtype))
    load_partial = partials.make_loader()

    def combine_fn(index, rindex):
        return load_partial([rindex[0], *index] if outer else [*index, rindex[0]])

    return TensorBox(_realized(Reduction(device, dtype, combine_fn, list(ranges), origins=origins,
                                         reduction_ranges=[split_size], reduction_type=reduction_type,
                                         src_dtype=src_dtype)))
