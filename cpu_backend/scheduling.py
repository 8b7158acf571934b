"""CppScheduling: the OpenMP C++ backend's side of the scheduler interface.

All kernels of one compiled graph go into one C++ source, built once into one library
(cached on disk by source + flags) when the generated module loads; each kernel is called
through ctypes with its tensors' data pointers. Each kernel is opened by a marker line
(build.kernel_library_source): a large library compiles as several translation units at
once, each with the header and some of the kernels.
"""
import torch

from tritonfuse import metrics
from tritonfuse.codegen.backend_interface import BackendScheduling
from tritonfuse.codegen.common import KERNEL_NAME_PLACEHOLDER, name_kernel
from tritonfuse.codegen.loops import plan_segments
from tritonfuse.dependencies import coarsening_groups, plan_and_deps

from .build import default_num_threads, kernel_library_source
from .kernel import CppKernel

SCAN_KERNEL_REDUCTIONS = ("sum", "prod", "max", "min", "any", "all")   # one accumulator each, scalar or lanes

# The prelude of every translation unit of a library: it must define nothing of external
# linkage (see kernel_library_source).
HEADER = """// tritonfuse generated C++ kernels
#include "tf_kernel.h"
"""


class CppScheduling(BackendScheduling):
    # exp(x - max) in softmax is read by the sum and the division: keep it in a
    # row-sized local buffer rather than compute exp twice
    materialize_expensive_reuse = True
    # a row of up to 16k floats (64 KB) stays in L1/L2 between the two passes, which then
    # beat Welford's longer dependency chain; longer rows take one Welford pass
    two_pass_variance_max_row = 16384
    # except rows read along a strided dim: their lanes are rows, and each pass is a loop
    # that streams the rows again. 2 threads, one run each way (graph cache off): layer_norm
    # of x.t() f32 2048x512 436 -> 219 us, 4096x256 262 -> 198, 513x1531 213 -> 171,
    # 1024x768 180 -> 166; var_mean(x.t(), -1) 2048x512 110 -> 70; std(x.t(), -1) 513x1531
    # 137 -> 90; group_norm of channels-last 8x64x28x28 515 -> 410. On a quiet machine,
    # layer_norm 2048x512 f32 297-306 -> 173 us (Inductor 240-285).
    welford_for_strided_rows = True

    def __init__(self, scheduler, wrapper, graph):
        super().__init__(scheduler, wrapper, graph)
        self.kernels = []   # (name, source, pointer args, size arg types, returns zero_division)
        self.library = None

    # indirect writes run in loops that give each element its writes in order (scatter.py)
    scatter_dtypes = {mode: {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
                             torch.int32, torch.int64, torch.uint8}
                      for mode in ("sum", "prod", "max", "min")}
    deterministic_scatter = True

    # ---- fusion rules -----------------------------------------------------------------
    def can_fuse_vertical(self, first, second, merged) -> bool:
        return self._same_loop_nest(merged) and self._scan_and_scatter_kernels(merged)

    def can_fuse_horizontal(self, first, second, merged) -> bool:
        return self._same_loop_nest(merged) and self._scan_and_scatter_kernels(merged)

    @staticmethod
    def _scan_and_scatter_kernels(merged) -> bool:
        """A scatter kernel holds the scatter alone (scatter.py); a scan kernel is one loop
        along the scanned dim holding scans, pointwise nodes over the same elements and
        plain reductions of the rows (scan.py)."""
        layouts = merged.node_layouts()
        if any(node.mutated_name is not None for node, _, _, _ in layouts):
            return False
        if not any(kind == "scan" for _, _, _, kind in layouts):
            return True
        plain = all(kind in ("scan", "xr") or (kind == "reduction" and node.buffer.data.reduction_type in
                                                 SCAN_KERNEL_REDUCTIONS) for node, _, _, kind in layouts)
        return plain and len(plan_segments(layouts)) == 1

    @staticmethod
    def _same_loop_nest(merged) -> bool:
        """Every node must walk the same row positions, and the same reduced dims when it
        has any: the C++ kernel is one loop nest. Row dims may differ in how far they
        merged ((8192,) and (8, 1024)): the kernel walks the finest and the others follow."""
        x_shapes, r_shapes = set(), set()
        for node, xs, rs, kind in merged.node_layouts():
            plan, _, _ = plan_and_deps(node.buffer, xs, rs)
            x_shapes.add(tuple(plan.x_sizes))
            if kind != "x":
                r_shapes.add(tuple(plan.r_sizes))
        finest = max(x_shapes, key=len)
        return all(coarsening_groups(finest, shape) is not None for shape in x_shapes) and len(r_shapes) <= 1

    # ---- code generation --------------------------------------------------------------
    def codegen_node(self, group) -> None:
        internal = self.scheduler.internal_buffers(group)
        in_place = self.wrapper.memory_plan.in_place_outputs(group.names)
        kernel = CppKernel(group, internal, self.graph, KERNEL_NAME_PLACEHOLDER, default_num_threads(), in_place)
        template = kernel.generate()
        if group.r_numel != 1:
            segments = plan_segments(group.node_layouts())
            loops = sum(1 for s in segments if s.is_loop)
            if loops > 1:
                metrics.outer_loop_fusions.append(metrics.OuterLoopFusion(loops, len(kernel.local_buffers)))
        call_args = kernel.args.call_order()
        # identical loop nests (one per layer of a model) are one function in the library
        name, new = self.wrapper.define_kernel_once(template, "cpp", group.origins)
        if new:
            source = name_kernel(template, name)
            size_types = ["double" if s.name.startswith("z") else "int64" for s in kernel.size_args]
            self.kernels.append((name, source, len(call_args), size_types, kernel.checks_division))
            self.wrapper.add_kernel_source(source, name)
        self.wrapper.allocate_outputs(group, kernel.internal)
        arguments = [f"{buffer}.data_ptr()" for _, buffer in call_args] + [str(s) for s in kernel.size_args]
        if kernel.checks_division:   # it returns whether an integer division met a zero divisor
            self.wrapper.writeline(f"if {name}({', '.join(arguments)}):")
            self.wrapper.writeline("    raise_integer_division_by_zero()")
        else:
            self.wrapper.writeline(f"{name}({', '.join(arguments)})")
        metrics.record_kernel(name)

    def flush(self) -> None:
        if not self.kernels:
            return
        source = kernel_library_source(HEADER, [(name, src) for name, src, *_ in self.kernels])
        lines = ["from cpu_backend.build import KernelCallable, load_kernel_library",
                 "cpp_library = load_kernel_library('''" + source.replace("\\", "\\\\") + "''')"]
        if any(checks for *_, checks in self.kernels):
            lines.append("from tritonfuse.runtime.integer_errors import raise_integer_division_by_zero")
        for name, _, nargs, size_types, checks in self.kernels:
            returns = ", returns_int=True" if checks else ""
            if size_types:   # sizes (int64) and float scalars (double) after the pointers
                types = ", ".join(["ctypes.c_void_p"] * nargs + [f"ctypes.c_{t}" for t in size_types])
                lines.append(f"{name} = KernelCallable(cpp_library, {name!r}, argtypes=[{types}]{returns})")
            else:
                lines.append(f"{name} = KernelCallable(cpp_library, {name!r}, {nargs}{returns})")
        if any(size_types for _, _, _, size_types, _ in self.kernels):
            lines.insert(0, "import ctypes")
        self.wrapper.define_raw("\n".join(lines) + "\n")

