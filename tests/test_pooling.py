"""Pooling and resampling (lowering/pooling.py; upsampling through lowering/indexing.py): max/avg/adaptive
pooling and nearest/bilinear upsampling, forward and backward, against eager on every
column of the device matrix; pools fuse with their neighbours; windows too large to
unroll fall back (logged), as in Inductor."""
import math

import pytest
import torch
import torch.nn.functional as F

import tritonfuse
from common import assert_same, check, kernel_count, rand
from test_layout_ops import check_symbolic_with_grad, check_with_grad


def _no_fallbacks():
    assert not tritonfuse.metrics.fallbacks, tritonfuse.metrics.fallbacks
    assert kernel_count() >= 1


def image(*shape, device, dtype=torch.float32, nan=False):
    x = rand(*shape, device=device, dtype=dtype)
    if nan:
        x.view(-1)[3] = math.nan
    return x


MAX_POOL = {
    "k2": (lambda x: F.max_pool2d(x, 2), (2, 3, 8, 10)),
    "k3_s2_p1": (lambda x: F.max_pool2d(x, 3, 2, 1), (2, 3, 9, 11)),
    "k3_s1_ceil": (lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), (1, 2, 8, 7)),
    "k3_dilation": (lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2), (1, 2, 9, 8)),
    "rect_window": (lambda x: F.max_pool2d(x, (2, 3), (2, 1), (1, 0)), (2, 2, 7, 6)),
    "unbatched": (lambda x: F.max_pool2d(x, 3, 2), (3, 7, 9)),
    "1d": (lambda x: F.max_pool1d(x, 3, 2, 1), (2, 3, 11)),
    "3d": (lambda x: F.max_pool3d(x, 2, 2, 1), (1, 2, 5, 6, 7)),
}


@pytest.mark.parametrize("name", sorted(MAX_POOL))
def test_max_pool(device, name):
    fn, shape = MAX_POOL[name]
    check_with_grad(fn, image(*shape, device=device))
    _no_fallbacks()


WITH_INDICES = {
    "k3_s2_p1": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (2, 3, 9, 11)),
    "k3_dilation": (lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2, return_indices=True), (1, 2, 9, 8)),
    "ceil": (lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True, return_indices=True), (1, 2, 8, 7)),
    "1d": (lambda x: F.max_pool1d(x, 3, 2, 1, return_indices=True), (2, 3, 11)),
    "3d": (lambda x: F.max_pool3d(x, 2, 2, 1, return_indices=True), (1, 2, 5, 6, 7)),
}


@pytest.mark.parametrize("name", sorted(WITH_INDICES))
def test_max_pool_indices(device, name):
    """The indices too: the first maximum, or the last NaN, as in eager."""
    fn, shape = WITH_INDICES[name]
    x = image(*shape, device=device, nan=True)
    x.view(-1)[10:14] = 2.5   # ties
    check(fn, x)
    _no_fallbacks()


@pytest.mark.parametrize("name", ["k3_s2_p1", "k3_dilation", "ceil", "rect_window", "unbatched"])
def test_training_saves_window_offsets_not_indices(device, name, monkeypatch):
    """Between forward and backward a max pool's indices travel as int8 window offsets
    (pool_offsets.py), recomputed into indices in the backward: the backward graph gets an
    int8 input the pooled map's shape and no int64 one; the gradients are eager's."""
    import tritonfuse.compile_fx as compile_fx
    fn, shape = {**MAX_POOL, **WITH_INDICES}[name]
    inputs = {}
    compile_graph = compile_fx.compile_graph

    def recording(gm, example_inputs, graph_id, **kwargs):
        inputs[graph_id.split("_")[0]] = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        return compile_graph(gm, example_inputs, graph_id, **kwargs)
    monkeypatch.setattr(compile_fx, "compile_graph", recording)
    monkeypatch.setattr(tritonfuse.config, "graph_cache", False)

    def values(a):
        out = fn(a * 1.5)
        return out[0] if isinstance(out, tuple) else out
    check_with_grad(values, image(*shape, device=device))
    pooled = tuple(values(image(*shape, device=device)).shape)
    saved = {(tuple(t.shape), t.dtype) for t in inputs["backward"]}
    assert (pooled, torch.int8) in saved and (pooled, torch.int64) not in saved, saved


