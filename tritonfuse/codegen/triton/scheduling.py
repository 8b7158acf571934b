"""TritonScheduling: the Triton backend's side of the scheduler interface.

Registered for "cuda" (compiled kernels) and, through ``InterpretedTritonScheduling``,
for "cpu" tensors when ``config.cpu_backend == "triton"`` (Triton's interpreter).
"""
import dataclasses
import functools
import os

import jinja2
import sympy
import torch

from ... import config, metrics, sym
from ...dependencies import plan_and_deps
from ...runtime import async_compile
from ...runtime.heuristics import NUMEL_ARGS, candidate_configs, is_persistent_reduction_ok
from ..backend_interface import BackendScheduling
from ..common import KERNEL_NAME_PLACEHOLDER, name_kernel, pexpr
from .gemm_choice import MatmulChoice
from .gemm_template import codegen_template
from .kernel import TritonKernel
from .overrides import INTERPRETER_OPS, TRITON_OPS

_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
)

PREFIXES = {"pointwise": "triton_poi", "pointwise_2d": "triton_poi_tiled", "persistent_reduction": "triton_per",
            "reduction": "triton_red"}


@dataclasses.dataclass(frozen=True)
class TritonKernelDefinition:
    """A rendered Triton kernel before it has a name: what the wrapper defines (one
    launcher per distinct definition) and the compile pool builds.

    template: the source, its kernel named KERNEL_NAME_PLACEHOLDER; numels and configs:
    the sizes and candidate launch configs, None for symbolic sizes (the launcher then
    chooses per size bucket at launch); mutated: run() positions written; pointer_dtypes:
    dtypes of the tensor arguments; device_index: the CUDA device compiled for (None when
    interpreted); persistent_template: a looped reduction's persistent form, for the
    launches whose rows fit; example_scalars: run()'s integer arguments at the example
    sizes (None if one has no example value), the launch compiled for ahead; max_xblock:
    the widest XBLOCK a kernel of symbolic sizes generated without xmask allows.
    """
    prefix: str
    origins: tuple
    template: str
    kind: str
    numels: "dict | None"
    configs: "tuple | None"
    mutated: tuple
    device_type: str
    device_index: "int | None"
    hint: "str | None"
    pointer_dtypes: tuple
    persistent_template: "str | None" = None
    example_scalars: "tuple | None" = None
    max_xblock: "int | None" = None

    def identity(self) -> tuple:
        """Equal for kernels that can share one definition."""
        numels = tuple(sorted(self.numels.items())) if self.numels is not None else None
        return (self.template, self.kind, numels, self.configs, self.mutated, self.device_type, self.device_index,
                self.hint, self.pointer_dtypes, self.persistent_template, self.example_scalars, self.max_xblock)

    def source(self, name: str) -> str:
        """The kernel called `name`, as the generated module holds it (compiles and Triton's
        on-disk cache are keyed by this exact text, in every process)."""
        return _module_text(name_kernel(self.template, name))

    @property
    def launcher_class(self) -> str:
        """The class generated code makes: kernels of symbolic sizes choose at launch."""
        return "TritonLauncher" if self.numels is not None else "DynamicTritonLauncher"

    def launcher_arguments(self, name: str) -> dict:
        """The launcher's keyword arguments, as generated code passes them."""
        arguments = dict(name=name, kind=self.kind, numels=self.numels, mutated_arg_indices=list(self.mutated),
                         device_type=self.device_type, reduction_hint=self.hint,
                         configs=list(self.configs) if self.configs is not None else None)
        if self.device_index is not None and self.example_scalars is not None:
            # compiled: what to compile ahead (the example's launch), and for which device
            arguments.update(pointer_dtypes=self.pointer_dtypes, device_index=self.device_index,
                             example_scalars=self.example_scalars)
        if self.max_xblock is not None:
            arguments["max_xblock"] = self.max_xblock
        if self.persistent_template is not None:
            arguments["persistent_source"] = _module_text(name_kernel(self.persistent_template, name))
        arguments["source"] = self.source(name)
        return arguments

    def precompile(self, name: str) -> bool:
        """Start compiling the binaries the generated launcher will want first (making it
        does that); True if they all existed already (an identical kernel met before)."""
        if self.device_index is None or self.example_scalars is None:
            return False
        from ...runtime.dynamic_launcher import DynamicTritonLauncher
        from ...runtime.triton_launcher import TritonLauncher
        launcher_class = TritonLauncher if self.numels is not None else DynamicTritonLauncher
        return launcher_class(**self.launcher_arguments(name)).precompiled


