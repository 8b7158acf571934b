"""The shared scheduler: one node per buffer-producing op, dependencies, fusion,
buffer lifetimes. It asks the backend registered for a node's device whether two nodes
may fuse and to generate code; it never imports a backend.

Kernel groups. Every computed buffer iterates an x domain (kept dims) and an r domain
(reduced dims, empty for pointwise). A fused kernel has one group ``(device, X, R)``:
reductions over X rows of R elements, pointwise nodes over all X*R elements (split into
x and r parts) and "x-only" pointwise nodes over the X rows (epilogues of reductions).
A scan is grouped like a reduction over the dim it scans (it stores every element).

Mutations. A scatter (``ir.MutationBuffer``) writes into a buffer made for it alone: it
depends on that buffer's producer, and fuses with neither that producer nor a reader of
its result (``_mutation_fusion_ok``). A graph input written in place (``ir.InputMutation``,
or a fallback whose op writes into its argument) runs after every other reader of the
input's old value: write-after-read dependencies (``_direct_preds``). It shares a kernel
with a reader of the old value only where each element is read before it is written by
the same program (``_input_write_fusion_ok``).

Cat slices. A cat computed into slices (``ir.ConcatSlice``) is one node per input, each
writing its part of the cat's memory; each depends on the slice before it, and its
readers read the last. Slices of equal sizes may share a kernel (their writes are
disjoint); none is kept out of memory.

Template nodes. A buffer computed by a kernel template (a GEMM under max-autotune) is a
node whose group may absorb pointwise consumers of its output, which the template then
computes in its store (epilogues), and, where ``config.gemm_prologue_fusion`` allows, the
pointwise producer of an operand that only the template reads, which it computes in the
operand's load (prologues: prologue_fusion.py). It fuses with nothing else.
"""
import heapq
import logging
from dataclasses import dataclass, field
from typing import List, Optional

import sympy
import torch

from . import config, metrics, sym
from .dependencies import extract_deps, flat_x_form, split_sizes
from .fusion_graph import FusionGraph, candidate_pairs
from .ir import ComputedBuffer, ConcatSlice, FallbackKernel, InputMutation, MutationBuffer, TemplateBuffer
from .prologue_fusion import prologue_operand

log = logging.getLogger("tritonfuse.scheduler")


# Kernels over at most this many elements cost about their launch: fuse them even when
# they share no data.
LAUNCH_BOUND_NUMEL = 4096


class SchedulerNode:
    """One computed buffer."""

    def __init__(self, buffer: ComputedBuffer, position: int):
        self.buffer = buffer
        self.name = buffer.name
        self.position = position
        self.x_sizes, self.r_sizes = buffer.iteration_sizes()
        self.device = buffer.get_device()
        reads, _ = extract_deps(buffer, self.x_sizes, self.r_sizes)
        self.read_names = {dep.name for dep in reads}
        # the buffer a scatter writes into: a dependency, though the kernel never loads it
        scatter = isinstance(buffer, MutationBuffer) and not isinstance(buffer, InputMutation)
        self.mutated_name = buffer.target.name if scatter else None
        if self.mutated_name is not None:
            self.read_names.add(self.mutated_name)
        # the graph input this node writes its value into (its memory; read by others before,
        # and named among this node's reads: the input lives until the write)
        self.written_input = buffer.target.name if isinstance(buffer, InputMutation) else None
        if self.written_input is not None:
            self.read_names.add(self.written_input)
        # a cat's slice after the first writes into the memory of the one before it
        self.is_concat_slice = isinstance(buffer, ConcatSlice)
        if self.is_concat_slice and buffer.previous is not None:
            self.read_names.add(buffer.previous.name)
        self.origins = tuple(buffer.data.origins)
        self.is_template = isinstance(buffer, TemplateBuffer)

    def is_reduction(self) -> bool:
        return self.buffer.is_reduction()

    def is_scan(self) -> bool:
        return self.buffer.is_scan()

    def sizes_in_group(self, x_numel, r_numel):
        """This node's (x sizes, r sizes, kind) inside a kernel of group (X, R), or None.
        kind is "reduction", "scan", "xr" (pointwise over rows and columns) or "x" (over rows).
        Sizes are sympy expressions (symbolic under dynamic shapes)."""
        if self.is_reduction() or self.is_scan():
            if sym.same_size(sym.product(self.x_sizes), x_numel) and sym.same_size(sym.product(self.r_sizes), r_numel):
                return self.x_sizes, self.r_sizes, "scan" if self.is_scan() else "reduction"
            return None
        numel = sym.product(self.x_sizes)
        if r_numel == 1:
            return (self.x_sizes, [], "x") if sym.same_size(numel, x_numel) else None
        if sym.same_size(numel, x_numel):
            return self.x_sizes, [], "x"
        if sym.same_size(numel, x_numel * r_numel):
            split = split_sizes(self.x_sizes, x_numel)
            if split is not None:
                return split[0], split[1], "xr"
        return None

    def __repr__(self):
        return f"SchedulerNode({self.name}, x={self.x_sizes}, r={self.r_sizes})"


