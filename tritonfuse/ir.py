"""The loop-level IR.

A lowered value is a ``TensorBox`` whose data is a ``StorageBox`` (owning a computation or
a buffer) or a view of another value. A computation is ``Pointwise`` or ``Reduction``: an
``inner_fn`` closure from sympy indices to an ``ops`` value, plus its ranges. Realizing a
``StorageBox`` turns its computation into a ``ComputedBuffer`` that the scheduler sees.

    TensorBox ─► StorageBox ─► Pointwise | Reduction          (not yet materialized)
                             └► ComputedBuffer | InputBuffer | FallbackOutput
              ─► ReinterpretView(buffer, layout)               (strided view, no data moved)
              ─► GenericView(value, size, reindex)             (any index remapping)

A ``cat`` of costly inputs that only a matmul, a fallback or the output reads computes each
input into its slice of the cat's memory (``ConcatSlice``, one buffer per input).

``Scan`` is a computation over rows like a reduction that stores every prefix. A
``Scatter`` writes indirectly into a buffer made for it; its ``MutationBuffer`` is that
buffer after the writes. An ``InputMutation`` is a ``MutationBuffer`` whose computation
writes a graph input's new value into the input's memory.

A ``TemplateBuffer`` is computed by a kernel template instead of a loop body (a matmul
under max-autotune): lowering creates it realized; its pointwise consumers may fuse into
the template's store.
"""
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import sympy
import torch

from . import sym
from .virtualized import ops


