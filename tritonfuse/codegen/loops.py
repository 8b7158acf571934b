"""Loop structure shared by the code generators: how the nodes of one fused reduction
group split into consecutive loops over the reduced dims ("segments").

A node that reads a reduction computed in the open loop must wait for the loop to end,
so it starts a new loop; nodes over the rows only ("x" nodes) run between loops. The
C++ backend runs every segment inside one parallel loop over the rows (outer-loop
fusion); Triton runs them one after the other inside one program.
"""
from dataclasses import dataclass
from typing import List


@dataclass
class Segment:
    index: int
    is_loop: bool
    layouts: list   # (node, x sizes, r sizes, kind) in order


def plan_segments(layouts) -> List[Segment]:
    segments: List[Segment] = []
    pending = set()
    for layout in layouts:
        node, _, _, kind = layout
        current = segments[-1] if segments else None
        if kind == "x":
            if current is None or current.is_loop:
                current = Segment(len(segments), False, [])
                segments.append(current)
                pending = set()
        else:
            if current is None or not current.is_loop or (node.read_names & pending):
                current = Segment(len(segments), True, [])
                segments.append(current)
                pending = set()
        current.layouts.append(layout)
        if node.is_reduction():
            pending.add(node.name)
    return segments


def buffers_crossing_loops(segments) -> set:
    """Buffers written inside one loop and read in another loop of the same kernel."""
    written_in = {}
    for seg in segments:
        for node, _, _, kind in seg.layouts:
            if seg.is_loop and kind == "xr":
                written_in[node.name] = seg.index
    crossing = set()
    for seg in segments:
        for node, _, _, _ in seg.layouts:
            for name in node.read_names:
                if name in written_in and written_in[name] != seg.index:
                    crossing.add(name)
    return crossing