class FallbackNode:
    def __init__(self, kernel: FallbackKernel, position: int):
        self.kernel = kernel
        self.name = kernel.name
        self.position = position
        self.read_names = set(kernel.input_buffers())
        self.output_names = [out.name for out in kernel.outputs]
        self.written_inputs = set(kernel.written_buffers())   # (an aten copy_ into a graph input)


@dataclass
class FusedNode:
    """A group of scheduler nodes that becomes one kernel."""
    nodes: List[SchedulerNode]
    device: torch.device
    x_numel: sympy.Expr      # rows (all elements, for a pointwise kernel)
    r_numel: sympy.Expr      # reduced elements per row (1 for a pointwise kernel)
    names: set = field(default_factory=set)
    # nodes a template computes in its operand loads: in ``nodes``, outside the group's loops
    prologue: frozenset = frozenset()

    @staticmethod
    def of(node: SchedulerNode) -> "FusedNode":
        x = sympy.expand(sym.product(node.x_sizes))
        r = sympy.expand(sym.product(node.r_sizes))
        return FusedNode([node], node.device, x, r, {node.name})

    @property
    def position(self):
        return min(n.position for n in self.nodes)

    def is_reduction(self):
        return self.r_numel != 1 or any(n.is_reduction() or n.is_scan() for n in self.nodes)

    def is_empty(self) -> bool:
        return self.x_numel * self.r_numel == 0

    @property
    def template(self) -> Optional[SchedulerNode]:
        """The template node of this group, if it has one (then it is the group's kernel)."""
        return next((n for n in self.nodes if n.is_template), None)

    def read_names(self) -> frozenset:
        """The buffers the group reads from outside itself (a group never changes once
        made, so this is worked out once)."""
        cached = self.__dict__.get("_read_names")
        if cached is None:
            cached = self._read_names = frozenset(set().union(*(n.read_names for n in self.nodes)) - self.names)
        return cached

    def tiny_size(self):
        """(x, r) for a kernel of static size small enough that its launch dominates (two
        such of one size score 1 in ``Scheduler._score`` even sharing nothing), else None;
        worked out once, as ``read_names``."""
        if "_tiny_size" not in self.__dict__:
            numel = self.x_numel * self.r_numel
            self._tiny_size = (sym.to_int(self.x_numel), sym.to_int(self.r_numel)) \
                if sym.is_static(numel) and sym.to_int(numel) <= LAUNCH_BOUND_NUMEL else None
        return self._tiny_size

    @property
    def written_inputs(self) -> set:
        """The graph inputs this kernel writes into."""
        return {n.written_input for n in self.nodes if n.written_input is not None}

    def node_layouts(self):
        """[(node, x sizes, r sizes, kind)] in execution order (prologue nodes left out)."""
        result = []
        for node in sorted(self.nodes, key=lambda n: n.position):
            if node.name in self.prologue:
                continue
            x_sizes, r_sizes, kind = node.sizes_in_group(self.x_numel, self.r_numel)
            result.append((node, x_sizes, r_sizes, kind))
        return result

    @property
    def origins(self):
        found = []
        for node in sorted(self.nodes, key=lambda n: n.position):
            for origin in node.origins:
                if origin and origin not in found:
                    found.append(origin)
        return found