def test_max_pool_backward_computes_a_branch_sum_gradient_once(device, monkeypatch):
    """Each input element of a 3x3 stride-2 pool gathers the gradient of up to 4 outputs: a
    gradient that is still a computation (a residual block's branches summed under relu
    masks) is realized once, not recomputed with all its loads per covering output."""
    from tritonfuse.lowering import pooling
    gathered = []
    realize_if_costly = pooling.realize_if_costly

    def recording(x):
        realize_if_costly(x)
        gathered.append(x)
    monkeypatch.setattr(pooling, "realize_if_costly", recording)
    monkeypatch.setattr(tritonfuse.config, "graph_cache", False)
    w1, w2 = rand(8, 8, 3, 3, device=device) * 0.2, rand(8, 8, 1, 1, device=device) * 0.2

    def block(a):
        pooled = F.max_pool2d(torch.relu(a * 1.5), 3, 2, 1)
        branch = torch.relu(F.conv2d(pooled, w1, padding=1)) + F.conv2d(pooled, w2)
        return torch.relu(branch + pooled)
    check_with_grad(block, image(2, 8, 12, 12, device=device))
    grads = [g for g in gathered if len(g.get_size()) == 4 and list(g.get_size())[-1] == 6]
    assert grads and all(g.data.is_realized() for g in grads), [type(g.data.data).__name__ for g in grads]


def test_avg_pool_of_int64_divides_with_truncation(device):
    """eager's CPU average pool takes int64: the integer sum divided as C++ divides (toward
    zero), also where the window is cut by padding."""
    if device == "cuda":
        pytest.skip("eager's CUDA average pool takes no integer tensors")
    x = torch.randint(-9, 9, (2, 3, 7, 6), device=device)
    check(lambda a: (F.avg_pool2d(a, 2), F.avg_pool2d(a, 3, 2, 1, count_include_pad=False),
                     F.avg_pool1d(a.flatten(2), 3, 1, 1)), x)
    _no_fallbacks()


def test_max_pool_bfloat16_and_special_values(device):
    x = image(2, 3, 8, 9, device=device, dtype=torch.bfloat16, nan=True)
    x[0, 1, 2, :] = -math.inf
    check(lambda a: F.max_pool2d(a, 3, 2, 1, return_indices=True), x)
    _no_fallbacks()


AVG_POOL = {
    "k2": (lambda x: F.avg_pool2d(x, 2), (2, 3, 8, 10)),
    "k3_s2_p1": (lambda x: F.avg_pool2d(x, 3, 2, 1), (2, 3, 9, 11)),
    "ceil_exclude_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), (1, 2, 8, 7)),
    "ceil_include_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), (1, 2, 8, 7)),
    "divisor_override": (lambda x: F.avg_pool2d(x, (2, 3), (1, 2), 1, divisor_override=4), (2, 2, 7, 6)),
    "unbatched": (lambda x: F.avg_pool2d(x, 3, 2), (3, 7, 9)),
    "1d": (lambda x: F.avg_pool1d(x, 3, 2, 1), (2, 3, 11)),
    "3d": (lambda x: F.avg_pool3d(x, 2, 2, 1), (1, 2, 5, 6, 7)),
    "3d_exclude_pad": (lambda x: F.avg_pool3d(x, (3, 3, 2), 2, 1, count_include_pad=False), (1, 2, 5, 6, 7)),
}


@pytest.mark.parametrize("name", sorted(AVG_POOL))
def test_avg_pool(device, name):
    fn, shape = AVG_POOL[name]
    check_with_grad(fn, image(*shape, device=device))
    _no_fallbacks()


ADAPTIVE = {
    "divisible": (lambda x: F.adaptive_avg_pool2d(x, (4, 5)), (2, 3, 8, 10)),
    "global": (lambda x: F.adaptive_avg_pool2d(x, 1), (2, 3, 7, 7)),
    "uneven": (lambda x: F.adaptive_avg_pool2d(x, (3, 4)), (2, 3, 8, 10)),
    "upscaling": (lambda x: F.adaptive_avg_pool2d(x, (5, 7)), (1, 2, 3, 4)),
    "unbatched": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), (3, 7, 9)),
    "1d": (lambda x: F.adaptive_avg_pool1d(x, 4), (2, 3, 11)),
}


@pytest.mark.parametrize("name", sorted(ADAPTIVE))
def test_adaptive_avg_pool(device, name):
    fn, shape = ADAPTIVE[name]
    check_with_grad(fn, image(*shape, device=device))
    _no_fallbacks()


@pytest.mark.parametrize("name", ["avg", "adaptive", "max"])
def test_pools_bfloat16(device, name):
    fn = {"avg": lambda a: F.avg_pool2d(a, 3, 2, 1), "adaptive": lambda a: F.adaptive_avg_pool2d(a, (3, 4)),
          "max": lambda a: F.max_pool2d(a, 3, 2, 1)}[name]
    check(fn, image(2, 3, 8, 10, device=device, dtype=torch.bfloat16))
    _no_fallbacks()


