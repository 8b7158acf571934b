"""TritonKernel: the ``ops`` handler that turns one fused group into a Triton kernel.

Three shapes of kernel:

    pointwise             1-D blocks of XBLOCK elements
    persistent_reduction  [XBLOCK, RBLOCK] tiles holding whole rows in registers
    reduction             [XBLOCK, RBLOCK] tiles looping over the row, accumulators
                          in registers, one loop per chain of dependent reductions

Values of float16/bfloat16 buffers are loaded as float32 and rounded on store. Buffers
produced and consumed inside the kernel are never written to memory: a load of one
returns the value computed earlier in the kernel.
"""
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import sympy
import torch

from ... import sym
from ...dependencies import plan_and_deps
from ...ops_table import reduction_identity
from ...virtualized import set_ops_handler
from ..common import CSE, CSEVariable, IndentedBuffer, IndexPrinter, KernelArgs
from ..loops import Segment, buffers_crossing_loops, plan_segments
from .overrides import TRITON_INTEGER_DIVISION, TRITON_INTEGER_LOOPS, TRITON_INTEGER_SHIFTS, TRITON_TYPES, shift_by_constant

INT32_MAX = 2**31 - 1
# Symbolic sizes, static rows: no xmask where the rows' largest power-of-two divisor, the
# widest XBLOCK the launcher may then use, is at least this (narrower caps cost coalescing).
MIN_UNMASKED_XBLOCK = 64


class TritonPrinter(IndexPrinter):
    floordiv_op = "//"
    min_function = "tl.minimum"
    max_function = "tl.maximum"


_printer = TritonPrinter()


def texpr(expr) -> str:
    return _printer.doprint(expr)


