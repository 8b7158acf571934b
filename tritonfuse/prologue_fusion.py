"""Which pointwise producer of a GEMM operand the template may compute in its operand load
(prologue fusion, ``config.gemm_prologue_fusion``); the scheduler asks, backends render.

A prologue is computed once per k-step of every program that loads the operand tile: the
A operand once per column of output tiles, the B operand once per row of them. A cast or a
scale costs a few instructions per loaded element, next to the tile's tensor-core work; a
transcendental (exp, erf, ...) may not. So:

    "off"    no prologue (the default: whether the cheap kind wins is measured on a GPU;
             the template's loads then go through registers, not straight to the dot)
    "cheap"  producers made of loads, casts and cheap arithmetic only (CHEAP_OPS)
    "all"    any pointwise producer that passes the structural rules

Structural rules (``prologue_operand``): the producer is one pointwise node (no reduction,
no scatter, no indirect load), on the template's device, read by the template node alone
and not a graph output; the template reads it as an operand whose view covers the
producer's memory one to one (no offset, no broadcast, strides of a permutation of its
dims: a transpose is fine), and the producer stores its elements row-major in that memory.
Then each operand element is exactly one element the producer computes.
"""
import sympy

from . import config, sym
from .dependencies import plan_and_deps
from .virtualized import set_ops_handler

# What a "cheap" prologue may do per element: loads, casts, constants and one-instruction
# arithmetic. Division, powers and every transcendental are left out.
CHEAP_OPS = frozenset({"load", "store", "constant", "to_dtype", "index_expr", "add", "sub", "mul", "neg", "abs",
                       "maximum", "minimum", "relu", "where", "eq", "ne", "lt", "le", "gt", "ge"})


class _OpRecorder:
    """Records the op names a node's body calls (and whether it indexes indirectly)."""

    def __init__(self):
        self.names = set()

    def indirect_indexing(self, value, size):
        self.names.add("indirect_indexing")
        return sympy.Symbol("indirect", integer=True)

    def masked(self, mask, body, other):
        self.names.add("masked")
        return body()

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.names.add(name)
            return "value"
        return record


def body_ops(node) -> set:
    recorder = _OpRecorder()
    with set_ops_handler(recorder):
        node.buffer.body(sym.index_vars("x", len(node.x_sizes)), [])
    return recorder.names


def prologue_operand(template_node, producer, readers, output_names, dtype_of) -> str:
    """Why ``producer`` (a scheduler node) may not be computed in ``template_node``'s
    operand load ("" when it may). ``readers``: the names of the nodes that read the
    producer's buffer; ``output_names``: the graph's outputs; ``dtype_of``: a buffer's
    dtype by name (None if unknown)."""
    mode = config.gemm_prologue_fusion
    if mode == "off":
        return "config.gemm_prologue_fusion is off"
    if producer.is_template or producer.is_reduction() or producer.is_scan():
        return "not pointwise"
    if producer.mutated_name is not None or producer.written_input is not None or producer.is_concat_slice:
        return "writes into another buffer (a scatter, an input, a cat's slice)"
    if producer.device != template_node.device:
        return "another device"
    if producer.name in output_names or readers != {template_node.name}:
        return "read elsewhere too"
    template = template_node.buffer.data
    views = [v for v, name in zip((template.a, template.b), template.operand_names) if name == producer.name]
    if not views or not all(dense_permutation(v, producer) for v in views):
        return "the operand is no one-to-one view of the producer's memory"
    if not stores_row_major(producer):
        return "the producer's elements are not stored row-major"
    ops = body_ops(producer)
    if ops & {"indirect_indexing", "store_scatter", "store_reduction", "reduction", "scan"}:
        return "an indirect or reducing body"
    if mode == "cheap" and not ops <= CHEAP_OPS:
        return f"ops beyond a cast or scale ({', '.join(sorted(ops - CHEAP_OPS))})"
    if mode == "cheap" and widest_element(producer, dtype_of) > producer.buffer.get_dtype().itemsize:
        return "it reads wider elements than it writes (the template would stage those in shared memory)"
    return ""


def widest_element(producer, dtype_of) -> int:
    """Bytes of the widest element the producer loads or stores (a float32 weight cast to
    bfloat16: 4). Triton stages a prologue's loads in shared memory at that width
    (gemm_prologue.prologue_config). Under "cheap" a producer may read nothing wider than it
    writes, as Inductor's rule says: a float32 weight cast to bfloat16 in the load made a
    4096^3 matmul 2.6x slower on an H100 (fewer pipeline stages, twice the bytes a tile)."""
    dtypes = [dtype_of(name) for name in producer.read_names] + [producer.buffer.get_dtype()]
    return max(dtype.itemsize for dtype in dtypes if dtype is not None)


def dense_permutation(view, producer) -> bool:
    """Whether ``view`` (a template operand) reads every element of the producer's buffer
    once: offset 0, its dims of size > 1 ordered by stride are row-major over them, and they
    hold as many elements as the buffer."""
    layout = view.layout      # a ReinterpretView's, or the buffer's own
    if not (sym.is_static(layout.offset) and sym.to_int(layout.offset) == 0):
        return False
    dims = tiled_dims(layout)
    if dims is None:
        return False
    sizes = [size for _, size, _ in dims]
    return sym.same_size(sym.product(sizes), producer.buffer.layout.storage_size())


def tiled_dims(layout):
    """[(dim, size, stride)] of a layout's dims of size > 1, by stride (largest first), when
    those strides are row-major over them (a dense permutation), else None."""
    if not all(sym.is_static(s) for s in list(layout.size) + list(layout.stride)):
        return None
    dims = sorted(((i, sym.to_int(size), sym.to_int(stride)) for i, (size, stride)
                   in enumerate(zip(layout.size, layout.stride)) if sym.to_int(size) != 1),
                  key=lambda d: -d[2])
    strides = sym.contiguous_strides([size for _, size, _ in dims])
    return dims if all(stride == expected for (_, _, stride), expected in zip(dims, strides)) else None


def stores_row_major(producer) -> bool:
    """Whether the producer's store, over its merged loop variables, is the row-major
    position of those variables (so a memory position names one loop point)."""
    plan, _, write = plan_and_deps(producer.buffer, producer.x_sizes, [])
    if write.indirect:
        return False
    variables = sym.index_vars("x", len(plan.x_sizes))
    row_major = sum((v * s for v, s in zip(variables, sym.contiguous_strides(plan.x_sizes))), sympy.Integer(0))
    return sympy.expand(write.index - row_major) == 0