def test_pools_of_a_channels_last_input(device):
    x = image(2, 5, 9, 11, device=device).to(memory_format=torch.channels_last)
    check(lambda a: (F.max_pool2d(a, 3, 2, 1, return_indices=True), F.avg_pool2d(a, 2),
                     F.adaptive_avg_pool2d(a, (2, 3))), x)
    _no_fallbacks()


def test_avg_pool_fuses_with_its_producer(device):
    """avg_pool2d(relu(x)): the relu is computed in the pool's kernel."""
    check(lambda a: F.avg_pool2d(torch.relu(a), 3, 2, 1), image(2, 3, 9, 11, device=device))
    _no_fallbacks()
    assert kernel_count() == 1


def test_max_pool_then_relu_is_one_kernel(device):
    check(lambda a: torch.relu(F.max_pool2d(a, 3, 2, 1)) + 1, image(2, 3, 9, 11, device=device))
    _no_fallbacks()
    assert kernel_count() == 1


def test_pool_of_a_costly_input_reads_it_from_memory(device):
    """An input with several loads is computed once, not once per window position."""
    x, y = image(2, 3, 9, 11, device=device), image(2, 3, 9, 11, device=device)
    check(lambda a, b: F.max_pool2d(a * b + a.exp(), 3, 2, 1), x, y)
    _no_fallbacks()
    assert kernel_count() == 2


def test_large_window_falls_back(device):
    """More than 25 window positions: aten's kernel, as in Inductor (logged)."""
    check(lambda a: F.max_pool2d(a, 6) + 1, image(1, 2, 12, 12, device=device))
    assert "aten.max_pool2d_with_indices.default" in tritonfuse.metrics.fallbacks
    assert "more than 25" in tritonfuse.metrics.fallbacks["aten.max_pool2d_with_indices.default"]


# ---- symbolic sizes: the windows are static, the sizes they slide over are not ------------

SYMBOLIC_POOLS = {
    "max_pool": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max_pool_ceil": lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True),
    "max_pool_dilation": lambda x: F.max_pool2d(x, 2, 1, 1, dilation=2),
    "avg_pool": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg_pool_no_pad_count": lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False, ceil_mode=True),
    "avg_pool_no_padding": lambda x: F.avg_pool2d(x, 2),
    "global_avg_pool": lambda x: F.adaptive_avg_pool2d(x, 1),
}


# every H and W = 1 (mod 4): each pool's (size + padding - window) % stride is the same for all
# three shapes. torch 2.11's pooling meta (div_rtn) guards on that remainder, and Dynamo
# recompiles where it changes (torch 2.13's does not guard); its upsample_nearest
# decomposition guards on channels <= 3, so every shape has more.
POOL_SHAPES = [(2, 4, 9, 13), (3, 5, 5, 9), (4, 6, 13, 17)]


@pytest.mark.parametrize("name", sorted(SYMBOLIC_POOLS))
def test_pool_with_symbolic_sizes(device, name):
    check_symbolic_with_grad(SYMBOLIC_POOLS[name], device, shapes=POOL_SHAPES)
    _no_fallbacks()


def test_max_pool_indices_with_symbolic_sizes(device):
    fn = lambda a: F.max_pool2d(a, 3, 2, 1, return_indices=True)   # noqa: E731
    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for shape in POOL_SHAPES:
            x = image(*shape, device=device, nan=True)
            assert_same(compiled(x), fn(x))
    _no_fallbacks()
    assert tritonfuse.metrics.symbolic_graphs == 1 and tritonfuse.metrics.static_specializations == 0


def test_symbolic_training_saves_window_offsets(device, monkeypatch):
    """Under symbolic sizes too the backward gets int8 window offsets (no 4-d int64 indices),
    one compile serves every shape, and the gradients are eager's."""
    import tritonfuse.compile_fx as compile_fx
    saved = []
    compile_graph = compile_fx.compile_graph

    def recording(gm, example_inputs, graph_id, **kwargs):
        if graph_id.startswith("backward"):
            saved.extend((t.dim(), t.dtype) for t in example_inputs if isinstance(t, torch.Tensor))
        return compile_graph(gm, example_inputs, graph_id, **kwargs)
    monkeypatch.setattr(compile_fx, "compile_graph", recording)
    monkeypatch.setattr(tritonfuse.config, "graph_cache", False)
    check_symbolic_with_grad(lambda a: F.max_pool2d(torch.relu(a * 1.5), 3, 2, 1), device, shapes=POOL_SHAPES)
    assert (4, torch.int8) in saved and (4, torch.int64) not in saved, saved


