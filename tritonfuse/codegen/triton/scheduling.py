"""TritonScheduling: the Triton backend's side of the scheduler interface.

Registered for "cuda" (compiled kernels) and, through ``InterpretedTritonScheduling``,
for "cpu" tensors when ``config.cpu_backend == "triton"`` (Triton's interpreter).
"""
import dataclasses
import functools
import os

import jinja2
import sympy

from ... import config, metrics
from ...dependencies import plan_and_deps
from ...runtime import async_compile
from ...runtime.heuristics import NUMEL_ARGS, candidate_configs, is_persistent_reduction_ok
from ..backend_interface import BackendScheduling
from ..common import KERNEL_NAME_PLACEHOLDER, name_kernel
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
    TritonLauncher per distinct definition) and the compile pool builds.

    template: the source, its kernel named KERNEL_NAME_PLACEHOLDER; configs: candidate
    launch configs; mutated: run() positions written; pointer_dtypes: dtypes of the tensor
    arguments; device_index: the CUDA device compiled for (None when interpreted).
    """
    prefix: str
    origins: tuple
    template: str
    kind: str
    numels: dict
    configs: tuple
    mutated: tuple
    device_type: str
    device_index: "int | None"
    hint: "str | None"
    pointer_dtypes: tuple

    def identity(self) -> tuple:
        """Equal for kernels that can share one definition."""
        return (self.template, self.kind, tuple(sorted(self.numels.items())), self.configs, self.mutated,
                self.device_type, self.device_index, self.hint, self.pointer_dtypes)

    def source(self, name: str) -> str:
        return name_kernel(self.template, name)


class TritonScheduling(BackendScheduling):
    online_softmax = True
    ops_table = TRITON_OPS
    use_libdevice = True
    launcher_device = "cuda"

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
        hint = self._reduction_hint(group) if group.r_numel > 1 else None
        kind, numels = self._kind(group, hint)
        configs = candidate_configs(kind, numels, config.autotune, hint=hint)
        internal = self.scheduler.internal_buffers(group)
        kernel = TritonKernel(group, internal, self.graph, self.ops_table, configs, kind, numels)
        kernel.generate()
        call_args = kernel.args.call_order()
        numel_names = [f"{axis}numel" for axis in NUMEL_ARGS[kind]]
        block_names = [f"{axis.upper()}BLOCK" for axis in NUMEL_ARGS[kind]]
        signature = [param for param, _ in call_args] + numel_names + [f"{b}: tl.constexpr" for b in block_names]
        template = _templates.get_template("kernel.py.j2").render(
            name=KERNEL_NAME_PLACEHOLDER, kind=kind, signature=", ".join(signature), x_numel=group.x_numel,
            r_numel=group.r_numel, origins=", ".join(group.origins), int64=kernel.use_int64,
            needs_xmask=kernel.needs_xmask, needs_rmask=kernel.needs_rmask, needs_ymask=kernel.needs_ymask,
            use_libdevice=self.use_libdevice, body=kernel.body_lines().getvalue().rstrip(),
        )
        n_inputs = len(kernel.args.inputs)
        definition = TritonKernelDefinition(
            prefix=PREFIXES[kind], origins=tuple(group.origins), template=template, kind=kind, numels=numels,
            configs=tuple(configs), mutated=tuple(range(n_inputs, n_inputs + len(kernel.args.outputs))),
            device_type=self.launcher_device, device_index=self._device_index(group.device), hint=hint,
            pointer_dtypes=tuple(self.graph.get_dtype(buffer) for _, buffer in call_args))
        name, new = self.wrapper.define_triton_kernel(definition)
        if new and definition.device_index is not None:
            # compiles in the background while the rest of the graph is generated
            _, _, existed = async_compile.precompile(name, definition.source(name), kind, numels, configs,
                                                     definition.pointer_dtypes, definition.device_index)
            metrics.kernel_dedup_hits += existed
        buffers = [buffer for _, buffer in call_args]
        self.wrapper.allocate_outputs(group, internal)
        numel_args = [str(numels[axis]) for axis in NUMEL_ARGS[kind]]
        self.wrapper.writeline(f"{name}.run({', '.join(buffers + numel_args)})")
        metrics.record_kernel(name)

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
        return ("persistent_reduction" if is_persistent_reduction_ok(numels, hint) else "reduction"), numels

    @staticmethod
    def _reduction_hint(group):
        """"outer" when the reductions read memory that is contiguous along x, not r."""
        for node, x_sizes, r_sizes, kind in group.node_layouts():
            if kind != "reduction":
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

    @staticmethod
    def _device_index(device):
        return None

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
        shapes.add(tuple(sympy.Integer(s) for s in plan.x_sizes))
        n = len(plan.x_sizes)
        if n < 2:
            return None
        last = sympy.Symbol(f"x{n - 1}", integer=True, nonnegative=True)
        for dep in reads:
            if dep.name in group.names or dep.indirect:
                continue
            stride_last = sympy.diff(dep.index, last)
            others = [sympy.diff(dep.index, sympy.Symbol(f"x{i}", integer=True, nonnegative=True)) for i in range(n - 1)]
            if stride_last != 1 and stride_last != 0 and any(o == 1 for o in others):
                transposed = True
    if not transposed or len(shapes) != 1:
        return None
    sizes = [int(s) for s in shapes.pop()]
    y = 1
    for s in sizes[:-1]:
        y *= s
    return y, sizes[-1]
