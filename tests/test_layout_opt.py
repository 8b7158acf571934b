"""Layout optimization (layout_opt.py): with it forced on, graphs with 2-D convolutions keep
their feature maps channels_last. Every test runs a training step (or an inference call)
eagerly and compiled and compares outputs and gradients; it checks that the convolutions
received channels_last feature maps (by wrapping the aten ops the generated code calls)
and that what the caller sees (outputs, gradients) has eager's strides."""
import copy

import pytest
import torch
import torch.nn as nn

from tritonfuse import config, layout_opt, metrics
from tritonfuse.testing import run_and_get_code

TOLERANCES = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=6e-2, rtol=6e-2)}


@pytest.fixture(autouse=True)
def _full_float32_convolutions():
    """cuDNN runs float32 convolutions in TF32 by default, and picks other algorithms for
    NHWC than for NCHW: eager's own two layouts then differ by 1e-3 (H200). The float32
    comparisons are of the layouts at full precision. (The flags() context: once
    torch.testing._internal is imported, as the OpInfo tests do, plain assignment raises.)"""
    cudnn = torch.backends.cudnn
    with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                     allow_tf32=False):
        yield
CL = torch.channels_last


@pytest.fixture
def layout_on(monkeypatch):
    monkeypatch.setattr(config, "layout_opt", "1")


class ConvRecorder:
    """Within its block, stands in for ``torch.ops.aten.convolution`` and
    ``convolution_backward`` (which the generated code looks up at each call) and records
    the layouts of their arguments."""

    def __init__(self):
        self.calls = []
        self._patch = pytest.MonkeyPatch()

    def __enter__(self):
        for name, feature_maps in (("convolution", (0,)), ("convolution_backward", (0, 1))):
            self._patch.setattr(torch.ops.aten, name, self._wrap(name, getattr(torch.ops.aten, name), feature_maps))
        return self

    def __exit__(self, *exc):
        self._patch.undo()

    def _wrap(self, name, packet, feature_maps):
        recorder = self

        class Op:
            @staticmethod
            def default(*args, **kwargs):
                weight = args[feature_maps[-1] + 1]
                if not _onednn_exception(name, args, weight):
                    recorder.calls.append((name, [args[i].is_contiguous(memory_format=CL) for i in feature_maps],
                                           weight.is_contiguous(memory_format=CL)))
                return packet.default(*args, **kwargs)
        return Op

    def assert_channels_last(self, names=("convolution", "convolution_backward")):
        assert {name for name, _, _ in self.calls} == set(names), self.calls
        for name, maps, weight in self.calls:
            assert all(maps) and weight, (name, maps, weight)


def _onednn_exception(name, args, weight):
    """The CPU convolution backwards that get NCHW inputs (layout_opt.onednn_miscomputes)."""
    return name == "convolution_backward" and weight.device.type == "cpu" and weight.shape[2:] == (1, 1) \
        and any(s != 1 for s in args[4])


class ConvBnReluConv(nn.Module):
    def __init__(self, channels_in=3, width=8, stride=2):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)

    def forward(self, x):
        return self.conv2(torch.relu(self.bn(self.conv1(x))))


class ResidualBlock(nn.Module):
    """A ResNet basic block that halves the maps: 3x3 stride-2 and 3x3 convs, a 1x1
    stride-2 downsample on the shortcut, batch norms, relus."""

    def __init__(self, channels_in=4, width=8):
        super().__init__()
        self.stem = nn.Conv2d(channels_in, channels_in, 3, padding=1, bias=False)
        self.conv1 = nn.Conv2d(channels_in, width, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.down = nn.Sequential(nn.Conv2d(channels_in, width, 1, stride=2, bias=False), nn.BatchNorm2d(width))

    def forward(self, x):
        x = torch.relu(self.stem(x))
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.down(x)).mean((2, 3))


def _train_step(model, x, dtype, input_grad=True):
    model = model.to(dtype)
    x = x.detach().to(dtype).requires_grad_(input_grad)
    out = model(x)
    out.float().square().sum().backward()
    return [out] + ([x.grad] if input_grad else []) + [p.grad for p in model.parameters()]


def _check_training(module, x, dtype, input_grad=True):
    """Eager against compiled: a warm-up step compiles both graphs, the next one is
    compared and recorded. Returns the recorder."""
    eager, compiled_model = copy.deepcopy(module), copy.deepcopy(module)
    compiled = torch.compile(compiled_model, backend="tritonfuse", dynamic=False)
    _train_step(compiled, x, dtype, input_grad)
    compiled_model.zero_grad()
    for m in (eager, compiled_model):   # the same running statistics before the compared step
        m.load_state_dict(module.state_dict())
    with ConvRecorder() as recorder:
        actual = _train_step(compiled, x, dtype, input_grad)
    expected = _train_step(eager, x, dtype, input_grad)
    assert metrics.eager_graphs == 0
    if dtype == torch.float32:
        _assert_close_with_strides(actual, expected, dtype)
    else:   # bf16 rounding differs per op: no farther from float64 than eager is
        reference = copy.deepcopy(module).double()
        reference.load_state_dict(module.state_dict())
        _assert_as_close_as_eager(actual, expected, _train_step(reference, x, torch.float64, input_grad))
    return recorder