class Scheduler:
    def __init__(self, graph, backend_for_device):
        """``backend_for_device(device) -> BackendScheduling`` (from the device registry)."""
        self.graph = graph
        self.backend_for_device = backend_for_device
        self.nodes = []
        for position, op in enumerate(graph.operations):
            if isinstance(op, ComputedBuffer):
                self.nodes.append(SchedulerNode(op, position))
            else:
                self.nodes.append(FallbackNode(op, position))
        self.producer = {}
        for node in self.nodes:
            names = node.output_names if isinstance(node, FallbackNode) else [node.name]
            for name in names:
                self.producer[name] = node
        self.output_names = {getattr(out, "name", None) for out in graph.outputs}
        self.output_names |= {out.buffer.name for out in graph.outputs if hasattr(out, "buffer")}
        self._bytes_cache = {}   # (_bytes_of)
        self.groups = self._fuse([FusedNode.of(n) if isinstance(n, SchedulerNode) else n for n in self.nodes])
        self.groups = self._topological_order(self.groups)

    # ---- dependencies -----------------------------------------------------------------
    def _group_of(self, groups):
        owner = {}
        for group in groups:
            for node in (group.nodes if isinstance(group, FusedNode) else [group]):
                owner[node.name] = group
                if isinstance(node, FallbackNode):
                    for out in node.output_names:
                        owner[out] = group
        return owner

    def _direct_preds(self, group, owner, readers=None):
        """The groups ``group`` must run after: the producers of what it reads, and (when it
        writes into a graph input) every other group that reads the input's old value.
        ``readers``: {graph input written somewhere: groups reading it} (``_input_readers``)."""
        preds = set()
        names = group.read_names() if isinstance(group, FusedNode) else group.read_names
        for name in names:
            producer = owner.get(name)
            if producer is not None and producer is not group:
                preds.add(id(producer))
        if readers is None:
            readers = self._input_readers([group] + list({id(g): g for g in owner.values()}.values()))
        for name in group.written_inputs:
            preds |= {id(reader) for reader in readers.get(name, ()) if reader is not group}
        return preds

    @staticmethod
    def _input_readers(groups):
        """{graph input that some group writes into: the groups that read it}."""
        written = set().union(*(g.written_inputs for g in groups))
        readers = {}
        for group in groups:
            names = group.read_names() if isinstance(group, FusedNode) else group.read_names
            for name in names & written:
                readers.setdefault(name, []).append(group)
        return readers

    def _fusion_graph(self, groups) -> FusionGraph:
        owner = self._group_of(groups)
        readers = self._input_readers(groups)
        preds = {id(g): self._direct_preds(g, owner, readers) for g in groups}
        # in dependency order (a write into an input may come before, by position, a read
        # it must follow, once fused with an earlier node)
        return FusionGraph(self._topological_order(groups, preds), preds)

    # ---- fusion -----------------------------------------------------------------------
    def _fuse(self, groups):
        for _ in range(10):
            fused_any = False
            graph = self._fusion_graph(groups)
            fusible = [g for g in groups if isinstance(g, FusedNode)]
            consumed = set()
            for _, a, b in candidate_pairs(fusible, self._score, FusedNode.tiny_size):
                if id(a) in consumed or id(b) in consumed:
                    continue
                merged = self._try_fuse(a, b, graph)
                if merged is None:
                    continue
                consumed |= {id(a), id(b)}
                groups = [g for g in groups if g is not a and g is not b] + [merged]
                graph.merge(a, b, merged)   # fusion adds paths
                fused_any = True
            if not fused_any:
                break
        metrics.fused_node_count += sum(len(g.nodes) for g in groups if isinstance(g, FusedNode) and len(g.nodes) > 1)
        return groups

    def _dtype_of(self, name: str) -> Optional[torch.dtype]:
        buffer = self.graph.name_to_buffer.get(name)     # (graph inputs included)
        return None if buffer is None else buffer.get_dtype()

    def _bytes_of(self, name: str) -> int:
        """The bytes of buffer ``name`` (its size hint), 0 for a name that is no buffer."""
        if name not in self._bytes_cache:
            buffer = self.graph.name_to_buffer.get(name)
            self._bytes_cache[name] = 0 if buffer is None else \
                sym.hint(buffer.layout.numel()) * buffer.get_dtype().itemsize
        return self._bytes_cache[name]

    def _score(self, a: FusedNode, b: FusedNode) -> int:
        """Bytes that fusing saves: buffers one writes and the other reads, and shared reads.
        Two tiny kernels of one shape that share nothing still score 1: one launch saved
        (the second stages of split reductions, for one)."""
        shared = (a.names & b.read_names()) | (b.names & a.read_names()) | (a.read_names() & b.read_names())
        total = sum(self._bytes_of(name) for name in shared)
        if total == 0 and a.tiny_size() is not None and a.tiny_size() == b.tiny_size():
            return 1
        return total

    def _try_fuse(self, a: FusedNode, b: FusedNode, graph: FusionGraph) -> Optional[FusedNode]:
        first, second = (a, b) if a.position <= b.position else (b, a)
        if len(a.nodes) + len(b.nodes) > config.max_fusion_size:
            return None
        prologue = (a.template or b.template) and (self._prologue(a, b) or self._prologue(b, a))
        if (a.template or b.template) and not (prologue or self._is_epilogue(a, b) or self._is_epilogue(b, a)):
            return None
        if graph.fusion_closes_a_cycle(first, second):
            return None
        if prologue:
            return prologue
        group = self._combined_group(a, b)
        if group is None:
            return None
        x_numel, r_numel = group
        merged = FusedNode(a.nodes + b.nodes, a.device, x_numel, r_numel, a.names | b.names, a.prologue | b.prologue)
        if any(n.sizes_in_group(x_numel, r_numel) is None for n in merged.nodes if n.name not in merged.prologue):
            return None
        if not self._mutation_fusion_ok(merged) or not self._input_write_fusion_ok(merged):
            return None
        if not self._dependencies_line_up(merged):
            return None
        backend = self.backend_for_device(a.device)
        vertical = bool((a.names & b.read_names()) or (b.names & a.read_names()))
        allowed = backend.can_fuse_vertical(first, second, merged) if vertical else \
            backend.can_fuse_horizontal(first, second, merged)
        return merged if allowed else None

    @staticmethod
    def _is_epilogue(template: FusedNode, other: FusedNode) -> bool:
        """Whether ``other`` may join ``template``'s group as epilogue: pointwise (no scan,
        no scatter), reading what the group writes, writing nothing the template group
        reads (no prologue), and holding no template of its own."""
        return (template.template is not None and other.template is None and not other.is_reduction()
                and all(n.mutated_name is None and n.written_input is None for n in other.nodes)
                and bool(template.names & other.read_names()) and not (other.names & template.read_names()))

    def _prologue(self, template: FusedNode, other: FusedNode) -> Optional[FusedNode]:
        """``template``'s group with ``other`` (one pointwise node producing an operand that
        only the template reads) computed in the template's operand load, or None
        (prologue_fusion.py decides)."""
        if config.gemm_prologue_fusion == "off" or template.template is None or len(other.nodes) != 1 \
                or other.template is not None:
            return None
        producer = other.nodes[0]
        readers = {node.name for node in self.nodes if producer.name in node.read_names}
        why = prologue_operand(template.template, producer, readers, self.output_names, self._dtype_of)
        if why:
            log.debug("no prologue fusion of %s into %s: %s", producer.name, template.template.name, why)
            return None
        return FusedNode(template.nodes + other.nodes, template.device, template.x_numel, template.r_numel,
                         template.names | other.names, template.prologue | {producer.name})

    @staticmethod
    def _combined_group(a: FusedNode, b: FusedNode):
        same = sym.same_size
        if a.r_numel != 1 and b.r_numel != 1:
            return (a.x_numel, a.r_numel) if same(a.x_numel, b.x_numel) and same(a.r_numel, b.r_numel) else None
        if a.r_numel == 1 and b.r_numel == 1:
            return (a.x_numel, sympy.Integer(1)) if same(a.x_numel, b.x_numel) else None
        red, pw = (a, b) if a.r_numel != 1 else (b, a)
        if same(pw.x_numel, red.x_numel) or same(pw.x_numel, red.x_numel * red.r_numel):
            return red.x_numel, red.r_numel
        return None

    def _dependencies_line_up(self, merged: FusedNode) -> bool:
        """Every read of a buffer produced inside the kernel must be of the very element
        that the same loop iteration produced (else another program computes it)."""
        writes, reads, kinds = {}, [], {}
        for node, x_sizes, r_sizes, kind in merged.node_layouts():
            node_reads, write = extract_deps(node.buffer, x_sizes, r_sizes)
            writes[write.name] = write
            kinds[write.name] = kind
            reads.extend((dep, kind) for dep in node_reads)
        for dep, reader_kind in reads:
            write = writes.get(dep.name)
            if write is None:
                continue
            if dep.indirect or not self._same_element(dep, write):
                return False
            producer_kind = kinds[dep.name]
            if producer_kind == "xr":
                if reader_kind == "x" or dep.r_sizes != write.r_sizes:
                    return False
        return True

    @staticmethod
    def _mutation_fusion_ok(merged: FusedNode) -> bool:
        """A scatter may share a kernel with the producers of what it writes and with nodes
        that share its reads, never with the producer of the buffer it writes into (that
        must be complete first) nor with a reader of its result (other programs are still
        writing it)."""
        for node in merged.nodes:
            if node.mutated_name is None:
                continue
            if node.mutated_name in merged.names:
                return False
            if any(node.name in other.read_names for other in merged.nodes if other is not node):
                return False
        return True

    def _input_write_fusion_ok(self, merged: FusedNode) -> bool:
        """A kernel that writes into a graph input may read the input's old value only
        where every program reads each element before writing it: each read is of the
        element the writing node writes in the same iteration (no other index, nothing
        indirect), and comes first: by a node whose value the writer uses (a reduction
        kernel's epilogue), or, in a pointwise kernel (one loop, nodes in order), by an
        earlier node."""
        if not merged.written_inputs:
            return True
        layouts = merged.node_layouts()
        writers = {node.written_input: (node, kind, extract_deps(node.buffer, xs, rs)[1])
                   for node, xs, rs, kind in layouts if node.written_input is not None}
        uses = self._uses_within(merged)
        for node, x_sizes, r_sizes, kind in layouts:
            reads, _ = extract_deps(node.buffer, x_sizes, r_sizes)
            for dep in reads:
                if dep.name not in writers:
                    continue
                writer, writer_kind, write = writers[dep.name]
                if dep.indirect or kind != writer_kind or not self._same_element(dep, write) \
                        or dep.r_sizes != write.r_sizes:
                    return False
                before = node is writer or node.name in uses[writer.name] or (
                    merged.r_numel == 1 and node.position < writer.position)
                if not before:
                    return False
        return True

    @staticmethod
    def _uses_within(merged: FusedNode):
        """{node name: the names of the group's nodes whose values it uses, transitively}."""
        uses = {}
        for node in sorted(merged.nodes, key=lambda n: n.position):
            direct = node.read_names & merged.names
            uses[node.name] = set(direct).union(*(uses.get(name, set()) for name in direct))
        return uses

    @staticmethod
    def _same_element(dep, write) -> bool:
        if dep.x_sizes == write.x_sizes:
            return dep.index == write.index
        # the same row-major positions split into dims differently (e.g. a reduction's
        # (8, 1024) rows read by an epilogue that merged them into (8192,))
        flat_dep, flat_write = flat_x_form(dep), flat_x_form(write)
        return flat_dep is not None and flat_dep == flat_write

    # ---- order and lifetimes ----------------------------------------------------------
    def _topological_order(self, groups, preds=None):
        """``groups`` in dependency order, the earliest (by position) of those ready first."""
        if preds is None:
            owner = self._group_of(groups)
            readers = self._input_readers(groups)
            preds = {id(g): self._direct_preds(g, owner, readers) for g in groups}
        waiting = {id(g): len(preds[id(g)]) for g in groups}
        successors = {}
        for group in groups:
            for pred in preds[id(group)]:
                successors.setdefault(pred, []).append(group)
        index = {id(g): i for i, g in enumerate(groups)}   # (a tie-break the heap never compares groups by)
        ready = [(g.position, index[id(g)], g) for g in groups if not waiting[id(g)]]
        heapq.heapify(ready)
        order = []
        while ready:
            _, _, group = heapq.heappop(ready)
            order.append(group)
            for successor in successors.get(id(group), ()):
                waiting[id(successor)] -= 1
                if not waiting[id(successor)]:
                    heapq.heappush(ready, (successor.position, index[id(successor)], successor))
        if len(order) != len(groups):
            raise AssertionError("cycle in the fused graph")
        return order

    def internal_buffers(self, group: FusedNode):
        """Buffers produced and consumed only inside ``group``: never allocated. (Not a
        cat's slice: it is part of the cat's memory, whoever reads it.)"""
        readers = self._readers()
        in_memory = {node.name for node in group.nodes if node.written_input is not None or node.is_concat_slice}
        return {name for name in group.names if name not in self.output_names and name not in in_memory
                and not readers.get(name, set()) - {id(group)}}

    def _readers(self):
        """{buffer name: ids of the groups that read it} (the groups are final by now)."""
        if getattr(self, "_readers_cache", None) is None:
            self._readers_cache = {}
            for group in self.groups:
                for name in (group.read_names() if isinstance(group, FusedNode) else group.read_names):
                    self._readers_cache.setdefault(name, set()).add(id(group))
        return self._readers_cache

    def last_uses(self):
        """{buffer name: index of the last group that reads or writes it}."""
        last = {}
        for i, group in enumerate(self.groups):
            if isinstance(group, FusedNode):
                names = group.names | group.read_names()
            else:
                names = set(group.output_names) | group.read_names
            for name in names:
                last[name] = i
        return last
