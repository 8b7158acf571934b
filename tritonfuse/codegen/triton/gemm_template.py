"""The GEMM template: a tiled Triton matmul (templates/mm.py.j2) whose store is generated
by the Triton backend's own code generation, so that the pointwise consumers of its output
(bias, activation, residual, cast: the epilogue nodes the scheduler fused into the
template's group) run on the output tile while it is still in registers.

    render_matmul      the kernel source, given the epilogue's code
    plain_source       the template storing its output and nothing more (what the choice
                       step benchmarks; gemm_choice.py)
    codegen_template   a scheduler group (template node + epilogue nodes) -> kernel + call

Sizes and strides are static: they are printed into the source, so Triton knows which
operand dims are contiguous and which sizes divide the blocks.
"""
import dataclasses
import logging

import sympy
import torch

from ... import metrics, sym
from ...dependencies import coarsening_groups, plan_and_deps
from ...virtualized import set_ops_handler
from ..common import KERNEL_NAME_PLACEHOLDER, CSEVariable, name_kernel
from .gemm_prologue import prologue_config, render_prologues
from .kernel import TritonKernel, texpr

aten = torch.ops.aten
log = logging.getLogger("tritonfuse")

BLOCK_NAMES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")
# The output tile's coordinates in the template: rows, columns, batch (grid axis 1).
XM = sympy.Symbol("xm", integer=True, nonnegative=True)
XN = sympy.Symbol("xn", integer=True, nonnegative=True)
BID = sympy.Symbol("bid", integer=True, nonnegative=True)


def _operand_geometry(value, batch):
    """(batch stride, row stride, column stride, offset) of a 2-d or 3-d operand, as ints;
    dims of size 1 get stride 0 (their index is always 0)."""
    layout = value.layout
    sizes, strides = [sym.to_int(s) for s in layout.size], [sym.to_int(s) for s in layout.stride]
    strides = [0 if size == 1 else stride for size, stride in zip(sizes, strides)]
    if len(sizes) == 2:
        strides = [0] + strides
    if batch == 1:
        strides[0] = 0
    return strides[0], strides[1], strides[2], sym.to_int(layout.offset)


def _pointer(param, terms, offset) -> str:
    """``param + (offset + var * stride + ...)`` without the terms of stride 0."""
    parts = [var if stride == 1 else f"{var} * {stride}" for var, stride in terms if stride != 0]
    if offset:
        parts.insert(0, str(offset))
    return f"{param} + ({' + '.join(parts) or '0'})"


def _step(stride) -> str:
    return "BLOCK_K" if stride == 1 else f"BLOCK_K * {stride}"


def _problem(template) -> str:
    """A comment line saying what the template computes, with the operands' strides."""
    def operand(name, value, rows, cols):
        shape = ([template.batch] if template.batch > 1 else []) + [rows, cols]
        strides = ", ".join(str(sym.to_int(s)) for s in value.layout.stride)
        return f"{name}{shape} (strides {strides})"
    out = ([template.batch] if template.batch > 1 else []) + [template.m, template.n]
    return (f"out{out} = {operand('a', template.a, template.m, template.k)} @ "
            f"{operand('b', template.b, template.k, template.n)}, {str(template.dtype).replace('torch.', '')}, "
            f"float32 accumulation")


def _dot_options(template) -> str:
    if template.dtype != torch.float32:
        return ""
    return ', input_precision="tf32"' if template.allow_tf32 else ', input_precision="ieee"'