def _assert_as_close_as_eager(actual, expected, reference):
    if isinstance(expected, (list, tuple)):
        for a, e, r in zip(actual, expected, reference):
            _assert_as_close_as_eager(a, e, r)
        return
    assert actual.stride() == expected.stride(), (actual.shape, actual.stride(), expected.stride())
    eager_error = (expected.double() - reference).abs().max().item()
    error = (actual.double() - reference).abs().max().item()
    assert error <= 2 * eager_error + 1e-2 * reference.abs().max().item(), (error, eager_error)


def _assert_close_with_strides(actual, expected, dtype):
    if isinstance(expected, (list, tuple)):
        for a, e in zip(actual, expected):
            _assert_close_with_strides(a, e, dtype)
        return
    torch.testing.assert_close(actual, expected, **TOLERANCES[dtype])
    assert actual.stride() == expected.stride(), (actual.shape, actual.stride(), expected.stride())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_bn_relu_conv_training(device, layout_on, dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 11, device=device)
    recorder = _check_training(ConvBnReluConv().to(device), x, dtype)
    recorder.assert_channels_last()


@pytest.mark.parametrize("channels_in, size", [(1, (7, 9)), (3, (10, 10)), (4, (11, 5))])
def test_residual_block_training(device, layout_on, channels_in, size):
    torch.manual_seed(0)
    x = torch.randn(2, channels_in, *size, device=device)
    recorder = _check_training(ResidualBlock(channels_in).to(device), x, torch.float32)
    recorder.assert_channels_last()


def test_inference_keeps_eagers_output_strides(device, layout_on):
    torch.manual_seed(0)
    model = ConvBnReluConv(stride=1).to(device).eval()
    x = torch.randn(2, 3, 8, 6, device=device)
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model, backend="tritonfuse", dynamic=False)
        compiled(x)
        with ConvRecorder() as recorder:
            actual = compiled(x)
    _assert_close_with_strides(actual, expected, torch.float32)
    recorder.assert_channels_last(names=("convolution",))


def test_channels_last_input_is_not_copied(device, layout_on):
    """A feature map that arrives channels_last goes to the convolution as it is; the
    result keeps eager's (channels_last) strides."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, padding=1).to(device).to(memory_format=CL)
    x = torch.randn(2, 8, 6, 7, device=device).to(memory_format=CL)
    with torch.no_grad():
        expected = conv(x).relu()
        actual, sources = run_and_get_code(torch.compile(lambda t: conv(t).relu(), backend="tritonfuse"), x)
    _assert_close_with_strides(actual, expected, torch.float32)
    assert "clone" not in sources[0].split("def call")[1]


def _layout_free_function(x, w):
    y = torch.sigmoid(x) * w
    return y.sum((2, 3)), y.transpose(1, 2) + 1


def test_graph_without_convolution_is_unchanged(device, monkeypatch):
    monkeypatch.setattr(config, "graph_cache", False)
    x = torch.randn(2, 4, 5, 6, device=device)
    w = torch.randn(4, 1, 1, device=device)
    generated = {}
    for setting in ("0", "1"):
        monkeypatch.setattr(config, "layout_opt", setting)
        torch._dynamo.reset()
        result, sources = run_and_get_code(torch.compile(_layout_free_function, backend="tritonfuse"), x, w)
        _assert_close_with_strides(result, _layout_free_function(x, w), torch.float32)
        generated[setting] = [s.split("\n", 1)[1] for s in sources]   # less the header naming the graph
    assert generated["0"] == generated["1"]


def _no_caches_across_policies(monkeypatch):
    """These tests change layout_opt's module-level policy, which is code in real use (the
    caches' keys hold a fingerprint of it): an aot_autograd entry kept under another policy
    by an earlier test of this worker would hand back that policy's forward and backward."""
    monkeypatch.setattr(config, "graph_cache", False)


def test_auto_backward_follows_the_forward(device, monkeypatch):
    """Under "auto", the backward turns channels_last on when the forward did (its saved
    activations arrive channels_last), and off when it did not."""
    monkeypatch.setattr(config, "layout_opt", "auto")
    _no_caches_across_policies(monkeypatch)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 11, device=device)
    for forward_decides in (True, False):
        torch._dynamo.reset()
        monkeypatch.setattr(layout_opt, "CPU_DEFAULT", forward_decides)
        monkeypatch.setattr(layout_opt, "_worth_it_on_gpu", lambda *args, **kwargs: forward_decides)
        recorder = _check_training(ConvBnReluConv().to(device), x, torch.float32)
        if forward_decides:
            recorder.assert_channels_last()
        else:
            assert not any(any(maps) for _, maps, _ in recorder.calls), recorder.calls


