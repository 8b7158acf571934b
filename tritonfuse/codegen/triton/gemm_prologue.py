"""Prologues of the GEMM template: the pointwise producer of an operand (a cast, a scale),
computed on the operand's tile inside the k loop instead of loaded from memory, by the
Triton backend's own code generation (the scheduler chose the node: prologue_fusion.py).

The A tile is rows ``xm`` by columns ``ka`` (``k + offs_k`` along a row), the B tile rows
``kb`` by columns ``xn``, and a bmm's batch is ``bid``. The producer's loop variables are
expressions of these (its memory is the operand's, one to one), so its loads read its own
inputs at the tile's elements. Its store becomes the tile: rounded to the operand's dtype,
zero outside the matrix (the dot must add nothing there, whatever the producer computes
of a masked load's zero).

Triton stages the producer's loads in shared memory at their own width, so the config the
choice step picked for the plain template may need fewer pipeline stages
(``prologue_config``); where not even two fit, the producer runs as its own kernel.
"""
import sympy

from ...dependencies import plan_and_deps
from ...prologue_fusion import tiled_dims, widest_element
from ...runtime.gemm_heuristics import MIN_STAGES
from ...runtime.heuristics import Config
from ...virtualized import set_ops_handler
from ..common import CSE, IndentedBuffer
from .kernel import Constant, TritonKernel, _Segment, compute_dtype, texpr
from .overrides import TRITON_TYPES

KA = sympy.Symbol("ka", integer=True, nonnegative=True)
KB = sympy.Symbol("kb", integer=True, nonnegative=True)


class TemplatePrologueKernel(TritonKernel):
    """One prologue node over operand ``which`` ("a" or "b") of ``epilogue``'s template,
    writing its code (two levels in: the k loop) and naming its inputs in ``epilogue``'s
    kernel arguments."""

    def __init__(self, epilogue, node, which):
        super().__init__(epilogue.group, epilogue.internal, epilogue.graph, epilogue.ops_table, None, "pointwise",
                         {"x": epilogue.group.x_numel}, report_zero_division=epilogue.report_zero_division)
        from .gemm_template import BID, XM, XN, tile_coordinates
        template = epilogue.template_node.buffer.data
        blocks = template.config.kwargs
        self.args = epilogue.args                # one signature for the whole template
        self.use_int64 = epilogue.use_int64
        self.needs_xmask = self.needs_ymask = self.needs_rmask = False
        self.cse = CSE(f"{which}_tmp")
        self.segments = [_Segment(loop=False, pre=IndentedBuffer(2))]
        self.which, self.node = which, node
        view = template.a if which == "a" else template.b
        self.dtype = view.get_dtype()
        if which == "a":
            dim_vars, self.block = [XM, KA], "[BLOCK_M, BLOCK_K]"
            self.mask_text = f"(xm < {template.m}) & (ka < {template.k})"
            self.needs_mask = bool(template.m % blocks["BLOCK_M"] or template.k % blocks["BLOCK_K"])
        else:
            dim_vars, self.block = [KB, XN], "[BLOCK_K, BLOCK_N]"
            self.mask_text = f"(kb < {template.k}) & (xn < {template.n})"
            self.needs_mask = bool(template.k % blocks["BLOCK_K"] or template.n % blocks["BLOCK_N"])
        dim_vars = [BID] * (len(view.get_size()) - 2) + dim_vars
        dims = tiled_dims(view.layout)
        self.tile_vars = {dim_vars[i] for i, _, _ in dims}
        self.plan, _, _ = plan_and_deps(node.buffer, node.x_sizes, [])
        self.node_kind = "x"
        self.x_symbols = tile_coordinates([sympy.Integer(size) for _, size, _ in dims],
                                          [dim_vars[i] for i, _, _ in dims], self.plan.x_sizes)
        self.r_symbols = []
        self.symbol_sizes = {}
        self.value = None

    def code(self) -> str:
        """The producer's code on the tile, ending in the operand's assignment (``a = ...``)."""
        with set_ops_handler(self):
            self.node.buffer.body(self.plan.raw_x, [])
        value, value_dtype = self.value
        if isinstance(value, Constant):
            value = f"tl.full({self.block}, {value}, {TRITON_TYPES[compute_dtype(value_dtype)]})"
        cast = "" if compute_dtype(value_dtype) == self.dtype else f".to({TRITON_TYPES[self.dtype]})"
        if self.needs_mask:
            self.out.writeline(f"{self.which} = tl.where({self.which}mask, {value}, 0.0){cast}")
        else:
            self.out.writeline(f"{self.which} = tl.broadcast_to({value}, {self.block}){cast}")
        return self.body_lines().getvalue().rstrip()

    def store(self, name, index, value):
        assert name == self.node.name, (name, self.node.name)
        value = self._typed(value)
        self.value = (value if isinstance(value, Constant) else self._as_stored(name, value), value.dtype)

    def _mask_for(self, index, load=False):
        # the operand tile's own mask on every load, as before (load: the base class's argument)
        parts = ([f"{self.which}mask"] if self.needs_mask else []) + self.mask_stack
        return " & ".join(parts) if parts else None

    def _node_block_shape(self) -> str:
        return self.block

    def _pointer_offset(self, index) -> str:
        """The index as printed; a whole tile of it where it names no tile coordinate."""
        text = texpr(index)
        if not index.free_symbols & self.tile_vars:
            text = f"{text} + tl.zeros({self.block}, tl.int32)"
        return text


def prologue_config(group, graph, shared_memory):
    """The template's config for ``group`` with its prologues, or None where no pipeline of
    it fits ``shared_memory`` bytes (None: no limit). Each stage holds an A and a B tile of
    the widest dtype that the operand's producer loads (a float32 weight cast to bfloat16
    is staged as float32), counted as gemm_heuristics counts the plain template's: where
    they do not fit, the stages are cut down to what fits, at least MIN_STAGES."""
    template = group.template.buffer.data
    config, blocks = template.config, template.config.kwargs
    if shared_memory is None:
        return config
    widths = []
    for view, name in zip((template.a, template.b), template.operand_names):
        width = view.get_dtype().itemsize
        producer = next((n for n in group.nodes if n.name == name and name in group.prologue), None)
        if producer is not None:
            width = max(width, widest_element(producer, graph.get_dtype))
        widths.append(width)
    per_stage = blocks["BLOCK_M"] * blocks["BLOCK_K"] * widths[0] + blocks["BLOCK_K"] * blocks["BLOCK_N"] * widths[1]
    stages = min(config.num_stages, shared_memory // per_stage)
    if stages < MIN_STAGES:
        return None
    return config if stages == config.num_stages else Config(dict(blocks), config.num_warps, stages)


def render_prologues(epilogue, group) -> dict:
    """{"a_prologue": code, "b_prologue": code} for the operands whose producer ``group``
    computes in the template (empty strings for plain loads), and the masks they use."""
    template = epilogue.template_node.buffer.data
    nodes = {node.name: node for node in group.nodes if node.name in group.prologue}
    code = {}
    for which, name in zip("ab", template.operand_names):
        if name not in nodes:
            code[f"{which}_prologue"] = ""
            continue
        kernel = TemplatePrologueKernel(epilogue, nodes[name], which)
        lines = []
        if kernel.needs_mask:
            lines.append(f"        {which}mask = {kernel.mask_text}")
        code[f"{which}_prologue"] = "\n".join(lines + [kernel.code()])
        epilogue.checks_division |= kernel.checks_division
    return code
