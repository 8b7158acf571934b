"""WrapperCodeGen: the generated host code of one compiled graph.

It is a Python module with the kernels defined at the top and one ``call(args)``
function that allocates buffers (empty_strided) or takes over dead ones as the memory
plan says (memory_planning.py), launches kernels, calls fallbacks, frees each buffer
after its last use and returns the outputs with eager's layouts.
"""
import math

import sympy
import torch

from .. import metrics, sym
from ..ir import Buffer, ReinterpretView, memory_target
from ..runtime.heuristics import Config
from .common import IndentedBuffer, pexpr
from .memory_planning import MemoryPlan


def _shape(values):
    return "(" + "".join(f"{pexpr(v)}, " for v in values) + ")"


# aten ops that generated code calls through their torch.* function: its Python binding
# parses the arguments in C++, about 3 us a call less than torch.ops' schema-driven
# parsing (as Inductor's extern_kernels.mm etc. do). Each has no overload but default and
# out that the arguments generated code passes could bind (the out_dtype forms need an
# out_dtype argument), and its binding takes out=. (torch.convolution takes no out=.)
TORCH_FUNCTION_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm"})


def op_reference(op) -> str:
    """Python source naming an aten op or a higher-order op (``with_effects``)."""
    if isinstance(op, torch._ops.HigherOrderOperator):
        return f"torch.ops.higher_order.{op.name()}"
    return f"torch.ops.{op}"


def op_call_reference(op) -> str:
    """Python source naming what generated code calls to run `op`: its torch.* function
    for the default and out overloads of TORCH_FUNCTION_OPS, else `op_reference`."""
    if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten":
        name = op.overloadpacket.__name__
        if name in TORCH_FUNCTION_OPS and op._overloadname in ("default", "out") and hasattr(torch, name):
            return f"torch.{name}"
    return op_reference(op)