def render_matmul(env, name, template, params, signature, epilogue, *, needs_xmask, int64, origins, reads, writes,
                  use_libdevice, prologues=None) -> str:
    """The kernel source. ``params``: operand buffer name -> kernel parameter;
    ``epilogue``: the code after the k loop (indented one level), which stores;
    ``prologues``: {"a_prologue": code, "b_prologue": code} that computes an operand's
    tile in the k loop instead of loading it (gemm_prologue.py; "" or absent: loaded)."""
    prologues = prologues or {}
    batch = template.batch
    a_b, a_m, a_k, a_offset = _operand_geometry(template.a, batch)
    b_b, b_k, b_n, b_offset = _operand_geometry(template.b, batch)
    a_name, b_name = template.operand_names
    a_prologue, b_prologue = prologues.get("a_prologue", ""), prologues.get("b_prologue", "")
    a_pointer = "" if a_prologue else \
        _pointer(params[a_name], [("bid", a_b), ("offs_m[:, None]", a_m), ("offs_k[None, :]", a_k)], a_offset)
    b_pointer = "" if b_prologue else \
        _pointer(params[b_name], [("bid", b_b), ("offs_k[:, None]", b_k), ("offs_n[None, :]", b_n)], b_offset)
    return env.get_template("mm.py.j2").render(
        name=name, signature=signature, problem=_problem(template), origins=origins, reads=reads, writes=writes,
        use_libdevice=use_libdevice, batch=batch, size_m=template.m, size_n=template.n, size_k=template.k,
        int64=".to(tl.int64)" if int64 else "", a_pointer=a_pointer, b_pointer=b_pointer,
        a_step=_step(a_k), b_step=_step(b_k), dot_options=_dot_options(template), needs_xmask=needs_xmask,
        a_prologue=a_prologue, b_prologue=b_prologue, epilogue=epilogue.rstrip(),
    )


def block_signature(params) -> str:
    return ", ".join(list(params) + [f"{b}: tl.constexpr" for b in BLOCK_NAMES])


def plain_source(env, name, template, output_layout, use_libdevice) -> str:
    """The template writing its output to ``out_ptr0`` (``output_layout``) and nothing
    else, masked as for any config: the kernel that the choice step benchmarks."""
    a_name, b_name = template.operand_names
    params = {a_name: "in_ptr0"}
    params.setdefault(b_name, "in_ptr1")     # x @ x.t() reads one buffer
    # rows and columns also where their size is 1 (the store's pointers span the whole
    # tile); the batch where there is one (a bmm of batch 1 has no bid)
    coordinates = ([BID] if template.batch > 1 else []) + [XM, XN]
    strides = output_layout.stride[len(output_layout.stride) - len(coordinates):]
    index = texpr(sum((var * stride for var, stride in zip(coordinates, strides)), sympy.Integer(0)))
    epilogue = f"    tl.store(out_ptr0 + ({index}), acc, xmask)"
    storage = max(output_layout.storage_size(), template.a.layout.storage_size(), template.b.layout.storage_size())
    return render_matmul(env, name, template, params, block_signature(sorted(set(params.values())) + ["out_ptr0"]),
                         epilogue, needs_xmask=True, int64=sym.to_int(storage) > 2**31 - 1,
                         origins=", ".join(template.origins), reads=", ".join(params.values()), writes="out_ptr0",
                         use_libdevice=use_libdevice)


def tile_coordinates(tile_sizes, tile_vars, sizes):
    """A node's loop variables (over ``sizes``, row-major over the same positions as the
    tile's dims ``tile_sizes``, whose coordinates are ``tile_vars``) as expressions of the
    tile coordinates: sums of them where each of the node's dims merges whole tile dims,
    else taken apart from the flat position."""
    groups = coarsening_groups(tile_sizes, sizes)
    strides = sym.contiguous_strides(tile_sizes)
    if groups is not None:
        return [sympy.expand(sum((tile_vars[k] * strides[k] / strides[group[-1]] for k in group),
                                 sympy.Integer(0))) for group in groups]
    flat = sum((var * stride for var, stride in zip(tile_vars, strides)), sympy.Integer(0))
    return sym.unflatten(flat, sizes)


