"""WrapperCodeGen: the generated host code of one compiled graph.

It is a Python module with the kernels defined at the top and one ``call(args)``
function that allocates buffers (empty_strided) or takes over dead ones as the memory
plan says (memory_planning.py), launches kernels, calls fallbacks, frees each buffer
after its last use and returns the outputs with eager's layouts.
"""
import math

import sympy
import torch

from .. import sym
from ..ir import Buffer, ReinterpretView
from .common import IndentedBuffer, pexpr
from .memory_planning import MemoryPlan


def _shape(values):
    return "(" + "".join(f"{pexpr(v)}, " for v in values) + ")"


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
    if isinstance(value, (bool, int, str)) or value is None:
        return repr(value)
    if isinstance(value, sympy.Basic):
        return pexpr(value)
    raise NotImplementedError(f"cannot pass {type(value).__name__} to a fallback")


class WrapperCodeGen:
    def __init__(self, graph):
        self.graph = graph
        self.kernel_defs = IndentedBuffer()
        self.body = IndentedBuffer(1)
        self.kernel_sources = []
        self.kernel_count = 0
        self.allocated = set()
        self.module_imports = set()
        self.memory_plan = MemoryPlan()   # set by the compile pipeline before code generation

    # ---- used by backends -------------------------------------------------------------
    def kernel_name(self, prefix, origins) -> str:
        parts = [o for o in origins if o][:6]
        name = f"{prefix}_fused_{'_'.join(parts)}_{self.kernel_count}" if parts else f"{prefix}_{self.kernel_count}"
        self.kernel_count += 1
        return name

    def writeline(self, line: str):
        self.body.writeline(line)

    def add_kernel_source(self, source: str):
        self.kernel_sources.append(source)

    def define_triton_kernel(self, name, source, kind, numels, configs, mutated, device_type, hint,
                             persistent_source=None):
        self.add_kernel_source(source)
        if persistent_source is not None:
            self.add_kernel_source(persistent_source)
        configs_text = ", ".join(f"Config.from_dict({c.to_dict()!r})" for c in configs or ())
        launcher = "TritonLauncher" if numels is not None else "DynamicTritonLauncher"
        self.kernel_defs.writeline(f"{name} = {launcher}(")
        with self.kernel_defs.indent():
            self.kernel_defs.writeline(f"name={name!r}, kind={kind!r}, numels={numels!r}, "
                                       f"mutated_arg_indices={mutated!r}, device_type={device_type!r},")
            configs_arg = f"[{configs_text}]" if configs is not None else "None"
            self.kernel_defs.writeline(f"reduction_hint={hint!r}, configs={configs_arg},")
            if persistent_source is not None:   # the form for rows that fit in registers
                self.kernel_defs.writeline("persistent_source='''")
                self._source_lines(persistent_source)
                self.kernel_defs.lines.append("''',")
            self.kernel_defs.writeline("source='''")
        self._source_lines(source)
        self.kernel_defs.lines.append("''')")
        self.kernel_defs.writeline("")
        self.module_imports.add("triton")

    def _source_lines(self, source):
        for line in source.rstrip().splitlines():
            self.kernel_defs.lines.append(line.replace("\\", "\\\\").replace("'''", "\\'\\'\\'"))

    def define_raw(self, text: str):
        """Module-level code a backend needs (e.g. a loaded C++ library)."""
        self.kernel_defs.splice(text)

    def allocate(self, buffer):
        if buffer.name in self.allocated:
            return
        self.allocated.add(buffer.name)
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
        call = f"torch.ops.{kernel.op}({', '.join(p for p in (args, kwargs) if p)})"
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

    def free(self, names):
        names = sorted(n for n in names if n in self.allocated)
        if names:
            self.writeline(f"del {', '.join(names)}")

    def generate(self) -> str:
        graph = self.graph
        code = IndentedBuffer()
        code.writeline(f"# tritonfuse generated code for {graph.graph_id}")
        code.writeline("import torch")
        code.writeline("from tritonfuse.runtime.wrapper_helpers import empty_strided, empty_strided_cpu, ensure_layout, "
                       "reinterpret_tensor")
        if "triton" in self.module_imports:
            code.writeline("from tritonfuse.runtime.heuristics import Config")
            code.writeline("from tritonfuse.runtime.triton_launcher import DynamicTritonLauncher, TritonLauncher")
        code.writeline("")
        code.splice(self.kernel_defs)
        code.writeline("")
        code.writeline("def call(args):")
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
                code.writeline(f"{name} = ensure_layout({name}, {_shape(layout.size)}, {_shape(layout.stride)})")
            for name in graph.constants:
                code.writeline(f"{name} = CONSTANTS[{name!r}]")
        code.splice(self.body)
        with code.indent():
            code.writeline(f"return {_shape(self._output_exprs())}")
        return code.getvalue()

    def _output_exprs(self):
        return [py_literal(out) for out in self.graph.outputs]


