"""tril_indices / triu_indices: the 2 x N coordinates (row, column) of a matrix's lower or
upper triangle, row by row, as one pointwise kernel over the element's linear index i.

The rows that hold elements form at most two runs (``_RowRun``): a run of full rows (each
``col`` long) and a run whose lengths grow (tril) or shrink (triu) by one per row. Within a
run whose first row is m long and whose lengths change by s per row, row k starts at

    start(k) = k m + s k (k - 1) / 2,

so the row of the j-th element of the run is the root of a quadratic: k = floor(s (sqrt(b^2
+ 2 s j) - b)) with b = m - s / 2, taken in float64 and then corrected by one row either way
with start() in int64, which makes it exact. The column is j - start(k), plus where the row's
columns begin (row + offset in triu's shrinking run). The sizes are static.
"""
from dataclasses import dataclass

import torch

from ..ir import Pointwise, TensorBox
from ..virtualized import ops
from .registry import Unsupported, aten, register_lowering, static_sizes
from .tensor_ops import _meta


@dataclass(frozen=True)
class _RowRun:
    first_row: int
    rows: int
    first_length: int
    slope: int                 # how the length changes from one row to the next: 0, 1 or -1
    first_element: int         # the linear index of the run's first element
    columns_from_diagonal: bool  # a row's columns start at row + offset (else at 0)

    @property
    def size(self) -> int:
        return self.rows * self.first_length + self.slope * self.rows * (self.rows - 1) // 2


def _runs(spans):
    """_RowRuns from (first_row, end_row, first_length, slope, columns_from_diagonal),
    empty ones left out, numbered by their first elements."""
    runs, element = [], 0
    for first_row, end_row, first_length, slope, from_diagonal in spans:
        if end_row > first_row:
            run = _RowRun(first_row, end_row - first_row, first_length, slope, element, from_diagonal)
            runs.append(run)
            element += run.size
    return runs


def tril_runs(row, col, offset):
    """Row r holds columns 0 .. min(r + offset, col - 1): rows from max(0, -offset) grow
    by one until they are col long."""
    if row == 0 or col == 0:
        return []
    first = max(0, -offset)
    full = min(max(col - offset - 1, first), row)      # the first row that is col long
    return _runs([(first, full, first + offset + 1, 1, False), (max(full, first), row, col, 0, False)])


def triu_runs(row, col, offset):
    """Row r holds columns max(0, r + offset) .. col - 1: the rows with r + offset <= 0 are
    full, the next ones shrink by one until none is left."""
    if row == 0 or col == 0:
        return []
    full_end = min(max(1 - offset, 0), row)
    end = min(max(col - offset, full_end), row)
    return _runs([(0, full_end, col, 0, False), (full_end, end, col - full_end - offset, -1, True)])


def _c(value):
    return ops.constant(value, torch.int64)


def _plus(x, value: int):
    if value == 0:
        return x
    return ops.add(x, _c(value)) if value > 0 else ops.sub(x, _c(-value))


def _times(x, value: int):
    return x if value == 1 else ops.mul(x, _c(value))


def _row_start(run, k):
    """The linear index within the run where its row k begins (int64)."""
    start = _times(k, run.first_length)
    if run.slope:
        triangle = ops.truncdiv(ops.mul(k, _plus(k, -1)), _c(2))
        start = ops.add(start, triangle) if run.slope > 0 else ops.sub(start, triangle)
    return start


def _row_in_run(run, j):
    """The run's row k that holds its j-th element (0 <= j < run.size)."""
    if run.slope == 0:
        return ops.truncdiv(j, _c(run.first_length))
    b = run.first_length - run.slope / 2
    twice_j = ops.mul(ops.constant(2.0, torch.float64), ops.to_dtype(j, torch.float64))
    b_squared = ops.constant(b * b, torch.float64)
    b = ops.constant(b, torch.float64)
    if run.slope > 0:
        estimate = ops.sub(ops.sqrt(ops.add(b_squared, twice_j)), b)
    else:
        estimate = ops.sub(b, ops.sqrt(ops.sub(b_squared, twice_j)))
    k = ops.to_dtype(ops.floor(estimate), torch.int64)
    # float64's rounding may put the estimate one row off either way
    k = ops.sub(k, ops.to_dtype(ops.gt(_row_start(run, k), j), torch.int64))
    return ops.add(k, ops.to_dtype(ops.le(_row_start(run, _plus(k, 1)), j), torch.int64))


def _coordinates(run, position, offset):
    """(row, column) of the element at ``position`` (int64), were it in ``run``."""
    j = _plus(position, -run.first_element)
    j = ops.maximum(ops.minimum(j, _c(run.size - 1)), _c(0))   # other runs' elements: kept in range
    k = _row_in_run(run, j)
    row = _plus(k, run.first_row)
    column = ops.sub(j, _row_start(run, k))
    if run.columns_from_diagonal:
        column = ops.add(column, _plus(row, offset))
    return row, column


def _indices(runs, offset, meta):
    if meta.dtype not in (torch.int32, torch.int64):
        raise Unsupported(f"{meta.dtype} indices")
    size = sum(run.size for run in runs)

    def inner_fn(index):
        which, element = index
        position = ops.index_expr(element, torch.int64)
        row, column = _coordinates(runs[0], position, offset)
        for run in runs[1:]:
            in_run = ops.ge(position, _c(run.first_element))
            run_row, run_column = _coordinates(run, position, offset)
            row, column = ops.where(in_run, run_row, row), ops.where(in_run, run_column, column)
        value = ops.where(ops.eq(ops.index_expr(which, torch.int64), _c(0)), row, column)
        return ops.to_dtype(value, meta.dtype)

    if not runs:
        inner_fn = lambda index: ops.constant(0, meta.dtype)   # noqa: E731  (no elements)
    return TensorBox.create(Pointwise(meta.device, meta.dtype, inner_fn, [2, size], origins=("trilu_indices",)))


@register_lowering(aten.tril_indices)
def tril_indices(row, col, offset=0, **kwargs):
    row, col, offset = static_sizes([row, col, offset], "tril_indices")
    return _indices(tril_runs(row, col, offset), offset, _meta())


@register_lowering(aten.triu_indices)
def triu_indices(row, col, offset=0, **kwargs):
    row, col, offset = static_sizes([row, col, offset], "triu_indices")
    return _indices(triu_runs(row, col, offset), offset, _meta())