class TemplateEpilogueKernel(TritonKernel):
    """TritonKernel's pointwise code generation run over a GEMM template's output tile:
    the template's own value is its accumulator ``acc``, and every node's loop variables
    are expressions of the tile's coordinates (xm, xn and the batch bid)."""

    def __init__(self, group, internal, graph, ops_table, report_zero_division=False, in_place=None):
        super().__init__(group, internal, graph, ops_table, None, "pointwise", {"x": group.x_numel},
                         report_zero_division=report_zero_division, in_place=in_place)
        self.template_node = group.template
        template = self.template_node.buffer.data
        blocks = template.config.kwargs
        self.needs_xmask = bool(template.m % blocks["BLOCK_M"] or template.n % blocks["BLOCK_N"])
        # rows and columns always (a store's pointers must span the whole tile), the batch when there is one
        dims = ([(template.batch, BID)] if template.batch > 1 else []) + [(template.m, XM), (template.n, XN)]
        self.tile_sizes = [sympy.Integer(size) for size, _ in dims]
        self.tile_vars = [var for _, var in dims]

    def generate(self):
        """The template's store, then each epilogue node in order."""
        template = self.template_node.buffer
        for name in template.data.operand_names:
            if name not in self.group.prologue:     # (a prologue's inputs are named as it loads them)
                self.args.input(name)          # the operands are in_ptr0 (and in_ptr1)
        layouts = sorted(self.group.node_layouts(), key=lambda entry: entry[0] is not self.template_node)
        for node, x_sizes, r_sizes, kind in layouts:
            self._set_node(node, x_sizes, r_sizes, kind)
            with set_ops_handler(self):
                if node is self.template_node:
                    self.store(node.name, template.layout.index(self.plan.raw_x),
                               CSEVariable("acc", template.get_dtype()))
                else:
                    node.buffer.body(self.plan.raw_x, [])

    def _set_node(self, node, x_sizes, r_sizes, kind):
        self.plan, _, _ = plan_and_deps(node.buffer, x_sizes, r_sizes)
        self.node_kind = kind
        self.x_symbols = self._tile_coordinates(self.plan.x_sizes)
        self.r_symbols = []

    def _tile_coordinates(self, sizes):
        return tile_coordinates(self.tile_sizes, self.tile_vars, sizes)

    def _node_block_shape(self) -> str:
        return "[BLOCK_M, BLOCK_N]"


def codegen_template(scheduling, group, internal, env) -> None:
    """Generate the template kernel of ``group`` (a template node and its epilogue nodes)
    and its launch in the wrapper, or, where aten plus the epilogue's own kernel measured
    faster, those; ``env``: the jinja2 environment of the templates."""
    from .scheduling import TritonKernelDefinition
    node = group.template
    template = node.buffer.data
    epilogue = [n for n in group.nodes if n is not node and n.name not in group.prologue]
    # an addmm's bias alone is no epilogue that fusing saves: aten.addmm adds it too
    fused = bool(epilogue) and _addmm_bias_node(group) is None
    output_stored = node.name not in internal
    config = template.config
    if group.prologue:
        group, internal, config = _settle_prologues(scheduling, group, internal, env, fused, output_stored)
    # kept prologues were measured against aten too (PrologueChoice), or nothing was measured
    if not group.prologue and not template.timings.prefers_template(fused, output_stored):
        _codegen_on_aten(scheduling, group, internal)
        return
    wrapper = scheduling.wrapper
    source, kernel = render_template_kernel(scheduling, group, internal, env,
                                            in_place=wrapper.memory_plan.in_place_outputs(group.names),
                                            report_zero_division=scheduling.reports_zero_division)
    call_order = kernel.args.call_order()
    flag = ["zero_division_ptr"] if kernel.checks_division else []
    pointer_dtypes = tuple(scheduling.graph.get_dtype(buffer) for _, buffer in call_order) + (torch.int32,) * len(flag)
    definition = TritonKernelDefinition(
        prefix="triton_tem", origins=tuple(group.origins), template=source, kind="template",
        numels={"b": template.batch, "m": template.m, "n": template.n}, configs=(config,),
        mutated=tuple(kernel.args.written_positions() + [len(call_order)] * len(flag)),
        device_type=scheduling.launcher_device, device_index=scheduling._device_index(group.device), hint=None,
        pointer_dtypes=pointer_dtypes, example_scalars=())
    name, new = wrapper.define_triton_kernel(definition)
    if new:   # compiles in the background while the rest of the graph is generated
        metrics.kernel_dedup_hits += definition.precompile(name)
    wrapper.allocate_outputs(group, internal)
    buffers = [buffer for _, buffer in call_order]
    if kernel.checks_division:
        scheduling._call_reporting_zero_division(name, buffers, [])
    else:
        wrapper.writeline(f"{name}.run({', '.join(buffers)})")
    metrics.record_kernel(name)