@dataclasses.dataclass(frozen=True)
class LoopsKernel:
    """A loop kernel's definition and what its call passes: the buffers (in signature
    order), then the size and numel arguments as printed; checks_division: a
    zero_division_ptr follows the buffers."""
    definition: TritonKernelDefinition
    buffers: list
    scalar_args: list
    checks_division: bool


def _module_text(source: str) -> str:
    return source.rstrip() + "\n"


def _example_scalars(sizes) -> "tuple | None":
    """The example values of integer kernel arguments (sizes, size symbols), or None when
    one has none: an unbacked size, or a float symbol."""
    if any(not s.is_integer for s in map(sympy.sympify, sizes) if not s.is_number):
        return None
    try:
        return tuple(sym.hint(s) for s in sizes)
    except (ValueError, TypeError):
        return None


class TritonScheduling(BackendScheduling):
    online_softmax = True
    ops_table = TRITON_OPS
    use_libdevice = True
    launcher_device = "cuda"
    reports_zero_division = False   # as eager on CUDA: an integer division by zero raises nothing
    imports_zero_division = False   # the wrapper imports raise_integer_division_by_zero
    # indirect writes that combine with the element are atomics (kernel.py, _ATOMIC_OPS):
    # tl.atomic_add/max/min on these dtypes in triton 3.6 and 3.9 (half floats go
    # through a float32 copy in lowering; tl has no atomic multiply). Float max/min are
    # left out: tl.atomic_max/min compare floats as integers, by sign, so a NaN of one
    # sign loses to every number (eager's scatter_reduce amax/amin propagate NaN).
    scatter_dtypes = {
        "sum": {torch.float32, torch.float64, torch.int32, torch.int64},
        "max": {torch.int32, torch.int64},
        "min": {torch.int32, torch.int64},
    }
    deterministic_scatter = False   # atomic float sums land in any order
    # the GEMM template (max-autotune): the matmuls it takes and its choice against aten
    matmul_choice = MatmulChoice(_templates, "cuda", (torch.float16, torch.bfloat16, torch.float32),
                                 use_libdevice=True)

    def __init__(self, scheduler, wrapper, graph):
        super().__init__(scheduler, wrapper, graph)
        if self.launcher_device == "cuda":
            async_compile.pool().start()   # worker processes start while the graph is scheduled

    @staticmethod
    def split_reduction_target(device) -> int:
        """Programs to keep a GPU busy: a few per SM (see lowering/split_reduction.py)."""
        return 4 * _multiprocessor_count(device)

    def can_fuse_vertical(self, first, second, merged) -> bool:
        return True

    def can_fuse_horizontal(self, first, second, merged) -> bool:
        return True

    def codegen_node(self, group) -> None:
        internal = self.scheduler.internal_buffers(group)
        if group.template is not None:
            codegen_template(self, group, internal, _templates)
        else:
            self.codegen_loops(group, internal)

    def codegen_loops(self, group, internal) -> None:
        """The kernel of a group of loop nodes (pointwise, reductions) and its call;
        ``internal``: the buffers that live only inside the kernel."""
        loops = self.loops_kernel(group, internal)
        name, new = self.wrapper.define_triton_kernel(loops.definition)
        if new:   # compiles in the background while the rest of the graph is generated
            metrics.kernel_dedup_hits += loops.definition.precompile(name)
        self.wrapper.allocate_outputs(group, internal)
        if loops.checks_division:
            self._call_reporting_zero_division(name, loops.buffers, loops.scalar_args)
        else:
            self.wrapper.writeline(f"{name}.run({', '.join(loops.buffers + loops.scalar_args)})")
        metrics.record_kernel(name)

    def loops_kernel(self, group, internal, in_place=None) -> LoopsKernel:
        """The rendered kernel of a group of loop nodes, not yet defined in the wrapper
        (the GEMM choice also times a prologue's producer kernel this way: gemm_choice.py).
        ``in_place``: None asks the wrapper's memory plan."""
        hint = self._reduction_hint(group) if group.r_numel != 1 else None
        kind, numels = self._kind(group, hint)
        static = all(sym.is_static(n) for n in numels.values())
        # symbolic sizes: the launcher picks configs at each launch from the actual sizes
        configs = candidate_configs(kind, {k: sym.to_int(v) for k, v in numels.items()}, config.autotune,
                                    hint=hint) if static else None
        report = self.reports_zero_division
        if in_place is None:
            in_place = self.wrapper.memory_plan.in_place_outputs(group.names)
        kernels = {kind: TritonKernel(group, internal, self.graph, self.ops_table, configs, kind, numels,
                                      report_zero_division=report, in_place=in_place)}
        if not static and kind == "reduction":
            # a row length known only at run time: a persistent form too, for the launches
            # whose rows fit in registers (the launcher chooses by the actual length)
            kernels["persistent_reduction"] = TritonKernel(group, internal, self.graph, self.ops_table, None,
                                                           "persistent_reduction", numels,
                                                           report_zero_division=report, in_place=in_place)
        for kernel in kernels.values():
            kernel.generate()
        symbols = {str(s): s for k in kernels.values() for s in k.size_symbols}
        size_args = sorted(symbols, key=lambda n: (len(n), n))
        # rendered unnamed: kernels identical but for their name share one definition
        templates = {k: self._render(KERNEL_NAME_PLACEHOLDER, k, kernel, group, size_args)
                     for k, kernel in kernels.items()}
        kernel = kernels[kind]
        call_args = kernel.args.call_order()
        flag = 1 if kernel.checks_division else 0   # zero_division_ptr, written by the kernel
        pointer_dtypes = tuple(self.graph.get_dtype(buffer) for _, buffer in call_args) + (torch.int32,) * flag
        numel_args = [pexpr(numels[axis]) for axis in NUMEL_ARGS[kind]]
        definition = TritonKernelDefinition(
            prefix=PREFIXES[kind], origins=tuple(group.origins), template=templates[kind], kind=kind,
            numels={k: sym.to_int(v) for k, v in numels.items()} if static else None,
            configs=tuple(configs) if static else None,
            mutated=tuple(kernel.args.written_positions() + [len(call_args)] * flag),
            device_type=self.launcher_device, device_index=self._device_index(group.device), hint=hint,
            pointer_dtypes=pointer_dtypes, persistent_template=templates["persistent_reduction"] if len(templates) > 1 else None,
            example_scalars=_example_scalars([symbols[n] for n in size_args] + [numels[a] for a in NUMEL_ARGS[kind]]),
            max_xblock=kernel.max_xblock)
        return LoopsKernel(definition, [buffer for _, buffer in call_args], size_args + numel_args,
                           kernel.checks_division)

    def _render(self, name, kind, kernel, group, size_args) -> str:
        numel_names = [f"{axis}numel" for axis in NUMEL_ARGS[kind]]
        block_names = [f"{axis.upper()}BLOCK" for axis in NUMEL_ARGS[kind]]
        flag = ["zero_division_ptr"] if kernel.checks_division else []
        signature = [param for param, _ in kernel.args.call_order()] + flag + size_args + numel_names + \
            [f"{b}: tl.constexpr" for b in block_names]
        return _templates.get_template("kernel.py.j2").render(
            name=name, kind=kind, signature=", ".join(signature), x_numel=group.x_numel, r_numel=group.r_numel,
            origins=", ".join(group.origins), int64=kernel.use_int64, needs_xmask=kernel.needs_xmask,
            needs_rmask=kernel.needs_rmask, needs_ymask=kernel.needs_ymask, use_libdevice=self.use_libdevice,
            body=kernel.body_lines().getvalue().rstrip(),
        )

    def _call_reporting_zero_division(self, name, buffers, scalar_args):
        if not self.imports_zero_division:
            self.wrapper.define_raw("from tritonfuse.runtime.integer_errors import raise_integer_division_by_zero\n")
            self.imports_zero_division = True
        self.wrapper.writeline("zero_division = torch.zeros(1, dtype=torch.int32)")
        self.wrapper.writeline(f"{name}.run({', '.join(buffers + ['zero_division'] + scalar_args)})")
        self.wrapper.writeline("if zero_division.item():")
        self.wrapper.writeline("    raise_integer_division_by_zero()")

    @staticmethod
    def _device_index(device):
        """The CUDA device a compiled kernel is built for (None: interpreted, nothing to build)."""
        import torch
        return device.index if device.index is not None else torch.cuda.current_device()

    @staticmethod
    def _kind(group, hint=None):
        if group.r_numel == 1:
            tile = _transposed_tiling(group)
            if tile is not None:
                return "pointwise_2d", {"y": tile[0], "x": tile[1]}
            return "pointwise", {"x": group.x_numel}
        numels = {"x": group.x_numel, "r": group.r_numel}
        if not sym.is_static(group.r_numel):   # a looped reduction serves every row length
            return "reduction", numels
        static = {k: sym.hint(v) for k, v in numels.items()}
        return ("persistent_reduction" if is_persistent_reduction_ok(static, hint) else "reduction"), numels

    @staticmethod
    def _reduction_hint(group):
        """"outer" when the reductions (or scans) read memory that is contiguous along x, not r."""
        for node, x_sizes, r_sizes, kind in group.node_layouts():
            if kind not in ("reduction", "scan"):
                continue
            plan, reads, _ = plan_and_deps(node.buffer, x_sizes, r_sizes)
            if not plan.r_sizes or not plan.x_sizes:
                continue
            r_last = sympy.Symbol(f"r{len(plan.r_sizes) - 1}", integer=True, nonnegative=True)
            x_last = sympy.Symbol(f"x{len(plan.x_sizes) - 1}", integer=True, nonnegative=True)
            for dep in reads:
                if sympy.diff(dep.index, x_last) == 1 and sympy.diff(dep.index, r_last) != 1:
                    return "outer"
            return "inner"
        return None


