"""TritonScheduling: the Triton backend's side of the scheduler interface.

Registered for "cuda" (compiled kernels) and, through ``InterpretedTritonScheduling``,
for "cpu" tensors when ``config.cpu_backend == "triton"`` (Triton's interpreter).
"""
import functools
import os

import jinja2
import sympy
import torch

from ... import config, metrics
from ...dependencies import plan_and_deps
from ...runtime.heuristics import candidate_configs, is_persistent_reduction_ok
from ..backend_interface import BackendScheduling
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
    # indirect writes that combine with the element are atomics (kernel.py, _ATOMIC_OPS):
    # tl.atomic_add/max/min on these dtypes in triton 3.6 and 3.9 (half floats go
    # through a float32 copy in lowering; tl has no atomic multiply)
    scatter_dtypes = {
        "sum": {torch.float32, torch.float64, torch.int32, torch.int64},
        "max": {torch.float32, torch.float64, torch.int32, torch.int64},
        "min": {torch.float32, torch.float64, torch.int32, torch.int64},
    }
    deterministic_scatter = False   # atomic float sums land in any order

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
        prefix = {"pointwise": "triton_poi", "pointwise_2d": "triton_poi_tiled", "persistent_reduction": "triton_per",
                  "reduction": "triton_red"}[kind]
        name = self.wrapper.kernel_name(prefix, group.origins)
        call_args = kernel.args.call_order()
        numel_names = {"pointwise": ["xnumel"], "pointwise_2d": ["ynumel", "xnumel"]}.get(kind, ["xnumel", "rnumel"])
        block_names = {"pointwise": ["XBLOCK"], "pointwise_2d": ["YBLOCK", "XBLOCK"]}.get(kind, ["XBLOCK", "RBLOCK"])
        signature = [param for param, _ in call_args] + numel_names + [f"{b}: tl.constexpr" for b in block_names]
        source = _templates.get_template("kernel.py.j2").render(
            name=name, kind=kind, signature=", ".join(signature), x_numel=group.x_numel, r_numel=group.r_numel,
            origins=", ".join(group.origins), int64=kernel.use_int64, needs_xmask=kernel.needs_xmask,
            needs_rmask=kernel.needs_rmask, needs_ymask=kernel.needs_ymask, use_libdevice=self.use_libdevice,
            reads=", ".join(kernel.args.inputs) or "-", writes=", ".join(kernel.args.outputs) or "-",
            body=kernel.body_lines().getvalue().rstrip(),
        )
        n_inputs = len(kernel.args.inputs)
        mutated = list(range(n_inputs, n_inputs + len(kernel.args.outputs)))
        self.wrapper.define_triton_kernel(name, source, kind, numels, configs, mutated, self.launcher_device, hint)
        buffers = [buffer for _, buffer in call_args]
        self.wrapper.allocate_outputs(group, internal)
        numel_args = [str(numels[n[0]]) for n in numel_names]
        self.wrapper.writeline(f"{name}.run({', '.join(buffers + numel_args)})")
        metrics.record_kernel(name)

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
