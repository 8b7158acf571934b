"""The narrow interface between the shared scheduler and a code generator."""


class BackendScheduling:
    """One instance per compiled graph and device. A backend decides whether two fused
    groups may share a kernel (after the scheduler's own legality checks) and turns each
    group into a kernel definition plus a call in the wrapper."""

    # Lowering realizes a transcendental value read by several consumers (instead of
    # recomputing it) when the device's backend sets this.
    materialize_expensive_reuse = False
    # var/std rows up to this many elements are lowered as two passes instead of Welford.
    two_pass_variance_max_row = 0
    # ... except rows read along a strided dim (a transposed input's), which take Welford.
    welford_for_strided_rows = False
    # Lower sum(exp(x - amax(x))) as one online "sumexp" reduction (see patterns.py).
    online_softmax = False
    # Indirect writes (ops.store_scatter) that combine with the element, by mode: the
    # dtypes the backend does (plain stores take every dtype). Lowering falls back for
    # the others. deterministic_scatter: float sums come out the same on every run.
    scatter_dtypes = {}
    deterministic_scatter = True

    def __init__(self, scheduler, wrapper, graph):
        self.scheduler = scheduler
        self.wrapper = wrapper
        self.graph = graph

    def can_fuse_vertical(self, first, second, merged) -> bool:
        """``second`` reads what ``first`` writes; ``merged`` is the candidate group."""
        return True

    def can_fuse_horizontal(self, first, second, merged) -> bool:
        """``first`` and ``second`` share reads but not each other's results."""
        return True

    def codegen_node(self, group) -> None:
        """Emit the kernel for ``group`` (a FusedNode) and its call into the wrapper."""
        raise NotImplementedError

    def flush(self) -> None:
        """Called once after every group was generated (e.g. to build batched sources)."""