class InterpretedTritonScheduling(TritonScheduling):
    """Triton kernels on CPU tensors, run by Triton's interpreter (how CI tests them)."""
    ops_table = INTERPRETER_OPS
    use_libdevice = False
    launcher_device = "cpu"
    reports_zero_division = True    # CPU tensors: eager raises for an integer division by zero
    deterministic_scatter = True    # the interpreter runs programs, and their atomics, one after another

    @staticmethod
    def _device_index(device):
        return None
    # the interpreter's tl.dot multiplies bfloat16 operands as raw 16-bit integers
    matmul_choice = MatmulChoice(_templates, "cpu", (torch.float16, torch.float32), use_libdevice=False)

    @staticmethod
    def split_reduction_target(device) -> int:
        return 8   # as for a small GPU: CI runs the split path through the interpreter


@functools.lru_cache(None)
def _multiprocessor_count_cached(index) -> int:
    import torch
    return torch.cuda.get_device_properties(index).multi_processor_count


def _multiprocessor_count(device) -> int:
    import torch
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _multiprocessor_count_cached(index)


def _transposed_tiling(group):
    """(y, x) extents for a [YBLOCK, XBLOCK]-tiled pointwise kernel when some input is
    read transposed relative to the loop order (the output's), else None: Triton then
    loads each tile coalesced and transposes it through shared memory."""
    shapes, transposed = set(), False
    for node, x_sizes, r_sizes, _ in group.node_layouts():
        plan, reads, _ = plan_and_deps(node.buffer, x_sizes, r_sizes)
        shapes.add(tuple(sympy.expand(s) for s in plan.x_sizes))
        n = len(plan.x_sizes)
        if n < 2:
            return None
        last = sympy.Symbol(f"x{n - 1}", integer=True, nonnegative=True)
        for dep in reads:
            if dep.name in group.names or dep.indirect:
                continue
            stride_last = sympy.diff(dep.index, last)
            others = [sympy.diff(dep.index, sympy.Symbol(f"x{i}", integer=True, nonnegative=True)) for i in range(n - 1)]
            if stride_last != 1 and stride_last != 0 and any(o == 1 for o in others) \
                    and not (stride_last.free_symbols - sym.size_symbols(stride_last)):
                transposed = True
    if not transposed or len(shapes) != 1:
        return None
    sizes = list(shapes.pop())
    return sympy.expand(sym.product(sizes[:-1])), sizes[-1]