def render_template_kernel(scheduling, group, internal, env, in_place, report_zero_division):
    """(the source of ``group``'s template kernel, named KERNEL_NAME_PLACEHOLDER; the
    TemplateEpilogueKernel that generated its body, whose arguments are the signature's)."""
    template = group.template.buffer.data
    kernel = TemplateEpilogueKernel(group, internal, scheduling.graph, scheduling.ops_table,
                                    report_zero_division=report_zero_division, in_place=in_place)
    prologues = render_prologues(kernel, group)
    kernel.generate()
    call_order = kernel.args.call_order()
    params = {buffer: param for param, buffer in call_order}
    flag = ["zero_division_ptr"] if kernel.checks_division else []
    # rendered unnamed: equal matmuls with equal epilogues share one definition
    source = render_matmul(
        env, KERNEL_NAME_PLACEHOLDER, template, params, block_signature([param for param, _ in call_order] + flag),
        kernel.body_lines().getvalue(), needs_xmask=kernel.needs_xmask, int64=kernel.use_int64,
        origins=", ".join(group.origins), reads=", ".join(kernel.args.inputs) or "-",
        writes=", ".join(list(kernel.args.in_outs) + list(kernel.args.outputs)) or "-",
        use_libdevice=scheduling.use_libdevice, prologues=prologues)
    return source, kernel


def _settle_prologues(scheduling, group, internal, env, epilogue_fused, output_stored):
    """(group, internal buffers, config): ``group`` with its prologues and a config whose
    pipeline they fit, where one fits and, when the matmul's choice was measured, the
    template computing them ran faster than their own kernels plus the matmul without them
    (PrologueChoice); else the group with its producers split off as kernels of their own,
    and the template's config. Nothing measured (config.autotune "none", the interpreter):
    the prologues stay."""
    template = group.template.buffer.data
    config = prologue_config(group, scheduling.graph, scheduling.matmul_choice.shared_memory(template.device))
    if config is None:
        log.info("tritonfuse: %s: prologue unfused: the producers' inputs fit no pipeline of the tile %s",
                 template.origins[0], template.config)
    else:
        matmul_ms = template.timings.matmul_ms(epilogue_fused, output_stored)
        if matmul_ms is None:
            return group, internal, config
        choice = _measure_prologues(scheduling, group, internal, env, config, matmul_ms)
        if choice.keep:
            return group, internal, config
    group, internal = _split_off_prologues(scheduling, group, internal)
    return group, internal, template.config


def _measure_prologues(scheduling, group, internal, env, config, matmul_ms):
    """The PrologueChoice of ``group``: its template with the prologues and a plain store
    (the kernel the graph would run, less its epilogue) against the producers' own kernels
    (the ones _split_off_prologues generates) plus ``matmul_ms``."""
    from .gemm_choice import PROLOGUE_KERNEL_NAME, ZERO_DIVISION, KernelRun
    template = group.template.buffer.data
    producers = sorted((n for n in group.nodes if n.name in group.prologue), key=lambda n: n.position)
    plain = [group.template] + producers
    plain_group = dataclasses.replace(group, nodes=plain, names={n.name for n in plain})
    source, kernel = render_template_kernel(scheduling, plain_group, internal & group.prologue, env, in_place={},
                                            report_zero_division=False)
    runs = [KernelRun(PROLOGUE_KERNEL_NAME, name_kernel(source, PROLOGUE_KERNEL_NAME), "template",
                      {"b": template.batch, "m": template.m, "n": template.n}, (config,),
                      tuple(kernel.args.written_positions()), tuple(b for _, b in kernel.args.call_order()))]
    for i, producer in enumerate(producers):
        loops = scheduling.loops_kernel(_alone(group, producer), internal - {producer.name}, in_place={})
        definition = loops.definition
        if definition.numels is None or not all(arg.isdigit() for arg in loops.scalar_args):
            return _not_timed(template, "a producer of symbolic sizes (its kernel is not timed)")
        name = f"{PROLOGUE_KERNEL_NAME}_producer{i}"
        runs.append(KernelRun(name, definition.source(name), definition.kind, definition.numels, definition.configs,
                              definition.mutated, tuple(loops.buffers) + (ZERO_DIVISION,) * loops.checks_division,
                              tuple(int(arg) for arg in loops.scalar_args)))
    buffers = {}
    for name in {name for run in runs for name in run.buffers} - {ZERO_DIVISION}:
        layout = scheduling.graph.name_to_buffer[name].layout
        if not sym.is_static(layout.storage_size()):
            return _not_timed(template, f"{name} has a symbolic size")
        buffers[name] = (sym.to_int(layout.storage_size()), layout.dtype)
    return scheduling.matmul_choice.choose_prologue(template, runs[0], runs[1:], buffers, matmul_ms)