def triton_constant(value, dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return str(int(value))


def literal_mistyped(value, dtype) -> bool:
    """Whether Triton, left to type the bare literal of ``value`` itself, may give it another
    dtype than ``dtype`` and change its value: a Python float is float32 wherever float32
    holds it (0.1 becomes 0.100000001490116), an int in [2**31, 2**32) is uint32 (beside a
    negative literal, -1 becomes 4294967295, or compiling fails). A literal next to a tensor of
    its dtype is safe (Triton converts it to the tensor's dtype); one beside another literal,
    or stored, is not."""
    if dtype == torch.float64:
        value = float(value)
        return math.isfinite(value) and float(torch.tensor(value, dtype=torch.float32)) != value
    return dtype == torch.int64 and not -2 ** 31 <= int(value) < 2 ** 31


def compute_dtype(dtype):
    """The dtype a value of ``dtype`` lives in inside a kernel."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass
class _Segment:
    """A top-level run of code, or one r-loop with its set-up and finishing code."""
    loop: bool
    pre: IndentedBuffer = field(default_factory=lambda: IndentedBuffer(1))
    body: IndentedBuffer = field(default_factory=lambda: IndentedBuffer(2))
    post: IndentedBuffer = field(default_factory=lambda: IndentedBuffer(1))
    deferred_stores: list = field(default_factory=list)
    cse_snapshot: dict = field(default_factory=dict)


class TritonKernel:
    def __init__(self, group, internal, graph, ops_table, configs, kind, numels=None, report_zero_division=False,
                 in_place=None):
        self.group = group
        self.graph = graph
        self.ops_table = ops_table
        self.kind = kind
        self.x_numel, self.r_numel = group.x_numel, group.r_numel
        self.looped = kind == "reduction"
        self.tiled = kind == "pointwise_2d"     # [YBLOCK, XBLOCK] tiles, for transposes
        self.has_r = kind in ("reduction", "persistent_reduction")
        self.args = KernelArgs(in_place)
        self.cse = CSE("tmp")
        self.internal = set(internal)
        self.stored: Dict[str, tuple] = {}     # buffer -> (value, segment id)
        self.segments: List[_Segment] = [_Segment(loop=False)]
        self.index_defs: Dict[str, str] = {}  # printed definition -> variable name
        self.mask_stack: List[str] = []
        self.indirect_bounds: Dict[str, str] = {}   # indirect index variable -> "it is in bounds"
        self.acc_counter = 0
        self.dim_counter = {"x": 0, "r": 0, "y": 0}
        self.size_symbols = set()   # size symbols the kernel reads: parameters of its own
        x_extent = numels["x"] if self.tiled else self.x_numel
        self.max_xblock = None   # symbolic sizes, static rows: the launcher keeps XBLOCK <= this
        if configs is None:      # symbolic sizes: blocks are chosen at launch, so mask everything
            self.needs_xmask, self.needs_ymask, self.needs_rmask = True, self.tiled, self.has_r
            if not self.tiled and sym.is_static(x_extent):
                # but a static row count (the 768 columns of a norm weight's gradient, summed
                # over a symbolic batch x length) that every XBLOCK up to its largest
                # power-of-two divisor divides needs no xmask: 22 -> 13 us on an H200 (Llama)
                divisor = sym.to_int(x_extent) & -sym.to_int(x_extent)
                if divisor >= MIN_UNMASKED_XBLOCK:
                    self.needs_xmask, self.max_xblock = False, divisor
        else:
            blocks = [c.kwargs for c in configs]
            self.needs_xmask = any(sym.to_int(x_extent) % b["XBLOCK"] for b in blocks)
            self.needs_ymask = self.tiled and any(sym.to_int(numels["y"]) % b["YBLOCK"] for b in blocks)
            if kind == "persistent_reduction":
                self.needs_rmask = any(sym.to_int(self.r_numel) != b["RBLOCK"] for b in blocks)
            else:
                self.needs_rmask = self.has_r and any(sym.to_int(self.r_numel) % b["RBLOCK"] for b in blocks)
        self.use_int64 = self._needs_int64()
        # CPU tensors (the interpreter): integer divisions flag a zero divisor in
        # zero_division_ptr, and the wrapper raises eager's error (CUDA eager raises none)
        self.report_zero_division = report_zero_division
        self.checks_division = False
        # per-node state
        self.plan = None
        self.node_kind = None
        self.x_symbols = []
        self.r_symbols = []

    # ---- planning ---------------------------------------------------------------------
    def _needs_int64(self):
        """Whether some index may pass 2**31 - 1. Under symbolic sizes int32 indexing is
        kept only where a guard (or what is already known of the sizes) says it fits."""
        extents = [self.x_numel * self.r_numel]
        for name in self.group.names | self.group.read_names():
            buffer = self.graph.name_to_buffer.get(name)
            if buffer is not None:
                extents.append(buffer.layout.storage_size())
        return not all(sym.current_sizevars().known_lt(extent, INT32_MAX + 1) for extent in extents)

    # ---- driving ----------------------------------------------------------------------
    def generate(self):
        layouts = self.group.node_layouts()
        if self.looped:
            planned = plan_segments(layouts)
            self.internal -= buffers_crossing_loops(planned)   # these go through memory
        else:
            planned = [Segment(0, False, layouts)]
        last_loop = max((seg.index for seg in planned if seg.is_loop), default=-1)
        # segments are numbered as they are appended below: the initial top-level one is 0
        self.segment_count = last_loop + 1 + (1 if planned and planned[0].index == 0 else 0)
        for seg in planned:
            if seg.index > 0 or seg.is_loop:
                self._close_segment()
                self.segments.append(_Segment(loop=seg.is_loop, cse_snapshot=dict(self.cse.cache)))
            for node, x_sizes, r_sizes, kind in seg.layouts:
                self._set_node(node, x_sizes, r_sizes, kind)
                with set_ops_handler(self):
                    node.buffer.run_body(self.plan.raw_x, self.plan.raw_r)
        self._close_segment()

    def _set_node(self, node, x_sizes, r_sizes, kind):
        self.plan, _, _ = plan_and_deps(node.buffer, x_sizes, r_sizes)
        self.node_kind = kind
        if self.tiled:   # the innermost dim runs along XBLOCK, the others along YBLOCK
            sizes = self.plan.x_sizes
            self.x_symbols = self._dim_symbols("y", sizes[:-1]) + [sympy.Symbol("xindex", integer=True,
                                                                                nonnegative=True)]
        else:
            self.x_symbols = self._dim_symbols("x", self.plan.x_sizes)
        self.r_symbols = self._dim_symbols("r", self.plan.r_sizes)
        self.symbol_sizes = dict(zip(self.x_symbols + self.r_symbols, list(self.plan.x_sizes) + list(self.plan.r_sizes)))

    @property
    def segment(self) -> _Segment:
        return self.segments[-1]

    @property
    def out(self) -> IndentedBuffer:
        seg = self.segments[-1]
        return seg.body if seg.loop else seg.pre

    def _close_segment(self):
        seg = self.segment
        for emit in seg.deferred_stores:
            emit(seg.post)
        if seg.loop:
            # values computed inside the loop go out of scope; reduction results live on
            finished = {k: v for k, v in self.cse.cache.items() if k.startswith("reduction:")}
            self.cse.cache = dict(seg.cse_snapshot, **finished)
            self.index_defs = {k: v for k, v in self.index_defs.items() if not v.startswith("r")}

    # ---- index helpers ----------------------------------------------------------------
    def _dim_symbols(self, prefix, sizes):
        """Kernel-level variables for the dims of one node: x0 = xindex % 128 ..."""
        flat = sympy.Symbol(f"{prefix}index", integer=True, nonnegative=True)
        if len(sizes) <= 1:
            return [flat] * len(sizes)
        symbols = []
        for expr in sym.unflatten(flat, sizes):
            self.size_symbols |= sym.size_symbols(expr)
            definition = texpr(expr)
            name = self.index_defs.get(definition)
            if name is None:
                name = f"{prefix}{self.dim_counter[prefix]}"
                self.dim_counter[prefix] += 1
                self.index_defs[definition] = name
                target = self.out if prefix == "r" else self.segments[0].pre
                target.writeline(f"{name} = {definition}")
            symbols.append(sympy.Symbol(name, integer=True, nonnegative=True))
        return symbols

    def kernel_index(self, index) -> sympy.Expr:
        """A node-level index (raw loop variables) as an expression of kernel variables."""
        canonical = self.plan.remap(index)
        mapping = {}
        for i, s in enumerate(self.x_symbols):
            mapping[sympy.Symbol(f"x{i}", integer=True, nonnegative=True)] = s
        for i, s in enumerate(self.r_symbols):
            mapping[sympy.Symbol(f"r{i}", integer=True, nonnegative=True)] = s
        result = canonical.xreplace(mapping)
        self.size_symbols |= sym.size_symbols(result)
        return result

    def _pointer_offset(self, index) -> str:
        """The index as printed; a block of it when it depends on no block variable."""
        text = texpr(index)
        if not any(s.name.startswith(("x", "r", "tmp")) for s in index.free_symbols):
            text = f"{text} + tl.zeros({self._node_block_shape()}, tl.int32)"
        return text

    def _node_block_shape(self) -> str:
        """The block the current node's values span."""
        if self.tiled:
            return "[YBLOCK, XBLOCK]"
        if not self.has_r:
            return "[XBLOCK]"
        return "[XBLOCK, RBLOCK]" if self.node_kind in ("xr", "scan") else "[XBLOCK, 1]"

    def _mask_for(self, index, load=False) -> Optional[str]:
        """The mask of a load or store at ``index``. A load whose index does not depend on
        the y (x) variables needs no ymask (xmask): its address is in bounds for every row,
        and what a masked-off row computes from it is never stored (reductions mask their
        own inputs). Masking it anyway costs: a 0-d scalar read under xmask in every step of
        a reduction's loop made the cross-entropy backward of a symbolic Llama (1792 x 32000
        bf16, H200) 125 us against 96 us unmasked. An indirect index keeps every mask."""
        parts = []
        names = [s.name for s in index.free_symbols if not sym.is_size_symbol(s)]
        uses_r = self._value_over_r() and any(name.startswith("r") for name in names)
        indirect = any(not name.startswith(("x", "y", "r")) for name in names)

        def needed(prefix):
            return not load or indirect or any(name.startswith(prefix) for name in names)
        if self.needs_ymask and needed("y"):
            parts.append("ymask")
        if self.needs_xmask and needed("x"):
            parts.append("xmask")
        if self.needs_rmask and uses_r:
            parts.append("rmask")
        parts.extend(self.mask_stack)
        return " & ".join(parts) if parts else None

    def _value_over_r(self):
        return self.node_kind in ("xr", "reduction", "scan") and self.has_r

    # ---- ops: memory ------------------------------------------------------------------
    def load(self, name, index):
        if name in self.stored:
            value, seg_id, in_loop = self.stored[name]
            if seg_id == len(self.segments) - 1 or not in_loop:
                return value
        buffer = self.graph.name_to_buffer[name]
        dtype = buffer.get_dtype()
        pointer = self.args.input(name)
        index = self.kernel_index(index)
        mask = self._mask_for(index, load=True)
        expr = f"tl.load({pointer} + ({self._pointer_offset(index)})"
        expr += f", {mask}, other=0" if mask else ""
        if self.looped and self.segment.loop:
            # keep rows in L2 for the loops that read them again; let the last one evict
            last = self.segment_count - 1 == len(self.segments) - 1
            expr += ", eviction_policy='evict_first'" if last else ", eviction_policy='evict_last'"
        expr += ")"
        widen = self.ops_table.get("load_" + str(dtype).replace("torch.", ""))
        if widen is not None:
            expr = widen.format(expr)
        elif dtype in (torch.float16, torch.bfloat16):
            expr += ".to(tl.float32)"
        elif dtype == torch.bool:
            expr += ".to(tl.int1)"
        over_r = self._value_over_r() and any(s.name.startswith("r") for s in index.free_symbols)
        return self.cse.generate(self.out, expr, dtype, over_r=over_r or self._value_over_r())

    def store(self, name, index, value):
        self.stored[name] = (value, len(self.segments) - 1, self.segment.loop)
        if name in self.internal:
            return
        pointer = self.args.output(name)
        index = self.kernel_index(index)
        mask = self._mask_for(index)
        value = self._as_stored(name, self._typed(value))
        line = f"tl.store({pointer} + ({self._pointer_offset(index)}), {value}" + (f", {mask})" if mask else ")")
        self.out.writeline(line)

    def _as_stored(self, name, value) -> str:
        """What a store into buffer ``name`` writes: ``value``, or ``value`` rounded to the
        buffer's dtype where the op table says the store itself would not round as a
        compiled store does (``store_bfloat16``: Triton's interpreter truncates)."""
        dtype = self.graph.name_to_buffer[name].get_dtype()
        template = self.ops_table.get("store_" + str(dtype).replace("torch.", ""))
        if template is None or isinstance(value, Constant):   # constants are rounded already (constant())
            return str(value)
        return template.format(value)

    def store_reduction(self, name, index, value):
        self.stored[name] = (value, len(self.segments) - 1, False)
        if name in self.internal:
            return
        pointer = self.args.output(name)
        index = self.kernel_index(index)
        mask = "xmask" if self.needs_xmask else None
        value = self._as_stored(name, self._typed(value))
        line = f"tl.store({pointer} + ({self._pointer_offset(index)}), {value}" + (f", {mask})" if mask else ")")
        if self.looped:
            self.segment.deferred_stores.append(lambda buf, line=line: buf.writeline(line))
        else:
            self.out.writeline(line)

    def store_scatter(self, name, index, value, mode):
        """An indirect write: a plain store, or an atomic read-modify-write (another program
        may write the same element). Every lane outside the loop nest is masked off, also
        when the index does not name the dims it varies along, and so is every lane whose
        index is out of bounds (eager raises there; device_assert is compiled out on GPUs,
        and a write must never land outside the tensor)."""
        if name in self.internal:
            return
        value = self._typed(value)
        pointer = self.args.output(name)
        index = self.kernel_index(index)
        parts = ["ymask"] * self.needs_ymask + ["xmask"] * self.needs_xmask
        if self.needs_rmask and self.node_kind in ("xr", "scan"):
            parts.append("rmask")
        parts += [self.indirect_bounds[s.name] for s in sorted(index.free_symbols, key=str)
                  if s.name in self.indirect_bounds]
        mask = " & ".join(parts + self.mask_stack) or None
        # the whole block: the index may vary along fewer dims than the value (lanes that
        # write one element, all of them adding)
        address = f"{pointer} + tl.broadcast_to({self._pointer_offset(index)}, {self._node_block_shape()})"
        if mode is None:
            self.out.writeline(f"tl.store({address}, {value}" + (f", {mask})" if mask else ")"))
            return
        mask_arg = f", {mask}" if mask else ""
        self.out.writeline(f"tl.atomic_{_ATOMIC_OPS[mode]}({address}, {value}{mask_arg}, sem='relaxed')")

    def index_expr(self, index, dtype):
        index = self.kernel_index(index)
        if index.is_Integer:
            return self.constant(int(index), dtype)
        text = texpr(index)
        if not index.free_symbols:
            return self.constant(int(index), dtype)
        if any(s.name.startswith("z") for s in index.free_symbols):   # a float scalar argument
            expr = f"tl.full([], {text}, {TRITON_TYPES[dtype]})"   # (a Python float in the interpreter)
        else:
            wide = dtype.itemsize > 4 or dtype.is_floating_point
            if wide and not self.use_int64 and not self._fits_int32(index):   # computed in int64
                text = texpr(index.xreplace({s: sympy.Symbol(f"{s.name}.to(tl.int64)") for s in self.symbol_sizes}))
            expr = f"({text}).to({TRITON_TYPES[dtype]})" if dtype != torch.int32 else f"({text})"
        return self.cse.generate(self.out, expr, dtype, over_r=self._value_over_r())

    def _fits_int32(self, index) -> bool:
        """Whether ``index`` (a polynomial of this node's loop variables, each in [0, size))
        provably stays inside int32, as the variables do: arange(2**40, ...) or a step of
        2**33 does not, and computed in int32 it fails to compile or wraps."""
        bound = 0
        for monomial, coefficient in index.as_coefficients_dict().items():
            if not coefficient.is_Integer:
                return False
            term = abs(int(coefficient))
            for base, exponent in monomial.as_powers_dict().items():
                if base == 1:
                    continue
                if base not in self.symbol_sizes or not exponent.is_Integer or exponent < 1:
                    return False
                term *= (self.symbol_sizes[base] - 1) ** int(exponent)
            bound += term
        return sym.current_sizevars().known_lt(bound, INT32_MAX + 1)

    def indirect_indexing(self, value, size):
        self.size_symbols |= sym.size_symbols(size)
        constant = _in_bounds_constant(value, size)
        if constant is not None:   # a literal index (a scatter into row 0): nothing to check at run time
            return constant
        size = texpr(sympy.sympify(size))
        wrapped = self.cse.generate(self.out, f"tl.where({value} < 0, {value} + {size}, {value})", torch.int64,
                                    over_r=value.over_r if isinstance(value, CSEVariable) else False)
        mask = " & ".join(["ymask"] * self.needs_ymask + ["xmask"] * self.needs_xmask + self.mask_stack)
        in_bounds = f"(0 <= {wrapped}) & ({wrapped} < {size})"
        self.indirect_bounds[wrapped.name] = f"({in_bounds})"
        condition = f"{in_bounds} | ~({mask})" if mask else in_bounds
        self.out.writeline(f'tl.device_assert({condition}, "index out of bounds: 0 <= {wrapped} < {size}")')
        return sympy.Symbol(wrapped.name, integer=True)

    def masked(self, mask, body, other):
        self.mask_stack.append(str(mask))
        try:
            value = body()
        finally:
            self.mask_stack.pop()
        dtype = value.dtype if isinstance(value, CSEVariable) else torch.float32
        value = self._typed(value)
        other_text = triton_constant(other, compute_dtype(dtype))
        return self.cse.generate(self.out, f"tl.where({mask}, {value}, {other_text})", dtype,
                                 over_r=getattr(value, "over_r", False))

    # ---- ops: values ------------------------------------------------------------------
    def constant(self, value, dtype):
        if dtype in (torch.float16, torch.bfloat16):   # the value a tensor of that dtype holds
            value = float(torch.tensor(float(value), dtype=dtype))
        elif _is_integer(dtype) and not isinstance(value, float):
            # also the value that dtype holds: -3 as uint8 is 253, as eager casts a scalar
            # (Triton refuses a negative constant next to an unsigned tensor)
            info = torch.iinfo(dtype)
            value = (int(value) - info.min) % (1 << info.bits) + info.min
        return Constant(triton_constant(value, compute_dtype(dtype)), dtype, value=value)

    def to_dtype(self, value, dtype):
        source = value.dtype
        if source == dtype:
            return value
        if isinstance(value, Constant):
            return self.constant(_cast_python(value.value, dtype), dtype)
        if compute_dtype(source) == compute_dtype(dtype):
            return CSEVariable(value.name, dtype, value.over_r)
        if dtype == torch.bool:
            expr = f"({value} != 0)"
        else:
            expr = f"({value}).to({TRITON_TYPES[compute_dtype(dtype)]})"
        return self.cse.generate(self.out, expr, dtype, over_r=value.over_r)

    def __getattr__(self, name):
        template = self.ops_table.get(name)
        if template is None:
            raise AttributeError(f"the Triton backend has no op {name!r}")

        def emit(*operands):
            if operands and all(isinstance(o, Constant) for o in operands):
                operands = (self._scalar_tensor(operands[0]),) + operands[1:]
            dtype = _result_dtype(name, operands)
            over_r = any(getattr(o, "over_r", False) for o in operands)
            chosen = template
            if _is_integer(operands[0].dtype):
                chosen = self._integer_template(name, operands, over_r) or template
            operands = self._typed_constants(operands, _is_call(chosen))
            text = chosen.format(*[str(o) for o in operands])
            return self.cse.generate(self.out, text, dtype, over_r=over_r)
        return emit

    def _typed_constants(self, operands, call):
        """``operands`` with each literal that Triton would type wrongly (literal_mistyped) as a
        tensor of its dtype, unless a tensor operand of its dtype types it already; float32
        kernels keep their bare literals. A helper or libdevice function (``call``) gets every
        literal as a tensor: it sees a literal as a constexpr, not converted to its neighbour's
        dtype (atan2(x, 0.1) called 0.1.to(...) and failed to compile, in float32 too)."""
        if call:
            return tuple(self._scalar_tensor(o) if isinstance(o, Constant) else o for o in operands)
        tensor_dtypes = {compute_dtype(o.dtype) for o in operands if not isinstance(o, Constant)}
        return tuple(self._typed(o) if isinstance(o, Constant) and compute_dtype(o.dtype) not in tensor_dtypes
                     else o for o in operands)

    def _typed(self, value):
        """``value``, or a tensor holding it where it is a literal that Triton would type wrongly."""
        if isinstance(value, Constant) and literal_mistyped(value.value, compute_dtype(value.dtype)):
            return self._scalar_tensor(value)
        return value

    def _scalar_tensor(self, constant):
        """A literal as a tensor of ones of the blocks' rank (it broadcasts to every block of the
        kernel; Triton's interpreter combines neither 0-d tensors nor other ranks with blocks), for an op whose operands are all literals (chebyshev_t(0.3, n)
        tests |0.3| == 1): Python would evaluate it to a float or bool, which Triton's tensor ops
        and masks (`bool & tensor`, `(0.3).to(...)`) do not take."""
        ones = "[1, 1]" if self.tiled or self.has_r else "[1]"   # the rank of the kernel's blocks
        text = f"tl.full({ones}, {constant}, {TRITON_TYPES[compute_dtype(constant.dtype)]})"
        return self.cse.generate(self.out, text, constant.dtype, over_r=False)

    def _integer_template(self, name, operands, over_r) -> Optional[str]:
        """Integer division, shifts and pow with eager's semantics (overrides.py), or None."""
        right = operands[1] if len(operands) > 1 else None
        if name in TRITON_INTEGER_LOOPS:
            return TRITON_INTEGER_LOOPS[name]
        if name in TRITON_INTEGER_SHIFTS:
            if isinstance(right, Constant):
                return shift_by_constant(name, operands[0].dtype, int(right.value))
            return TRITON_INTEGER_SHIFTS[name]
        if name in TRITON_INTEGER_DIVISION and not isinstance(right, Constant):
            if self.report_zero_division:
                self._flag_zero_divisor(right, over_r)
            return TRITON_INTEGER_DIVISION[name]
        return None

    def _flag_zero_divisor(self, divisor, over_r):
        """Set zero_division_ptr[0] when a lane that holds an element divides by zero."""
        self.checks_division = True
        parts = [f"({divisor} == 0)"] + ["ymask"] * self.needs_ymask + ["xmask"] * self.needs_xmask
        parts += ["rmask"] * (self.needs_rmask and over_r) + self.mask_stack
        condition = " & ".join(parts)
        if len(parts) > 1:
            # a scalar divisor's (s == 0) & a block mask holds ints under Triton's
            # interpreter, which then rejects it as a store mask: compare it back to bool
            condition = f"({condition}) != 0"
        if condition in self.cse.cache:   # flagged already (x // y and x % y share a divisor)
            return
        zero = self.cse.generate(self.out, condition, torch.bool, over_r=over_r)
        self.out.writeline(f"tl.store(zero_division_ptr + tl.zeros({zero}.shape, tl.int32), 1, {zero})")

    # ---- ops: reductions --------------------------------------------------------------
    def reduction(self, dtype, src_dtype, reduction_type, value):
        if reduction_type.startswith("welford"):
            return self._welford(value)[0 if reduction_type == "welford_mean" else 1]
        if reduction_type == "sumexp":
            return self._sumexp(value)
        key = f"reduction:{reduction_type}:{value}"
        if key in self.cse.cache:
            return self.cse.cache[key]
        acc_dtype = compute_dtype(src_dtype)
        identity = triton_constant(reduction_identity(reduction_type, acc_dtype), acc_dtype)
        ttype = TRITON_TYPES[acc_dtype]
        mask = " & ".join((["xmask"] if self.needs_xmask else []) + (["rmask"] if self.needs_rmask else []))
        value_text = _row_block(value)
        if reduction_type in ("any", "all"):
            value_text = f"({value_text} != 0)"
        result_dtype = torch.int64 if reduction_type in ("argmax", "argmin") else dtype
        if self.looped:
            result = self._looped_reduction(reduction_type, value_text, mask, identity, ttype, result_dtype)
        else:
            result = self._persistent_reduction(reduction_type, value_text, mask, identity, result_dtype)
        self.cse.cache[key] = result
        return result

    def scan(self, dtype, scan_type, value):
        """The running ``scan_type`` of ``value`` along the row, inclusive. A persistent
        kernel scans the whole row at once; a looped one scans each block and combines it
        with the carried total of the blocks before (lanes past the row's end come last,
        so they never reach a valid prefix). argmax/argmin scan (value, position) pairs."""
        helpers = f"tf_helpers.{scan_type}"   # tf_helpers.sum_scan and .sum_total, ...
        combine = f"tf_helpers.scan_{scan_type}"
        paired = scan_type in ("argmax", "argmin")
        value_dtype = compute_dtype(value.dtype if paired else dtype)
        ttype = TRITON_TYPES[value_dtype]
        spread = f"tl.full([XBLOCK, RBLOCK], {value}, {ttype})" if isinstance(value, Constant) \
            else f"tl.broadcast_to({value}, [XBLOCK, RBLOCK]).to({ttype})"
        v = self.cse.generate(self.out, spread, value_dtype, over_r=True)
        if paired:
            position = self.cse.generate(self.out, "tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)",
                                         torch.int64, over_r=True)
            v = f"{v}, {position}"
        block = self._scan_parts(f"{helpers}_scan({v}, 1)", paired, value_dtype)
        if not self.looped:
            return block[-1]
        carry = [f"_carry{self.acc_counter}"] + ([f"_carry{self.acc_counter}_index"] if paired else [])
        self.acc_counter += 1
        identity = triton_constant(reduction_identity(scan_type, value_dtype), value_dtype)
        self.segment.pre.writeline(f"{carry[0]} = tl.full([XBLOCK, 1], {identity}, {ttype})")
        if paired:
            self.segment.pre.writeline(f"{carry[1]} = tl.zeros([XBLOCK, 1], tl.int64)")
        carried = ", ".join(carry)
        result = self._scan_parts(f"{combine}({carried}, {', '.join(map(str, block))})", paired, value_dtype)
        total = self._scan_parts(f"{helpers}_total({v}, 1)", paired, value_dtype)
        self.out.writeline(f"{carried} = {combine}({carried}, {', '.join(f'{t}[:, None]' for t in total)})")
        return result[-1]

    def _scan_parts(self, expr, paired, value_dtype):
        """``expr``'s result: [value], or [value, position] for a paired scan."""
        if not paired:
            return [self.cse.generate(self.out, expr, value_dtype, over_r=True)]
        parts = [self.cse.new_var(value_dtype, over_r=True), self.cse.new_var(torch.int64, over_r=True)]
        self.out.writeline(f"{parts[0]}, {parts[1]} = {expr}")
        return parts

    def _welford(self, value):
        """(mean, m2) of ``value`` over the row; shared by welford_mean and welford_m2.
        Persistent: two passes over the row in registers (exact). Looped: Welford."""
        key = f"reduction:welford:{value}"
        if key in self.cse.cache:
            return self.cse.cache[key]
        mask = " & ".join((["xmask"] if self.needs_xmask else []) + (["rmask"] if self.needs_rmask else []))
        v = self.cse.generate(self.out, _row_block(value), torch.float32, over_r=True)
        if not self.looped:
            masked = self.cse.generate(self.out, f"tl.where({mask}, {v}, 0.0)" if mask else str(v), torch.float32,
                                       over_r=True)
            total = self.cse.generate(self.out, f"tl.sum({masked}, 1)[:, None]", torch.float32)
            count = float(sym.to_int(self.r_numel)) if sym.is_static(self.r_numel) else "rnumel"
            mean = self.cse.generate(self.out, f"{total} / {count}", torch.float32)
            deviation = self.cse.generate(self.out, f"tl.where({mask}, {v} - {mean}, 0.0)" if mask
                                          else f"{v} - {mean}", torch.float32, over_r=True)
            m2 = self.cse.generate(self.out, f"tl.sum({deviation} * {deviation}, 1)[:, None]", torch.float32)
            result = (mean, m2)
        else:
            seg, acc = self.segment, f"_acc{self.acc_counter}"
            self.acc_counter += 1
            for part in ("mean", "m2", "weight"):
                seg.pre.writeline(f"{acc}_{part} = tl.zeros([XBLOCK, RBLOCK], tl.float32)")
            out = self.out
            out.writeline(f"{acc}_weight_next = {acc}_weight + 1.0")
            out.writeline(f"{acc}_delta = {v} - {acc}_mean")
            out.writeline(f"{acc}_mean_next = {acc}_mean + {acc}_delta / {acc}_weight_next")
            out.writeline(f"{acc}_m2_next = {acc}_m2 + {acc}_delta * ({v} - {acc}_mean_next)")
            for part in ("mean", "m2", "weight"):
                update = f"{acc}_{part}_next"
                out.writeline(f"{acc}_{part} = tl.where({mask}, {update}, {acc}_{part})" if mask
                              else f"{acc}_{part} = {update}")
            mean, m2 = self.cse.new_var(torch.float32), self.cse.new_var(torch.float32)
            seg.post.writeline(f"{mean}, {m2}, _ = tf_helpers.welford({acc}_mean, {acc}_m2, {acc}_weight, 1)")
            seg.post.writeline(f"{mean} = {mean}[:, None]")
            seg.post.writeline(f"{m2} = {m2}[:, None]")
            result = (mean, m2)
        self.cse.cache[key] = result
        return result

    def _sumexp(self, value):
        """sum(exp(v - max(v))) over the row in one pass: per lane a running max m and a
        running sum s rescaled whenever m grows; lanes are merged at the end."""
        key = f"reduction:sumexp:{value}"
        if key in self.cse.cache:
            return self.cse.cache[key]
        mask = " & ".join((["xmask"] if self.needs_xmask else []) + (["rmask"] if self.needs_rmask else []))
        v = self.cse.generate(self.out, _row_block(value), torch.float32, over_r=True)
        if mask:
            v = self.cse.generate(self.out, f'tl.where({mask}, {v}, float("-inf"))', torch.float32, over_r=True)
        if not self.looped:
            row_max = self.cse.generate(self.out, f"tf_helpers.max2({v}, 1)[:, None]", torch.float32)
            terms = self.cse.generate(self.out, f"tf_helpers.exp_shifted({v}, {row_max})", torch.float32, over_r=True)
            result = self.cse.generate(self.out, f"tl.sum({terms}, 1)[:, None]", torch.float32)
        else:
            seg, acc = self.segment, f"_acc{self.acc_counter}"
            self.acc_counter += 1
            seg.pre.writeline(f'{acc}_max = tl.full([XBLOCK, RBLOCK], float("-inf"), tl.float32)')
            seg.pre.writeline(f"{acc}_sum = tl.zeros([XBLOCK, RBLOCK], tl.float32)")
            self.out.writeline(f"{acc}_max, {acc}_sum = tf_helpers.online_softmax_update({acc}_max, {acc}_sum, {v})")
            result = self.cse.new_var(torch.float32)
            seg.post.writeline(f"{result} = tf_helpers.online_softmax_merge({acc}_max, {acc}_sum, 1)[:, None]")
        self.cse.cache[key] = result
        return result

    def _persistent_reduction(self, reduction_type, value_text, mask, identity, result_dtype):
        masked = self.cse.generate(self.out, f"tl.where({mask}, {value_text}, {identity})" if mask else value_text,
                                   result_dtype, over_r=True)
        final = _FINAL_REDUCE[reduction_type].format(value=masked, index="rindex")
        return self.cse.generate(self.out, f"{final}[:, None]", result_dtype, over_r=False)

    def _looped_reduction(self, reduction_type, value_text, mask, identity, ttype, result_dtype):
        seg = self.segment
        acc = f"_acc{self.acc_counter}"
        self.acc_counter += 1
        acc_type = "tl.int1" if reduction_type in ("any", "all") else ttype
        seg.pre.writeline(f"{acc} = tl.full([XBLOCK, RBLOCK], {identity}, {acc_type})")
        value = self.cse.generate(self.out, value_text, result_dtype, over_r=True)
        keep = mask if mask else None
        if reduction_type in ("argmax", "argmin"):
            seg.pre.writeline(f"{acc}_index = tl.full([XBLOCK, RBLOCK], {INT32_MAX}, tl.int32)")
            better = f"tf_helpers.{reduction_type}_better({value}, rindex, {acc}, {acc}_index)"
            if keep:
                better = f"({better}) & ({keep})"
            self.out.writeline(f"{acc}_take = {better}")
            self.out.writeline(f"{acc} = tl.where({acc}_take, {value}, {acc})")
            self.out.writeline(f"{acc}_index = tl.where({acc}_take, rindex, {acc}_index)")
            final = f"tf_helpers.{reduction_type}({acc}, {acc}_index, 1)"
        else:
            combined = _COMBINE[reduction_type].format(acc=acc, value=value)
            if keep:
                combined = f"tl.where({keep}, {combined}, {acc})"
            self.out.writeline(f"{acc} = {combined}")
            final = _FINAL_REDUCE[reduction_type].format(value=acc, index="rindex")
        result = self.cse.new_var(result_dtype, over_r=False)
        seg.post.writeline(f"{result} = {final}[:, None]")
        return result

    # ---- assembling -------------------------------------------------------------------
    def body_lines(self) -> IndentedBuffer:
        code = IndentedBuffer(0)
        for seg in self.segments:
            code.splice(seg.pre)
            if seg.loop:
                code.writeline("    for roffset in range(0, rnumel, RBLOCK):")
                code.writeline("        rindex = roffset + rbase")
                if self.needs_rmask:
                    code.writeline("        rmask = rindex < rnumel")
                code.splice(seg.body)
            code.splice(seg.post)
        return code


@dataclass(eq=False)
class Constant(CSEVariable):
    """A literal; ``value`` is the python number it prints."""
    value: object = 0


def _row_block(value) -> str:
    """``value`` as an [XBLOCK, RBLOCK] block for a reduction: a literal (sum(ones)) is
    not a tensor that tl.broadcast_to takes, so it becomes a tl.full."""
    if isinstance(value, Constant):
        return f"tl.full([XBLOCK, RBLOCK], {value}, {TRITON_TYPES[compute_dtype(value.dtype)]})"
    return f"tl.broadcast_to({value}, [XBLOCK, RBLOCK])"


def _cast_python(value, dtype):
    if dtype == torch.bool:
        return bool(value)
    if dtype in (torch.float16, torch.bfloat16):
        return float(torch.tensor(float(value), dtype=dtype))   # rounded to the nearest, ties to even
    if dtype.is_floating_point:
        return float(value)
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        raise ValueError("non-finite value cast to an integer dtype")
    return int(value)


def _is_call(template) -> bool:
    """Whether an op's spelling calls a helper or libdevice function (not an operator, not
    tl.where, not the maximum/minimum helpers, which take literals as operators do)."""
    call = re.match(r"([A-Za-z_][\w.]*)\(", template)
    return call is not None and call.group(1) not in ("tl.where", "tf_helpers.maximum", "tf_helpers.minimum")


def _is_integer(dtype) -> bool:
    return not dtype.is_floating_point and dtype != torch.bool


def _result_dtype(op_name, operands):
    from ...ops_table import BOOL, PRIMITIVES
    spec = PRIMITIVES[op_name]
    if spec.result == BOOL:
        return torch.bool
    if op_name == "where":
        return operands[1].dtype if isinstance(operands[1], CSEVariable) else operands[2].dtype
    for operand in operands:
        if isinstance(operand, CSEVariable):
            return operand.dtype
    return torch.float32


_ATOMIC_OPS = {"sum": "add", "max": "max", "min": "min"}   # store_scatter modes done atomically

_COMBINE = {
    "sum": "{acc} + {value}",
    "prod": "{acc} * {value}",
    "max": "tf_helpers.maximum({acc}, {value})",
    "min": "tf_helpers.minimum({acc}, {value})",
    "any": "{acc} | {value}",
    "all": "{acc} & {value}",
}

_FINAL_REDUCE = {
    "sum": "tl.sum({value}, 1)",
    "prod": "tf_helpers.prod({value}, 1)",
    "max": "tf_helpers.max2({value}, 1)",
    "min": "tf_helpers.min2({value}, 1)",
    "any": "tf_helpers.any({value}, 1)",
    "all": "tf_helpers.all({value}, 1)",
    "argmax": "tf_helpers.argmax({value}, tl.broadcast_to({index}, {value}.shape), 1)",
    "argmin": "tf_helpers.argmin({value}, tl.broadcast_to({index}, {value}.shape), 1)",
}


def _in_bounds_constant(value, size):
    """The index ``value`` wrapped as eager wraps negative indices, when it is an integer
    literal inside a static ``size``; else None. (Folded at generation: Triton's
    interpreter rejects a mask combined from the block mask and a scalar bounds test.)"""
    text = str(value).strip("()")
    size = sympy.sympify(size)
    if not size.is_Integer or not text.lstrip("-").isdigit():
        return None
    index = int(text) + (int(size) if text.startswith("-") else 0)
    return sympy.Integer(index) if 0 <= index < int(size) else None

