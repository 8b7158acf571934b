"""Functions the generated host code calls."""
import torch

empty_strided = torch.empty_strided

try:   # allocates a CPU tensor without the Python argument parsing: ~0.6 us instead of ~1.4
    from torch._C._dynamo.guards import _empty_strided_cpu as empty_strided_cpu
except ImportError:  # an older or newer torch without it
    def empty_strided_cpu(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


try:   # a CUDA tensor on the current device, without the Python argument parsing
    from torch._C._dynamo.guards import _empty_strided_cuda as empty_strided_cuda
except ImportError:  # generated code calls torch.empty_strided instead
    empty_strided_cuda = None


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
    if all(n == 1 or have == want for n, have, want in zip(size, tensor.stride(), stride)):
        return tensor       # strides differ only on dims of length 1, where they mean nothing
    fixed = torch.empty_strided(size, stride, dtype=tensor.dtype, device=tensor.device)
    expanded = [d for d, (n, st) in enumerate(zip(size, stride)) if n > 1 and st == 0]
    if not expanded:
        fixed.copy_(tensor)
        return fixed
    # compiled for an expanded input (stride 0): every element along those dims is read
    # from one place, which is right only if the values repeat along them
    source = tensor
    for d in expanded:
        source = source.narrow(d, 0, 1)
    if not torch.equal(source.expand(size), tensor):
        raise RuntimeError(f"tritonfuse: a graph compiled for an input expanded along dims {expanded} got one "
                           "whose values differ along them")
    compact = [1 if d in expanded else n for d, n in enumerate(size)]
    fixed.as_strided(compact, stride).copy_(source)
    return fixed