@dataclass
class Layout:
    device: torch.device
    dtype: torch.dtype
    size: List[sympy.Expr]
    stride: List[sympy.Expr]
    offset: sympy.Expr = sympy.Integer(0)

    @staticmethod
    def contiguous(device, dtype, size) -> "Layout":
        size = [sym.sint(s) for s in size]
        return Layout(device, dtype, size, sym.contiguous_strides(size))

    def index(self, indices) -> sympy.Expr:
        assert len(indices) == len(self.size), (indices, self.size)
        expr = self.offset
        for idx, size, stride in zip(indices, self.size, self.stride):
            if size != 1:
                expr = expr + idx * stride
        return sym.simplify_index(expr)

    def numel(self) -> sympy.Expr:
        return sym.product(self.size)

    def storage_size(self) -> sympy.Expr:
        """Elements of storage the layout touches (offset included)."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return sympy.expand(self.offset + sum((s - 1) * st for s, st in zip(self.size, self.stride)) + 1)

    def int_size(self):
        return tuple(sym.to_int(s) for s in self.size)

    def int_stride(self):
        return tuple(sym.to_int(s) for s in self.stride)

    def is_static(self) -> bool:
        return all(sym.is_static(v) for v in (*self.size, *self.stride, self.offset))


class IRNode:
    def get_size(self) -> List[sympy.Expr]:
        raise NotImplementedError

    def get_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def get_device(self) -> torch.device:
        raise NotImplementedError

    def make_loader(self) -> Callable:
        raise NotImplementedError

    def numel(self) -> sympy.Expr:
        return sym.product(self.get_size())


# ---- computations ---------------------------------------------------------------------

@dataclass
class Loops(IRNode):
    device: torch.device
    dtype: torch.dtype
    inner_fn: Callable
    ranges: List[sympy.Expr]
    origins: tuple = ()   # names of the aten ops this computation came from

    def get_size(self):
        return self.ranges

    def get_dtype(self):
        return self.dtype

    def get_device(self):
        return self.device


class Pointwise(Loops):
    def make_loader(self):
        return self.inner_fn


@dataclass
class Reduction(Loops):
    reduction_ranges: List[sympy.Expr] = field(default_factory=list)
    reduction_type: str = "sum"
    src_dtype: torch.dtype = torch.float32

    def make_loader(self):
        raise AssertionError("reductions are realized before anyone reads them")


@dataclass
class Scan(Loops):
    """An inclusive scan along dim ``axis``: out[.., i, ..] = in[.., 0, ..] + .. + in[.., i, ..]
    for the combine op ``scan_type`` (ops_table.SCAN_TYPES). ``ranges`` are the other dims
    (the rows), ``scan_ranges`` the scanned one; ``inner_fn`` takes an index over the full
    shape. Scheduled like a reduction over rows of ``scan_ranges`` elements, each of which
    is stored."""
    scan_ranges: List[sympy.Expr] = field(default_factory=list)
    axis: int = 0
    scan_type: str = "sum"

    def get_size(self):
        return self.full_index(self.ranges, self.scan_ranges)

    def full_index(self, xvars, rvars):
        xvars = list(xvars)
        return xvars[:self.axis] + list(rvars) + xvars[self.axis:]

    def make_loader(self):
        raise AssertionError("scans are realized before anyone reads them")


@dataclass
class Scatter(Loops):
    """Indirect writes: for every index of ``ranges`` (the source's shape), ``inner_fn(index)``
    goes to element ``output_indexer(index)`` (an index over the target's dims) of the
    buffer a ``MutationBuffer`` writes into. ``mode`` None is a plain store (of several
    writes to one element the last in row-major order wins, where a backend can say);
    otherwise one of ops_table.SCATTER_MODES combines the value with the element."""
    output_indexer: Callable = None
    mode: Optional[str] = None

    def make_loader(self):
        raise AssertionError("a scatter is read through the buffer it writes")


# ---- buffers --------------------------------------------------------------------------

@dataclass
class Buffer(IRNode):
    name: str
    layout: Layout

    def get_size(self):
        return self.layout.size

    def get_dtype(self):
        return self.layout.dtype

    def get_device(self):
        return self.layout.device

    def make_loader(self):
        name, layout = self.name, self.layout

        def loader(index):
            return ops.load(name, layout.index(index))
        return loader


class InputBuffer(Buffer):
    """A graph input (placeholder) or a constant tensor of the graph."""


@dataclass
class ComputedBuffer(Buffer):
    data: Loops = None

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def is_scan(self) -> bool:
        return isinstance(self.data, Scan)

    def iteration_sizes(self):
        """(x sizes, r sizes) of the loop nest that computes this buffer."""
        if isinstance(self.data, Reduction):
            return list(self.data.ranges), list(self.data.reduction_ranges)
        if isinstance(self.data, Scan):
            return list(self.data.ranges), list(self.data.scan_ranges)
        return list(self.data.ranges), []

    def run_body(self, xvars, rvars):
        """``body`` for loop variables split into row (x) and reduced/scanned (r) parts:
        a pointwise node fused into a reduction kernel walks both as one index."""
        if isinstance(self.data, (Reduction, Scan)):
            self.body(xvars, rvars)
        else:
            self.body(list(xvars) + list(rvars), [])

    def body(self, xvars, rvars):
        """Run the computation for one point of the loop nest through ``ops``."""
        data = self.data
        if isinstance(data, Reduction):
            value = data.inner_fn(xvars, rvars)
            reduced = ops.reduction(data.dtype, data.src_dtype, data.reduction_type, value)
            ops.store_reduction(self.name, self.layout.index(xvars), reduced)
        elif isinstance(data, Scan):
            index = data.full_index(xvars, rvars)
            scanned = ops.scan(data.dtype, data.scan_type, data.inner_fn(index))
            ops.store(self.name, self.layout.index(index), scanned)
        else:
            ops.store(self.name, self.layout.index(xvars), data.inner_fn(xvars))


@dataclass
class MutationBuffer(ComputedBuffer):
    """The result of a ``Scatter`` into ``target``: the target's memory once the scatter has
    written into it. Its own name makes every reader depend on the scatter; the wrapper
    binds that name to the target's tensor (no new memory). The target is a buffer made
    for this scatter alone (a copy of the op's input, or a fill), so nothing else reads it:
    the scheduler orders the scatter after the target's producer and fuses it with neither
    that producer nor its own readers (other programs of the kernel write where they read)."""
    target: Buffer = None

    def body(self, xvars, rvars):
        data = self.data
        index = self.layout.index(data.output_indexer(list(xvars) + list(rvars)))
        ops.store_scatter(self.name, index, data.inner_fn(list(xvars) + list(rvars)), data.mode)


class InputMutation(MutationBuffer):
    """A graph input written in place (aot_autograd's ``copy_(input, value)``, kept in the
    graph: batch norm's running statistics, ``x.add_(1)``, a KV-cache update): ``data``
    computes the new value element by element and stores it in the input's own layout
    (its strides; the tensor passed in carries its storage offset). The scheduler orders
    every read of the old value before it (scheduler.py: ``written_input``)."""

    def body(self, xvars, rvars):
        ComputedBuffer.body(self, xvars, rvars)


@dataclass
class ConcatSlice(ComputedBuffer):
    """One input of a ``cat`` computed straight into its slice of the cat's memory (as
    Inductor's ConcatKernel does): ``data`` iterates the input's own sizes, and element
    ``i`` is stored at ``i`` shifted by ``start`` along ``dim`` of ``layout``, the whole
    cat's layout. The first slice's buffer is the cat's memory (allocated at the whole
    size); each later slice is bound to it through ``previous`` (the slice written before,
    a dependency, as a scatter's target is), and the last one is the cat's value: its
    readers depend on every slice. Slices write disjoint elements, so two of equal sizes
    may share a kernel, and no slice is ever kept out of memory (scheduler.py)."""
    dim: int = 0
    start: sympy.Expr = sympy.Integer(0)
    previous: Optional["ConcatSlice"] = None

    def body(self, xvars, rvars):
        index = list(xvars)
        index[self.dim] = index[self.dim] + self.start
        ops.store(self.name, self.layout.index(index), self.data.inner_fn(list(xvars)))


def memory_target(buffer: Buffer) -> Optional[Buffer]:
    """The buffer whose memory ``buffer`` writes into and is bound to (no memory of its own):
    a scatter's target, a later cat slice's previous slice; None for a buffer with its own."""
    if isinstance(buffer, MutationBuffer):
        return buffer.target
    if isinstance(buffer, ConcatSlice):
        return buffer.previous
    return None


def concat_into_slices(inputs, loaders, starts, dim: int, layout: Layout, origins: tuple) -> "TensorBox":
    """The cat of ``inputs`` (read through ``loaders``, which cast to the cat's dtype; each
    starting at its entry of ``starts`` along ``dim``) in ``layout``: each input computed
    (or copied) into its slice, ``ConcatSlice`` by ``ConcatSlice``."""
    from .graph import current_graph
    graph = current_graph()
    previous = None
    for value, loader, start in zip(inputs, loaders, starts):
        data = Pointwise(layout.device, layout.dtype, loader, list(value.get_size()),
                         origins=origins_of([value]) + origins)
        previous = ConcatSlice(name=None, layout=layout, data=data, dim=dim, start=start, previous=previous)
        graph.register_buffer(previous)
    return TensorBox(StorageBox(previous))


def mutate(target: Buffer, scatter: Scatter) -> "TensorBox":
    """Schedule ``scatter`` to write into ``target``; the value ``target`` holds afterwards."""
    from .graph import current_graph
    buffer = MutationBuffer(name=None, layout=target.layout, data=scatter, target=target)
    current_graph().register_buffer(buffer)
    return TensorBox(StorageBox(buffer))


@dataclass
class MatmulTemplate:
    """``out[b, m, n] = sum over k of a[b, m, k] * b[b, k, n]``, accumulated in float32 and
    rounded once to ``dtype``: what a GEMM template kernel computes (lowering/matmul.py).
    ``a`` and ``b`` are buffers or strided views, [M, K] and [K, N] for an mm (batch 1),
    [batch, M, K] and [batch, K, N] for a bmm; ``config`` is the launch config (blocks,
    warps, stages) that the choice step picked for these sizes, ``timings`` what it
    measured against the aten op ``aten_op`` (the code generator decides with them once it
    knows whether an epilogue fused). ``addmm``: (bias, beta, alpha) of an addmm, whose
    bias the template's consumers add; where aten runs it, aten.addmm adds it instead."""
    device: torch.device
    dtype: torch.dtype
    a: IRNode
    b: IRNode
    batch: int
    m: int
    n: int
    k: int
    allow_tf32: bool
    aten_op: object
    config: object = None
    timings: object = None
    addmm: tuple = None
    origins: tuple = ()

    @property
    def operand_names(self):
        """The buffers that ``a`` and ``b`` read (one, for ``x @ x.t()``, named twice)."""
        return _buffer_name(self.a), _buffer_name(self.b)

    def operand_reads(self, xvars):
        """(buffer name, index) of the operand elements that output element ``xvars``
        starts from (at k = 0; the template walks k): for dependency analysis."""
        k = sympy.Symbol("k", integer=True, nonnegative=True)
        b, m, n = ([sympy.Integer(0)] + list(xvars))[-3:]
        batch = [b] if len(self.a.get_size()) == 3 else []
        a_name, b_name = self.operand_names
        return [(a_name, self.a.layout.index(batch + [m, k])), (b_name, self.b.layout.index(batch + [k, n]))]


@dataclass
class TemplateBuffer(ComputedBuffer):
    """A buffer computed by a kernel template; ``data`` describes it (``MatmulTemplate``)
    for the backend that renders the template. Dependency analysis sees it read its
    operands and write each of its elements once."""

    def is_reduction(self) -> bool:
        return False

    def iteration_sizes(self):
        return list(self.layout.size), []

    def body(self, xvars, rvars):
        """Records the template's reads and write (for the scheduler); the template's own
        code comes from its backend, never from this body."""
        for name, index in self.data.operand_reads(xvars):
            ops.load(name, index)
        ops.store(self.name, self.layout.index(xvars), None)


def _buffer_name(value) -> str:
    return value.buffer.name if isinstance(value, ReinterpretView) else value.name


@dataclass
class FallbackKernel:
    """An aten op run as-is inside the compiled graph. ``args``/``kwargs`` hold IR values
    (realized to buffers or strided views) wherever the op takes tensors."""
    name: str
    op: object
    args: tuple
    kwargs: dict
    outputs: list = field(default_factory=list)   # FallbackOutput, in result order
    reason: str = ""
    scalar_outputs: list = field(default_factory=list)   # (size symbol, path): scalars it returns

    def input_buffers(self):
        found = []

        def visit(value):
            if isinstance(value, (list, tuple)):
                for item in value:
                    visit(item)
            elif isinstance(value, Buffer):
                found.append(value.name)
            elif isinstance(value, ReinterpretView):
                found.append(value.buffer.name)
        visit(self.args)
        visit(list(self.kwargs.values()))
        return found

    def written_buffers(self):
        """The graph inputs the op writes into (its schema marks the argument written,
        as ``copy_``'s self), as buffer names."""
        schema = getattr(self.op, "_schema", None)
        if schema is None:
            return []
        written = []
        for position, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = self.args[position] if position < len(self.args) else self.kwargs.get(argument.name)
            buffer = value.buffer if isinstance(value, ReinterpretView) else value
            if isinstance(buffer, InputBuffer):
                written.append(buffer.name)
        return written


@dataclass
class FallbackOutput(Buffer):
    kernel: FallbackKernel = None
    path: tuple = ()      # how to pick this tensor out of the op's result, e.g. (0,)


# ---- views ----------------------------------------------------------------------------

@dataclass
class ReinterpretView(IRNode):
    """A buffer seen through another strided layout (transpose, slice, expand...)."""
    buffer: Buffer
    layout: Layout

    def get_size(self):
        return self.layout.size

    def get_dtype(self):
        return self.layout.dtype

    def get_device(self):
        return self.layout.device

    def make_loader(self):
        name, layout = self.buffer.name, self.layout

        def loader(index):
            return ops.load(name, layout.index(index))
        return loader


@dataclass
class GenericView(IRNode):
    """Any index remapping over an unrealized value: ``out[i] = data[reindex(i)]``.
    ``restride(base layout) -> Layout | None`` says how the same view reads a strided
    buffer, so that a fallback can take a view of the realized base instead of a copy."""
    data: IRNode
    size: List[sympy.Expr]
    reindex: Callable
    restride: Optional[Callable] = None

    def realize_strided(self):
        """(buffer, layout) of this view over its realized base, or None."""
        inner = self.data
        if isinstance(inner, StorageBox):
            buffer = inner.realize()
            base = buffer.layout
        elif isinstance(inner, GenericView):
            found = inner.realize_strided()
            if found is None:
                return None
            buffer, base = found
        elif isinstance(inner, ReinterpretView):
            buffer, base = inner.buffer, inner.layout
        else:
            return None
        layout = self.restride(base) if self.restride is not None else None
        return (buffer, layout) if layout is not None else None

    def get_size(self):
        return self.size

    def get_dtype(self):
        return self.data.get_dtype()

    def get_device(self):
        return self.data.get_device()

    def make_loader(self):
        inner, reindex = self.data.make_loader(), self.reindex

        def loader(index):
            return inner(reindex(index))
        return loader


# ---- boxes ----------------------------------------------------------------------------

class StorageBox(IRNode):
    """Owns one computation or buffer; realizing it materializes the computation."""

    def __init__(self, data):
        self.data = data
        self.num_reads = 0

    def get_size(self):
        return self.data.get_size()

    def get_dtype(self):
        return self.data.get_dtype()

    def get_device(self):
        return self.data.get_device()

    def make_loader(self):
        self.num_reads += 1
        return self.data.make_loader()

    def is_realized(self) -> bool:
        return isinstance(self.data, Buffer)

    def realize(self, layout: Optional[Layout] = None) -> Buffer:
        if isinstance(self.data, Buffer):
            return self.data
        from .graph import current_graph
        data = self.data
        graph = current_graph()
        if layout is None:   # contiguous, or the layout its dominant input has (channels_last)
            layout = graph.default_layout(data)
        buffer = ComputedBuffer(name=None, layout=layout, data=data)
        graph.register_buffer(buffer)
        self.data = buffer
        return buffer


class TensorBox(IRNode):
    def __init__(self, data):
        self.data = data

    @staticmethod
    def create(data) -> "TensorBox":
        return TensorBox(StorageBox(data))

    def get_size(self):
        return self.data.get_size()

    def get_dtype(self):
        return self.data.get_dtype()

    def get_device(self):
        return self.data.get_device()

    def make_loader(self):
        return self.data.make_loader()

    def __repr__(self):
        return f"TensorBox({type(self.data).__name__}, size={self.get_size()}, dtype={self.get_dtype()})"


def origins_of(values) -> tuple:
    """The aten ops folded into these (unrealized) values, in order, without repeats."""
    found = []

    def visit(value):
        if isinstance(value, TensorBox):
            visit(value.data)
        elif isinstance(value, StorageBox):
            if isinstance(value.data, Loops):
                found.extend(value.data.origins)
        elif isinstance(value, GenericView):
            visit(value.data)
    for value in values:
        visit(value)
    return tuple(dict.fromkeys(o for o in found if o))


def storage_of(value: IRNode) -> Optional[StorageBox]:
    data = value.data if isinstance(value, TensorBox) else value
    return data if isinstance(data, StorageBox) else None


def realize(value: IRNode) -> None:
    box = storage_of(value)
    if box is not None:
        box.realize()


def as_strided_buffer(value: IRNode):
    """A buffer or strided view holding ``value`` (realizing or copying as needed)."""
    data = value.data if isinstance(value, TensorBox) else value
    if isinstance(data, StorageBox):
        return data.realize()
    if isinstance(data, ReinterpretView):
        return data
    found = data.realize_strided() if isinstance(data, GenericView) else None
    if found is not None:
        return ReinterpretView(*found)
    # a view with no strided form: copy it into a fresh contiguous buffer
    box = StorageBox(Pointwise(data.get_device(), data.get_dtype(), data.make_loader(), list(data.get_size()),
                               origins=origins_of([data]) + ("copy",)))
    return box.realize()


def is_non_overlapping(size, stride) -> bool:
    """True when no two positions of a tensor of ``size`` share memory under ``stride``
    (gaps allowed: a slice of a bigger buffer). Sufficient test: with dims sorted by
    stride, each stride steps past everything the smaller dims reach (judged on the
    example sizes when they are symbolic)."""
    reach = 0
    dims = [(sym.hint(st), sym.hint(sz)) for sz, st in zip(size, stride) if sym.sint(sz) != 1]
    for st, sz in sorted(dims):
        if st <= reach:
            return False
        reach += st * (sz - 1)
    return True


def realize_with_strides(value: IRNode, size, stride):
    """A buffer or strided view holding ``value`` with exactly ``stride`` (eager's layout).

    Dims of stride 0 (an expand in eager) are computed once and expanded by a view over
    the buffer, so no element is written twice. Returns None for strides that overlap in
    any other way: no buffer can be written in them."""
    size = [sym.sint(s) for s in size]
    stride = [sym.sint(s) for s in stride]
    compact = [sympy.Integer(1) if st == 0 else s for s, st in zip(size, stride)]
    if not is_non_overlapping(compact, stride):
        return None
    device, dtype = value.get_device(), value.get_dtype()
    layout = Layout(device, dtype, compact, stride)
    box = storage_of(value)
    if box is not None and not box.is_realized() and compact == size:
        buffer = box.realize(layout)
    else:
        loader = value.make_loader()
        expanded = {d for d, (s, c) in enumerate(zip(size, compact)) if s != c}

        def inner_fn(index):
            return loader([sympy.Integer(0) if d in expanded else i for d, i in enumerate(index)])
        copy = StorageBox(Pointwise(device, dtype, inner_fn, compact, origins=origins_of([value]) + ("clone",)))
        buffer = copy.realize(layout)
    if compact == size:
        return buffer
    return ReinterpretView(buffer, Layout(device, dtype, size, stride))


def same_strides(layout: Layout, size, stride) -> bool:
    """``layout`` has these sizes and, on every dim longer than 1, these strides."""
    size, stride = sym.sizes_of(size), sym.sizes_of(stride)
    if not sym.same_sizes(layout.size, size):
        return False
    return all(sz == 1 or sym.same_size(have, want) for sz, have, want in zip(size, layout.stride, stride))


def strided_layout_of(value: IRNode) -> Optional[Layout]:
    """The layout of ``value`` if it is a realized buffer or a strided view of one."""
    data = value.data if isinstance(value, TensorBox) else value
    if isinstance(data, StorageBox) and data.is_realized():
        return data.data.layout
    if isinstance(data, ReinterpretView):
        return data.layout
    return None


def buffer_of(value: IRNode) -> Optional[Buffer]:
    data = value.data if isinstance(value, TensorBox) else value
    if isinstance(data, StorageBox) and data.is_realized():
        return data.data
    if isinstance(data, ReinterpretView):
        return data.buffer
    return None
