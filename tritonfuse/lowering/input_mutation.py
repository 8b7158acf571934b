"""Graph inputs written in place: aot_autograd's ``copy_(input, new value)``.

With ``keep_inference_input_mutations`` (backend.py), aot_autograd leaves every data
mutation of an input that needs no gradient (batch norm's running statistics, ``x.add_(1)``,
``cache[:, pos] = k``) in the graph, as ``copy_(placeholder, value)`` nodes at its end,
instead of returning the new value for its runtime wrapper to copy in eagerly. Each becomes
an ``ir.InputMutation``: a node that computes ``value`` and stores it in the input's memory
(its strides; the tensor passed in carries its storage offset), so the kernel that computes
the value writes it there (no copy kernel where that kernel is fusable; one copy where the
value comes from a fallback). The scheduler runs every read of the old value first.

The nodes are made once the whole graph is lowered (``write_into_inputs``, called from the
graph's output): they come after every reader of the old values, and a value that reads
another written input, or its own input at another element (``x.copy_(x.t())``), is first
computed into a buffer of its own, so that no kernel writes an element another program
still reads. A ``copy_`` into anything but a whole graph input of the same shape and device
runs as an aten ``copy_`` inside the compiled graph (logged; the scheduler still orders the
old value's readers first).
"""
import sympy

from .. import sym
from ..ir import InputMutation, Pointwise, StorageBox, TensorBox, origins_of, storage_of
from ..virtualized import set_ops_handler
from .registry import Unsupported, aten, register_lowering
from .tensor_ops import copy


@register_lowering(aten.copy_)
def copy_(dst, src, non_blocking=False):
    from ..graph import current_graph
    graph = current_graph()
    target = _whole_input(dst, graph)
    if target is None:
        raise Unsupported("copy_ into something other than a whole graph input")
    if not isinstance(src, TensorBox) or src.get_device() != target.get_device():
        raise Unsupported("copy_ from another device or a non-tensor")
    if not sym.same_sizes(src.get_size(), target.get_size()) or src.get_dtype() != target.get_dtype():
        src = copy(dst, src)     # broadcast to the input's shape, cast to its dtype
    graph.input_mutations.append((target, src))
    return dst


def _whole_input(value, graph):
    """The ``InputBuffer`` of a graph input (not a constant) that ``value`` is, or None."""
    box = storage_of(value)
    buffer = box.data if box is not None and box.is_realized() else None
    if buffer is None or graph.graph_inputs.get(buffer.name) is not buffer:
        return None
    return buffer


def write_into_inputs(graph) -> None:
    """Make the ``InputMutation`` node of every ``copy_`` into a graph input the graph met."""
    written = {target.name for target, _ in graph.input_mutations}
    for target, value in graph.input_mutations:
        if not _reads_safely(value, target, written):
            value = _own_buffer(value)
        loader = value.make_loader()
        data = Pointwise(target.get_device(), target.get_dtype(), loader, list(target.get_size()),
                         origins=origins_of([value]) + ("copy_",))
        graph.register_buffer(InputMutation(name=None, layout=target.layout, data=data, target=target))


def _reads_safely(value, target, written) -> bool:
    """Whether computing ``value`` element by element and storing each element into
    ``target`` at once is right: it reads no other written input, and ``target`` only at
    the element it writes (directly)."""
    from ..graph import _OpCounter
    index = sym.index_vars("i", len(target.get_size()))
    recorder = _OpCounter()     # (an index read from a tensor holds the symbol "indirect")
    with set_ops_handler(recorder):
        value.make_loader()(index)
    own = sympy.expand(target.layout.index(index))
    for name, read in recorder.reads:
        if name == target.name:
            if sympy.expand(read) != own:
                return False
        elif name in written:
            return False
    return True


def _own_buffer(value) -> TensorBox:
    """``value`` computed into a fresh buffer of its own (read back element by element)."""
    box = storage_of(value)
    if box is not None and not box.is_realized():
        box.realize()
        return value
    copied = StorageBox(Pointwise(value.get_device(), value.get_dtype(), value.make_loader(), list(value.get_size()),
                                  origins=origins_of([value]) + ("clone",)))
    copied.realize()
    return TensorBox(copied)