def test_adaptive_pool_over_symbolic_sizes_falls_back_alone(device):
    """Its windows follow from the sizes: aten runs it (logged); the rest stays symbolic."""
    check_symbolic_with_grad(lambda a: F.adaptive_avg_pool2d(a.exp(), (2, 3)).relu(), device)
    fallbacks = tritonfuse.metrics.fallbacks
    assert set(fallbacks) == {"aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d_backward.default"}
    assert "symbolic" in fallbacks["aten._adaptive_avg_pool2d.default"]


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_with_symbolic_sizes(device, mode):
    check_symbolic_with_grad(lambda a: F.interpolate(a, scale_factor=2, mode=mode) * 2, device, shapes=POOL_SHAPES)
    # the backward's index_put with accumulation (a scatter) is the one op left to aten
    assert set(tritonfuse.metrics.fallbacks) <= {"aten._unsafe_index_put.default"}


# ---- upsampling: torch decomposes it into _unsafe_index reads (lowering/indexing.py) ----

UPSAMPLE = {
    "nearest_2x": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), (2, 3, 5, 7)),
    "nearest_odd_size": (lambda x: F.interpolate(x, size=(11, 13), mode="nearest"), (2, 3, 5, 7)),
    "nearest_down": (lambda x: F.interpolate(x, size=(3, 4), mode="nearest"), (2, 3, 8, 9)),
    "nearest_scale_2_5": (lambda x: F.interpolate(x, scale_factor=2.5, mode="nearest"), (1, 2, 4, 6)),
    "nearest_exact": (lambda x: F.interpolate(x, size=(11, 13), mode="nearest-exact"), (2, 3, 5, 7)),
    "nearest_1d": (lambda x: F.interpolate(x, scale_factor=3, mode="nearest"), (2, 3, 7)),
    "nearest_3d": (lambda x: F.interpolate(x, size=(5, 6, 7), mode="nearest"), (1, 2, 3, 4, 5)),
    "bilinear": (lambda x: F.interpolate(x, size=(11, 13), mode="bilinear"), (2, 3, 5, 7)),
    "bilinear_align_corners": (lambda x: F.interpolate(x, size=(11, 13), mode="bilinear", align_corners=True),
                               (2, 3, 5, 7)),
    "bilinear_scale_factor": (lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear"), (2, 3, 5, 7)),
    "bilinear_down": (lambda x: F.interpolate(x, size=(3, 4), mode="bilinear", align_corners=True), (1, 2, 8, 9)),
}


@pytest.mark.parametrize("name", sorted(UPSAMPLE))
def test_upsample(device, name):
    fn, shape = UPSAMPLE[name]
    check(lambda a: fn(a) * 2, image(*shape, device=device))
    _no_fallbacks()
    assert kernel_count() == 1


@pytest.mark.parametrize("name", ["nearest_2x", "bilinear"])
def test_upsample_bfloat16_and_backward(device, name):
    fn, shape = UPSAMPLE[name]
    check(fn, image(*shape, device=device, dtype=torch.bfloat16))
    _no_fallbacks()
    # the backward is index_put with accumulation (a scatter): right, whatever runs it
    check_with_grad(fn, image(*shape, device=device))


# ---- a ResNet-style training step ---------------------------------------------------------

class _Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        nn = torch.nn
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class _ResNet(torch.nn.Module):
    """conv -> batch_norm -> relu -> max_pool2d -> residual blocks -> adaptive_avg_pool2d -> linear."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.blocks = nn.Sequential(_Block(8, 8, 1), _Block(8, 16, 2))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


# what stays aten in a CNN training step: matmuls and convolutions, as in Inductor
CNN_FALLBACKS = {"aten.convolution.default", "aten.convolution_backward.default", "aten.addmm.default",
                 "aten.mm.default"}


def test_resnet_style_training_step(device):
    torch.manual_seed(0)
    eager_model, model = _ResNet().to(device), _ResNet().to(device)
    model.load_state_dict(eager_model.state_dict())
    x = torch.randn(2, 3, 32, 32, device=device)
    target = torch.randint(0, 10, (2,), device=device)

    def step(m):
        out = m(x)
        loss = F.cross_entropy(out, target)
        loss.backward()
        return [out, loss] + [p.grad for p in m.parameters()] + list(m.buffers())

    expected = step(eager_model)
    actual = step(torch.compile(model, backend="tritonfuse"))
    assert tritonfuse.metrics.eager_graphs == 0
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
    assert set(tritonfuse.metrics.fallbacks) <= CNN_FALLBACKS, tritonfuse.metrics.fallbacks
    assert kernel_count() > 10