class PatchEmbedding(nn.Module):
    """A ViT's patch embedding: non-overlapping patches into channels, flattened to tokens,
    after a class token."""

    def __init__(self, channels=8, patch=4):
        super().__init__()
        self.proj = nn.Conv2d(3, channels, patch, stride=patch)
        self.class_token = nn.Parameter(torch.randn(1, 1, channels))
        self.norm = nn.LayerNorm(channels)

    def forward(self, x):
        tokens = self.proj(x).flatten(2).transpose(1, 2)
        return self.norm(torch.cat([self.class_token.expand(len(x), -1, -1), tokens], 1))


@pytest.mark.parametrize("forward_decides, listed", [(True, True), (False, True), (False, False)])
def test_backward_given_channels_last_gradients_gets_channels_last_operands(device, monkeypatch, forward_decides,
                                                                          listed):
    """Eager's own trace hands a patch embedding's convolution backward a gradient laid out
    HWC per image (a view of the tokens' gradient past the class token) beside the NCHW
    image, whatever the forward decided. On a device of CHANNELS_LAST_GRADIENT_DEVICES
    (cuDNN would convert both itself) the backward copies the image and the gradient
    channels_last; the weight, which the weight's gradient does not read, keeps its
    layout. Elsewhere the layouts stay eager's."""
    monkeypatch.setattr(config, "layout_opt", "auto")
    _no_caches_across_policies(monkeypatch)
    monkeypatch.setattr(layout_opt, "CPU_DEFAULT", forward_decides)
    monkeypatch.setattr(layout_opt, "_worth_it_on_gpu", lambda *args, **kwargs: forward_decides)
    monkeypatch.setattr(layout_opt, "CHANNELS_LAST_GRADIENT_DEVICES", (torch.device(device).type,) if listed else ())
    torch._dynamo.reset()
    torch.manual_seed(0)
    image = torch.randn(2, 3, 16, 12, device=device)
    recorder = _check_training(PatchEmbedding().to(device), image, torch.float32, input_grad=False)
    calls = dict((name, (maps, weight)) for name, maps, weight in recorder.calls)
    assert calls["convolution"] == ([forward_decides], forward_decides), recorder.calls
    given = listed or forward_decides
    assert calls["convolution_backward"] == ([given, given], False), recorder.calls


@pytest.mark.parametrize("weight_shape, groups, expected", [
    ((128, 64, 3, 3), 1, True),       # an ordinary conv
    ((32, 32, 3, 3), 1, False),       # only small channel counts
    ((64, 256, 3, 3), 1, False),      # shrinks the channels (UNet-like)
    ((128, 32, 3, 3), 4, False),      # grouped, several input channels per group
    ((128, 1, 3, 3), 128, True),      # depthwise
])
def test_gpu_heuristics_follow_inductor(weight_shape, groups, expected):
    from torch.fx.experimental.proxy_tensor import make_fx
    x = torch.randn(2, weight_shape[1] * groups, 8, 8)
    gm = make_fx(lambda t, w: torch.relu(torch.nn.functional.conv2d(t, w, groups=groups)),
                 tracing_mode="fake")(x, torch.randn(weight_shape))
    convs = layout_opt.conv2d_nodes(gm)
    assert len(convs) == 1
    assert layout_opt._worth_it_on_gpu(gm, convs, is_inference=False) == expected


def test_eager_fallback_gives_the_reported_strides():
    """A forward whose generated code fails at its first call runs eagerly; its outputs
    must still have the strides the backward was compiled for."""
    from tritonfuse.compile_fx import _with_strides
    x = torch.randn(2, 3, 4, 5)
    out, untouched = _with_strides([x, x], [[60, 1, 15, 3], None])
    assert out.stride() == (60, 1, 15, 3) and torch.equal(out, x) and untouched is x


def test_as_strided_reads_eagers_storage_order(device, layout_on):
    """as_strided addresses its input's storage: a convolution output held channels_last
    is put back in eager's order first."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1).to(device)
    x = torch.randn(2, 3, 5, 6, device=device)

    def fn(t):
        y = conv(t)
        return torch.as_strided(y, (2, 8, 3), (1, 7, 16)) * 2, torch.as_strided(y.relu(), (4, 5), (3, 11), 2)
    with torch.no_grad():
        expected = fn(x)
        actual = torch.compile(fn, backend="tritonfuse")(x)
    _assert_close_with_strides(actual, expected, torch.float32)


def test_flatten_after_convolution_training(device, layout_on):
    """A VGG-like head: the channels_last maps are flattened in eager's (NCHW) order."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 4, 3, stride=2),
                          nn.Flatten(), nn.Linear(4 * 3 * 2, 5)).to(device)
    recorder = _check_training(model, torch.randn(3, 3, 8, 6, device=device), torch.float32)
    recorder.assert_channels_last()
