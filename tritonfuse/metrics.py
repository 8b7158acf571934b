"""Counters that tests and users read after a compile. ``reset()`` zeroes them.

generated_kernel_count   kernels generated (Triton or C++), not counting cache hits
generated_kernels        their names, in order
fused_node_count         scheduler nodes that ended up in a kernel with another node
fallbacks                {aten op name: reason} for every op that ran as an aten call
outer_loop_fusions       one (inner_kernel_count, local_buffer_count) per C++ outer-loop fusion
graph_cache_hits         compiled graphs loaded from the on-disk cache
eager_graphs             graphs that failed to compile and run eagerly instead (logged)
cpp_builds / cpp_build_cache_hits   C++ compilations run / skipped thanks to the build cache
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class OuterLoopFusion:
    inner_kernel_count: int
    local_buffer_count: int


generated_kernel_count = 0
generated_kernels: list = []
fused_node_count = 0
fallbacks: dict = {}
outer_loop_fusions: list = []
graph_cache_hits = 0
eager_graphs = 0   # graphs tritonfuse failed to compile and ran eagerly instead
cpp_builds = 0
cpp_build_cache_hits = 0


def reset() -> None:
    global generated_kernel_count, fused_node_count, graph_cache_hits, cpp_builds, cpp_build_cache_hits
    global eager_graphs
    generated_kernel_count = 0
    eager_graphs = 0
    fused_node_count = 0
    graph_cache_hits = 0
    cpp_builds = 0
    cpp_build_cache_hits = 0
    generated_kernels.clear()
    fallbacks.clear()
    outer_loop_fusions.clear()


def record_kernel(name: str) -> None:
    global generated_kernel_count
    generated_kernel_count += 1
    generated_kernels.append(name)