def py_literal(value) -> str:
    """Python source for a fallback argument."""
    if isinstance(value, Buffer):
        return value.name
    if isinstance(value, ReinterpretView):
        layout = value.layout
        return (f"reinterpret_tensor({value.buffer.name}, {_shape(layout.size)}, "
                f"{_shape(layout.stride)}, {pexpr(layout.offset)})")
    if isinstance(value, (list, tuple)):
        inner = ", ".join(py_literal(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, (bool, int, str, complex)) or value is None:
        return repr(value)
    if isinstance(value, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return op_reference(value)   # with_effects(token, op, *args) takes the op it runs
    if isinstance(value, sympy.Basic):
        return pexpr(value)
    raise NotImplementedError(f"cannot pass {type(value).__name__} to a fallback")


def _launcher_literal(value) -> str:
    """Python source for a launcher argument: launch configs, dtypes, plain values."""
    if isinstance(value, Config):
        return f"Config.from_dict({value.to_dict()!r})"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (list, tuple)):
        inner = "".join(f"{_launcher_literal(v)}, " for v in value)
        return f"[{inner.rstrip(', ')}]" if isinstance(value, list) else f"({inner})"
    return repr(value)


def _only_cuda_index(graph) -> int | None:
    """The index of the one CUDA device that `graph`'s buffers and inputs are on, if that
    is all of them but CPU ones and torch has the allocator that Inductor's wrappers use
    too (the generated call then runs under that device's guard and allocates through
    `empty_strided_cuda`, which takes the current device and skips torch.empty_strided's
    Python argument parsing); else None."""
    from ..runtime.wrapper_helpers import empty_strided_cuda
    buffers = [*graph.graph_inputs.values(), *graph.name_to_buffer.values()]
    devices = {getattr(getattr(b, "layout", None), "device", None) for b in buffers}
    cuda = {d for d in devices if d is not None and d.type != "cpu"}
    if empty_strided_cuda is None or len(cuda) != 1:
        return None
    (device,) = cuda
    return device.index if device.type == "cuda" else None


class WrapperCodeGen:
    def __init__(self, graph):
        self.graph = graph
        self.kernel_defs = IndentedBuffer()
        self.body = IndentedBuffer(1)
        self.kernel_sources = []       # each kernel defined, once
        self.kernel_names = []         # their names, in the same order
        self.kernel_by_identity = {}   # what makes a kernel the same as another -> its name
        self.kernel_count = 0
        self.allocated = set()
        self.module_imports = set()
        self.memory_plan = MemoryPlan()   # set by the compile pipeline before code generation
        self.cuda_index = _only_cuda_index(graph)   # set: call() runs on that device (DeviceGuard)

    # ---- used by backends -------------------------------------------------------------
    def kernel_name(self, prefix, origins) -> str:
        parts = [o for o in origins if o][:6]
        name = f"{prefix}_fused_{'_'.join(parts)}_{self.kernel_count}" if parts else f"{prefix}_{self.kernel_count}"
        self.kernel_count += 1
        return name

    def writeline(self, line: str):
        self.body.writeline(line)

    def add_kernel_source(self, source: str, name: str):
        self.kernel_sources.append(source)
        self.kernel_names.append(name)

    def define_kernel_once(self, identity, prefix, origins):
        """(name, new): the name of the kernel that `identity` (its source but the name,
        and whatever else its definition holds) stands for; new if it is the first of its
        kind in this graph. Identical kernels, such as one per transformer layer, are
        defined once and called at each place."""
        name = self.kernel_by_identity.get(identity)
        if name is not None:
            metrics.kernel_dedup_hits += 1
            return name, False
        name = self.kernel_by_identity[identity] = self.kernel_name(prefix, origins)
        return name, True

    def define_triton_kernel(self, kernel):
        """(name, new) for a rendered `TritonKernelDefinition`; the first of its kind gets
        a launcher in the module's kernel section."""
        name, new = self.define_kernel_once(kernel.identity(), kernel.prefix, kernel.origins)
        if not new:
            return name, False
        arguments = kernel.launcher_arguments(name)
        self.add_kernel_source(arguments["source"], name)
        if "persistent_source" in arguments:   # the form for rows that fit in registers
            self.add_kernel_source(arguments["persistent_source"], f"{name}_persistent")
        self.kernel_defs.writeline(f"{name} = {kernel.launcher_class}(")
        with self.kernel_defs.indent():
            for key, value in arguments.items():
                if key.endswith("source"):   # the string is `value` exactly (see _source_lines)
                    self.kernel_defs.writeline(f"{key}='''\\")
                    self._source_lines(value)
                    self.kernel_defs.lines.append("''',")
                else:
                    self.kernel_defs.writeline(f"{key}={_launcher_literal(value)},")
        self.kernel_defs.writeline(")")
        self.kernel_defs.writeline("")
        self.module_imports.add("triton")
        return name, True

    def _source_lines(self, source):
        """`source` as the lines of a triple-quoted string that a line ending in a backslash
        opens: the string equals `source` if it ends in one newline and no other space
        (kernel definitions make them so: compiles are keyed by the exact text)."""
        for line in source.rstrip().splitlines():
            self.kernel_defs.lines.append(line.replace("\\", "\\\\").replace("'''", "\\'\\'\\'"))

    def define_raw(self, text: str):
        """Module-level code a backend needs (e.g. a loaded C++ library)."""
        self.kernel_defs.splice(text)

    def allocate(self, buffer):
        if buffer.name in self.allocated:
            return
        self.allocated.add(buffer.name)
        target = memory_target(buffer)   # a scatter's target, a cat's slice before this one
        if target is not None:
            self.writeline(f"{buffer.name} = {target.name}  # written in place")
            return
        layout = buffer.layout
        size, stride = _shape(layout.size), _shape(layout.stride)
        if buffer.name in self.memory_plan.takes:
            kind, source = self.memory_plan.takes[buffer.name]
            self.allocated.discard(source)
            old = self.graph.name_to_buffer[source].layout
            if sym.same_sizes(old.size, layout.size) and sym.same_sizes(old.stride, layout.stride):
                self.writeline(f"{buffer.name} = {source}; del {source}  # {kind}")
            else:
                self.writeline(f"{buffer.name} = reinterpret_tensor({source}, {size}, {stride}, 0); "
                               f"del {source}  # {kind}")
            return
        if layout.device.type == "cpu":
            self.writeline(f"{buffer.name} = empty_strided_cpu({size}, {stride}, {layout.dtype})")
        elif layout.device.type == "cuda" and layout.device.index == self.cuda_index:
            self.writeline(f"{buffer.name} = empty_strided_cuda({size}, {stride}, {layout.dtype})")
        else:
            self.writeline(f"{buffer.name} = empty_strided({size}, {stride}, device={str(layout.device)!r}, "
                           f"dtype={layout.dtype})")

    def allocate_outputs(self, group, internal):
        for node in sorted(group.nodes, key=lambda n: n.position):
            if node.name not in internal:
                self.allocate(node.buffer)

    # ---- driven by the compile pipeline -----------------------------------------------
    def codegen_fallback(self, node):
        kernel = node.kernel
        args = ", ".join(py_literal(a) for a in kernel.args)
        kwargs = ", ".join(f"{k}={py_literal(v)}" for k, v in kernel.kwargs.items())
        call = f"{op_call_reference(kernel.op)}({', '.join(p for p in (args, kwargs) if p)})"
        planned = [out for out in kernel.outputs if out.name in self.memory_plan.takes]
        if planned:   # into a dead buffer, through the op's out= overload (memory_planning.py)
            self.codegen_aten_call(self.graph.name_to_buffer[planned[0].name], kernel.op, kernel.args,
                                   kernel.kwargs, f"fallback: {kernel.reason}")
            return
        self.writeline(f"# fallback: {kernel.op} ({kernel.reason})")
        results = [(out.name, out.path) for out in kernel.outputs] + \
                  [(str(symbol), path) for symbol, path in kernel.scalar_outputs]
        if not results:
            self.writeline(call)
            return
        if len(results) == 1 and results[0][1] == ():
            self.writeline(f"{results[0][0]} = {call}")
        else:
            self.writeline(f"{kernel.name}_result = {call}")
            for name, path in results:
                picks = "".join(f"[{i}]" for i in path)
                self.writeline(f"{name} = {kernel.name}_result{picks}")
            self.writeline(f"del {kernel.name}_result")
        for out in kernel.outputs:
            self.allocated.add(out.name)

    def codegen_aten_call(self, buffer, op, args, kwargs, reason):
        """``op(*args, **kwargs)`` written into ``buffer`` (allocated as the memory plan
        says) through the op's out= overload: an aten op (``aten.mm.default``) with one
        tensor result, with a comment saying why it runs on aten."""
        arguments = [py_literal(a) for a in args] + [f"{k}={py_literal(v)}" for k, v in kwargs.items()]
        self.writeline(f"# aten: {op} ({reason})")
        self.allocate(buffer)
        packet = op.overloadpacket
        out = getattr(packet, "out", None)
        out_overload = op_call_reference(out) if out is not None else f"torch.ops.aten.{packet.__name__}.out"
        self.writeline(f"{out_overload}({', '.join(arguments + [f'out={buffer.name}'])})")

    def free(self, names):
        names = sorted(n for n in names if n in self.allocated or n in self.graph.graph_inputs)
        if names:
            self.writeline(f"del {', '.join(names)}")

    def generate(self) -> str:
        graph = self.graph
        code = IndentedBuffer()
        code.writeline(f"# tritonfuse generated code for {graph.graph_id}")
        code.writeline("import torch")
        code.writeline("from tritonfuse.runtime.wrapper_helpers import empty_strided, empty_strided_cpu, "
                       "empty_strided_cuda, ensure_layout, reinterpret_tensor")
        if "triton" in self.module_imports:
            code.writeline("from tritonfuse.runtime.heuristics import Config")
            code.writeline("from tritonfuse.runtime.dynamic_launcher import DynamicTritonLauncher")
            code.writeline("from tritonfuse.runtime.triton_launcher import TritonLauncher")
        code.writeline("")
        code.splice(self.kernel_defs)
        code.writeline("")
        if self.memory_plan.overwritten_inputs:   # donated inputs written over (memory_planning.py)
            code.writeline(f"OVERWRITTEN_INPUTS = {self.memory_plan.overwritten_inputs!r}")
        written = sorted(set(self.memory_plan.written_inputs.values()), key=graph.input_order.index)
        if written:   # inputs the graph writes into (lowering/input_mutation.py)
            code.writeline(f"MUTATED_INPUTS = {tuple(graph.input_order.index(n) for n in written)!r}")
        if self.cuda_index is not None:
            code.writeline("def call(args):")
            with code.indent():
                code.writeline(f"with torch.cuda._DeviceGuard({self.cuda_index}):   # where empty_strided_cuda "
                               "allocates")
                code.writeline("    return call_on_device(args)")
            code.writeline("")
            code.writeline("")
        code.writeline("def call_on_device(args):" if self.cuda_index is not None else "def call(args):")
        with code.indent():
            names = list(graph.input_order)
            if names:
                code.writeline(f"{', '.join(names)}, = args")
            code.writeline("args.clear()")
            for symbol, source in sorted(graph.symbol_sources.items(), key=lambda item: item[0].name):
                if source is not None and source != symbol.name:
                    code.writeline(f"{symbol} = {source}")
            for name in (n for n in names if n in graph.graph_inputs):
                layout = graph.graph_inputs[name].layout
                if name in written:   # the caller's tensor, to copy the new value back into
                    code.writeline(f"{name}_given = {name}")
                code.writeline(f"{name} = ensure_layout({name}, {_shape(layout.size)}, {_shape(layout.stride)})")
            for name in graph.constants:
                code.writeline(f"{name} = CONSTANTS[{name!r}]")
            if self.memory_plan.unused_inputs:
                code.writeline(f"del {', '.join(self.memory_plan.unused_inputs)}")
        code.splice(self.body)
        with code.indent():
            for name in written:   # written into a copy in the layout the code was compiled for
                code.writeline(f"if {name} is not {name}_given: {name}_given.copy_({name})")
            code.writeline(f"return {_shape(self._output_exprs())}")
        return code.getvalue()

    def _output_exprs(self):
        return [py_literal(out) for out in self.graph.outputs]


