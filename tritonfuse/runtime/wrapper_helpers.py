"""Functions the generated host code calls."""
import torch

empty_strided = torch.empty_strided

try:   # allocates a CPU tensor without the Python argument parsing: ~0.6 us instead of ~1.4
    from torch._C._dynamo.guards import _empty_strided_cpu as empty_strided_cpu
except ImportError:  # an older or newer torch without it
    def empty_strided_cpu(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


try:   # ``tensor`` seen through another strided layout, ``offset`` relative to its data: ~0.6 us, not ~1.3
    from torch._C._dynamo.guards import _reinterpret_tensor as reinterpret_tensor
except ImportError:
    def reinterpret_tensor(tensor, size, stride, offset):
        return torch.as_strided(tensor, size, stride, tensor.storage_offset() + offset)


def ensure_layout(tensor, size, stride):
    """The compiled code assumed ``size``/``stride``: copy into that layout if it differs."""
    if tensor.stride() == stride and tensor.shape == size:
        return tensor
    if tuple(tensor.shape) != tuple(size):
        raise RuntimeError(f"tritonfuse: input of shape {tuple(tensor.shape)} passed to a graph compiled for "
                           f"{tuple(size)}")
    fixed = torch.empty_strided(size, stride, dtype=tensor.dtype, device=tensor.device)
    fixed.copy_(tensor)
    return fixed