def _not_timed(template, why):
    """The PrologueChoice (unfused) of prologues the choice cannot time, logged."""
    from .gemm_choice import PrologueChoice
    choice = PrologueChoice(False, why=why)
    log.info("tritonfuse: %s: prologue %s", template.origins[0], choice)
    return choice


def _split_off_prologues(scheduling, group, internal):
    """Each prologue node of ``group`` as a kernel of its own, writing the operand that the
    matmul then loads: (the group without them, its internal buffers)."""
    prologue = [n for n in group.nodes if n.name in group.prologue]
    for producer in sorted(prologue, key=lambda n: n.position):
        scheduling.codegen_loops(_alone(group, producer), internal - {producer.name})
    rest = [n for n in group.nodes if n.name not in group.prologue]
    return (dataclasses.replace(group, nodes=rest, names={n.name for n in rest}, prologue=frozenset()),
            internal - group.prologue)


def _alone(group, producer):
    """A prologue node of ``group`` as a group of its own (a pointwise kernel)."""
    return dataclasses.replace(group, nodes=[producer], names={producer.name}, x_numel=sympy.expand(
        sym.product(producer.x_sizes)), r_numel=sympy.Integer(1), prologue=frozenset())


def _addmm_bias_node(group):
    """The group's one epilogue node when it only adds an addmm's bias (and the addmm's
    output layout, as aten.addmm writes it), else None."""
    node = group.template
    epilogue = [n for n in group.nodes if n is not node and n.name not in group.prologue]
    if node.buffer.data.addmm is None or len(epilogue) != 1 or epilogue[0].origins != ("addmm",):
        return None
    layout = epilogue[0].buffer.layout
    return epilogue[0] if list(layout.stride) == sym.contiguous_strides(layout.size) else None


def _codegen_on_aten(scheduling, group, internal) -> None:
    """The matmul as its aten op (the addmm, when the epilogue is only its bias), then its
    epilogue nodes as a kernel of their own."""
    wrapper = scheduling.wrapper
    node = group.template
    template = node.buffer.data
    reason = f"aten was faster than the GEMM template ({template.timings})"
    group, internal = _split_off_prologues(scheduling, group, internal)
    bias_node = _addmm_bias_node(group)
    # the addmm where the product itself is read nowhere else, and its result is not
    # planned over the bias (which aten.addmm reads)
    if bias_node is not None and node.name in internal and not wrapper.memory_plan.in_place_outputs({bias_node.name}):
        bias, beta, alpha = template.addmm
        metrics.fallbacks[str(aten.addmm.default)] = reason
        wrapper.codegen_aten_call(bias_node.buffer, aten.addmm.default, [bias, template.a, template.b],
                                  {"beta": beta, "alpha": alpha}, reason)
        return
    metrics.fallbacks[str(template.aten_op)] = reason
    wrapper.codegen_aten_call(node.buffer, template.aten_op, [template.a, template.b], {}, reason)
    epilogue = [n for n in group.nodes if n is not node and n.name not in group.prologue]
    if epilogue:
        rest = dataclasses.replace(group, nodes=epilogue, names={n.name for n in epilogue}, prologue=frozenset())
        scheduling.codegen_loops(rest, internal - {node.name})
