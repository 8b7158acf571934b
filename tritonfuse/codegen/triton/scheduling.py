"""TritonScheduling: the Triton backend's side of the scheduler interface.

Registered for "cuda" (compiled kernels) and, through ``InterpretedTritonScheduling``,
for "cpu" tensors when ``config.cpu_backend == "triton"`` (Triton's interpreter).
"""
import functools
import os

import jinja2
import sympy

from ... import config, metrics, sym
from ...dependencies import plan_and_deps
from ...runtime.heuristics import candidate_configs, is_persistent_reduction_ok
from ..backend_interface import BackendScheduling
from ..common import pexpr
from .kernel import TritonKernel
from .overrides import INTERPRETER_OPS, TRITON_OPS

_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
)


class TritonScheduling(BackendScheduling):
    online_softmax = True
    ops_table = TRITON_OPS
    use_libdevice = True
    launcher_device = "cuda"
    reports_zero_division = False   # as eager on CUDA: an integer division by zero raises nothing
    imports_zero_division = False   # the wrapper imports raise_integer_division_by_zero

    @staticmethod
    def split_reduction_target(device) -> int:
        """Programs to keep a GPU busy: a few per SM (see lowering/split_reduction.py)."""
        return 4 * _multiprocessor_count(device)

    def can_fuse_vertical(self, first, second, merged) -> bool:
        return True

    def can_fuse_horizontal(self, first, second, merged) -> bool:
        return True

    def codegen_node(self, group) -> None:
        hint = self._reduction_hint(group) if group.r_numel != 1 else None
        kind, numels = self._kind(group, hint)
        static = all(sym.is_static(n) for n in numels.values())
        # symbolic sizes: the launcher picks configs at each launch from the actual sizes
        configs = candidate_configs(kind, {k: sym.to_int(v) for k, v in numels.items()}, config.autotune,
                                    hint=hint) if static else None
        internal = self.scheduler.internal_buffers(group)
        prefix = {"pointwise": "triton_poi", "pointwise_2d": "triton_poi_tiled", "persistent_reduction": "triton_per",
                  "reduction": "triton_red"}[kind]
        name = self.wrapper.kernel_name(prefix, group.origins)
        report = self.reports_zero_division
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
        size_args = sorted({str(s) for k in kernels.values() for s in k.size_symbols}, key=lambda n: (len(n), n))
        sources = {k: self._render(name, k, kernel, group, size_args) for k, kernel in kernels.items()}
        kernel = kernels[kind]
        call_args = kernel.args.call_order()
        flag = [len(call_args)] if kernel.checks_division else []   # zero_division_ptr, written by the kernel
        mutated = kernel.args.written_positions() + flag
        launcher_numels = {k: sym.to_int(v) for k, v in numels.items()} if static else None
        self.wrapper.define_triton_kernel(name, sources[kind], kind, launcher_numels, configs, mutated,
                                          self.launcher_device, hint,
                                          persistent_source=sources.get("persistent_reduction") if not static
                                          else None)
        buffers = [buffer for _, buffer in call_args]
        self.wrapper.allocate_outputs(group, internal)
        numel_names = {"pointwise": ["xnumel"], "pointwise_2d": ["ynumel", "xnumel"]}.get(kind, ["xnumel", "rnumel"])
        numel_args = [pexpr(numels[n[0]]) for n in numel_names]
        if kernel.checks_division:
            self._call_reporting_zero_division(name, buffers, size_args + numel_args)
        else:
            self.wrapper.writeline(f"{name}.run({', '.join(buffers + size_args + numel_args)})")
        metrics.record_kernel(name)

    def _render(self, name, kind, kernel, group, size_args) -> str:
        numel_names = {"pointwise": ["xnumel"], "pointwise_2d": ["ynumel", "xnumel"]}.get(kind, ["xnumel", "rnumel"])
        block_names = {"pointwise": ["XBLOCK"], "pointwise_2d": ["YBLOCK", "XBLOCK"]}.get(kind, ["XBLOCK", "RBLOCK"])
        flag = ["zero_division_ptr"] if kernel.checks_division else []
        signature = [param for param, _ in kernel.args.call_order()] + flag + size_args + numel_names + \
            [f"{b}: tl.constexpr" for b in block_names]
        return _templates.get_template("kernel.py.j2").render(
            name=name, kind=kind, signature=", ".join(signature), x_numel=group.x_numel, r_numel=group.r_numel,
            origins=", ".join(group.origins), int64=kernel.use_int64, needs_xmask=kernel.needs_xmask,
            needs_rmask=kernel.needs_rmask, needs_ymask=kernel.needs_ymask, use_libdevice=self.use_libdevice,
            reads=", ".join(kernel.args.read_names()) or "-", writes=", ".join(kernel.args.written_names()) or "-",
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
    reports_zero_division = True    # CPU tensors: eager raises for an integer division by zero

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
