"""CUDA-graph semantics on CPU tensors, for testing tritonfuse/runtime/cudagraphs.py where
there is no GPU.

A real capture records the kernels and a replay re-runs them on the same memory. The
emulation captures by running the graph (its outputs become the static outputs) and
replays by running it again on the static inputs and copying the results into those
static outputs: afterwards memory holds what a real replay leaves there, so stale
outputs, saved tensors and gradients are overwritten exactly as on a GPU. Marking stale
outputs (a CUDA-only torch API) is recorded instead, for the tests to check.
"""
import torch

from tritonfuse.runtime import cudagraphs


class EmulatedDriver:
    can_invalidate = True

    def __init__(self):
        self.invalidated = []      # storage handles the runner marked stale, in order
        self.replays = 0

    def why_unavailable(self):
        return None

    def capture(self, run, static_inputs, device):
        run(list(static_inputs))                      # the warm-up on the capture stream
        outputs = list(run(list(static_inputs)))
        return (run, list(static_inputs), outputs), outputs

    def replay(self, graph):
        run, static_inputs, static_outputs = graph
        self.replays += 1
        for static, fresh in zip(static_outputs, run(list(static_inputs))):
            if isinstance(static, torch.Tensor) and static.data_ptr() != fresh.data_ptr():
                static.copy_(fresh)

    def current_stream(self, device):
        return None

    def current_raw_stream(self, device):
        return 0

    def invalidate(self, storage_cdata):
        self.invalidated.append(storage_cdata)
        return True

    def tensor_on(self, storage, meta):
        return cudagraphs._tensor_on(storage, meta)
