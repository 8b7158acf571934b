"""Channels-last feature maps for graphs with 2-D convolutions ("layout optimization").

cuDNN (and oneDNN on the CPU) run their fastest convolutions on NHWC data; handed NCHW
tensors, cuDNN converts every input to NHWC and every output back (``nchwToNhwcKernel``,
``nhwcToNchwKernel``), which costs a ResNet training step a third of its time. With
layout optimization on, a graph keeps its 4-D feature maps in channels_last wherever
tritonfuse chooses a layout:

    * the inputs of ``convolution`` / ``convolution_backward`` (activations, gradients and
      weights; a value held in another layout, a graph input, is copied once);
    * values realized for several readers, or by a lowering that needs a buffer, along the
      chains that feed or follow convolutions (``LayoutPlan.prefers_channels_last``);
    * the forward graph's outputs saved for the backward: their strides are reported to
      aot_autograd (``report_output_strides``), which traces the backward with them.

Forward graphs without convolutions report their saved activations' strides too: a saved
value that is a small view of a large buffer is copied out (graph.py), dense.

User-visible outputs (the forward's results, the backward's gradients) keep eager's
strides exactly. Pointwise kernels need nothing special: they index by strides and loop
in their output's memory order (dependencies.py), so a kernel reading and writing NHWC
buffers is coalesced.

The decision per graph follows Inductor's heuristics on GPUs (``_worth_it_on_gpu``); on
the CPU it was measured on the C++ backend (``CPU_DEFAULT``, see its comment).
``TRITONFUSE_LAYOUT_OPT=1`` / ``0`` (``tritonfuse.config.layout_opt``) forces it on / off
for every graph with a 2-D convolution.
"""
import logging
from dataclasses import dataclass, field

import sympy
import torch
import torch.fx

from . import config, sym

log = logging.getLogger("tritonfuse")
aten = torch.ops.aten

CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)
# nothing propagates a preference through a batched matmul (attention over feature maps)
STOPS_PROPAGATION = (aten.bmm.default,)

# The CPU decision under "auto": off. Measured on the C++ backend (scripts/model_zoo.py
# resnet, size "cpu", float32 training step, 2 shared cores, min of 15 steps, very noisy):
# channels_last 16.4 / 28.7 ms against NCHW 23.6 / 31.5 (eager 15.8 / 17.5) in two rounds:
# faster, but oneDNN miscomputes some channels_last convolution backwards on this torch
# (``onednn_miscomputes``), so channels_last stays opt-in (TRITONFUSE_LAYOUT_OPT=1).
CPU_DEFAULT = False


@dataclass(frozen=True)
class ConvArgs:
    """Which positional arguments of a convolution op are the feature maps and the weight."""
    feature_maps: tuple
    weight: int
    groups: int


CONV_ARGS = {
    aten.convolution.default: ConvArgs(feature_maps=(0,), weight=1, groups=8),
    aten.convolution_backward.default: ConvArgs(feature_maps=(0, 1), weight=2, groups=9),
}


@dataclass
class LayoutPlan:
    """Layout optimization of one graph. ``enabled``: convolutions get channels_last inputs;
    ``prefer``: the FX nodes whose 4-D values are realized in channels_last; ``free_outputs``:
    output positions whose strides tritonfuse chooses (they are reported to aot_autograd)."""
    enabled: bool = False
    prefer: frozenset = frozenset()
    free_outputs: frozenset = frozenset()
    reported_strides: list = field(default=None, repr=False)   # aot_autograd's list to fill

    def prefers_channels_last(self, node) -> bool:
        return self.enabled and node in self.prefer


def plan_layouts(gm: torch.fx.GraphModule, example_inputs, kind: str) -> LayoutPlan:
    """The layout plan of a graph of kind "forward", "backward" or "inference"."""
    convs = conv2d_nodes(gm)
    if not convs:
        if kind == "forward" and not _symbolic(example_inputs):
            # no channels_last, but the saved activations' strides are still tritonfuse's
            # to choose: a small view of a large buffer is copied out (graph.py)
            reported, free = _saved_output_slots(gm)
            return LayoutPlan(False, frozenset(), free, reported)
        return LayoutPlan()
    if not _enabled(gm, example_inputs, kind, convs):
        # only the convolution backwards that eager hands channels_last gradients: nothing
        # else in the graph (a ViT backward's attention tensors are 4-D too) changes layout
        given = _given_channels_last_gradients(convs) \
            if kind == "backward" and config.layout_opt == "auto" and not _symbolic(example_inputs) else ()
        return LayoutPlan(True, frozenset(given)) if given else LayoutPlan()
    reported, free = None, frozenset()
    if kind == "forward":
        reported, free = _saved_output_slots(gm)
    return LayoutPlan(True, frozenset(channels_last_nodes(gm)), free, reported)


def conv2d_nodes(gm) -> list:
    """The 2-D convolutions of a graph (forward or backward), with static sizes."""
    found = []
    for node in gm.graph.nodes:
        args = CONV_ARGS.get(node.target)
        if args is None:
            continue
        weight = _meta(node.args[args.weight])
        if weight is not None and weight.dim() == 4:
            found.append(node)
    return found


def _symbolic(example_inputs) -> bool:
    return any(_is_symbolic(value) for value in example_inputs)


def _enabled(gm, example_inputs, kind, convs) -> bool:
    if _symbolic(example_inputs):
        # reported strides must be numbers; Inductor also measured regressions (pytorch#102670)
        return False
    if config.layout_opt != "auto":
        return config.layout_opt == "1"
    if kind == "backward":
        # the forward's decision, made visible: its saved activations arrive channels_last
        return _receives_channels_last(gm, example_inputs)
    devices = {_meta(node.args[CONV_ARGS[node.target].weight]).device.type for node in convs}
    if devices == {"cuda"}:
        return _worth_it_on_gpu(gm, convs, is_inference=kind == "inference")
    if devices == {"cpu"}:
        return CPU_DEFAULT
    return False


def _receives_channels_last(gm, example_inputs) -> bool:
    """Whether a 4-D input comes in channels_last while the graph was traced with other
    strides (aot_autograd restrides a backward's saved activations to what the forward
    reported)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, example_inputs):
        meta = _meta(node)
        if isinstance(value, torch.Tensor) and meta is not None and value.dim() == 4 \
                and is_channels_last(value.shape, value.stride()) and not is_channels_last(meta.shape, meta.stride()):
            return True
    return False


# Devices whose convolution backward, handed a gradient laid out HWC per image beside NCHW
# operands, converts them all itself. A ViT's patch embedding gets such a gradient in eager too
# (a view of the tokens' gradient past the class token) with the NCHW image: aten copies the
# gradient to NCHW (the layout the image and weight suggest) and cuDNN's weight gradient then
# runs nchwToNhwcKernel on both. H100, bf16, 32x3x224x224 images, 16x16 patches of stride 16
# into 768 channels: 245 us in eager's layouts, 165 us with the image copied channels_last
# first (the copy included), 146 us with every operand already channels_last (stop 27 probe).
# cuDNN was measured; oneDNN was not.
CHANNELS_LAST_GRADIENT_DEVICES = ("cuda",)


def _given_channels_last_gradients(convs) -> list:
    """The convolution backwards (on a device of ``CHANNELS_LAST_GRADIENT_DEVICES``, not
    grouped) that eager's trace gives a gradient laid out HWC per image: their operands are
    then given channels_last too."""
    given = []
    for node in convs:
        if node.target is not aten.convolution_backward.default:
            continue
        grad, weight = _meta(node.args[0]), _meta(node.args[CONV_ARGS[node.target].weight])
        if weight.device.type in CHANNELS_LAST_GRADIENT_DEVICES and grad is not None and grad.dim() == 4 \
                and _channels_last_per_image(grad.shape, grad.stride()) and not _grouped(_conv_shape(node)):
            given.append(node)
    return given


def _channels_last_per_image(size, stride) -> bool:
    """Whether each image of a 4-D tensor is laid out HWC, the images any distance apart
    (a ViT's patch gradient is a slice of the tokens' gradient, past the class token)."""
    if len(size) != 4:
        return False
    per_image = channels_last_strides(size)
    return has_strides(size[1:], stride[1:], per_image[1:]) \
        and not has_strides(size[1:], stride[1:], sym.contiguous_strides(sym.sizes_of(size))[1:])


def conv_operands_needed(node) -> tuple:
    """The positional arguments of a convolution op that its computed outputs read: all of
    a forward's; a backward's gradient, its input only for the weight's gradient and its
    weight only for the input's gradient (Inductor's lowering makes the same cut)."""
    args = CONV_ARGS[node.target]
    if node.target is not aten.convolution_backward.default:
        return (*args.feature_maps, args.weight)
    mask = node.args[10]
    return (0,) + ((1,) if mask[1] else ()) + ((args.weight,) if mask[0] else ())


def _worth_it_on_gpu(gm, convs, is_inference) -> bool:
    """Inductor's heuristics (torch/_inductor/graph.py ``decide_layout_opt``), measured on
    cuDNN: channels_last pays unless the graph has few convolutions among many other ops,
    grouped convolutions with more than one input channel per group (up to 31x slower),
    convolutions that shrink the channels (UNet-like), or only small channel counts."""
    if len(gm.graph.nodes) >= 300 * len(convs):
        return False
    shapes = [_conv_shape(node) for node in convs]
    if is_inference:
        return _inference_flops_favour(shapes)
    if any(_grouped(shape) for shape in shapes):
        return False
    if any(_shrinks_channels(shape) for shape in shapes):
        return False
    return not all(_small_channels(shape) for shape in shapes)


@dataclass(frozen=True)
class _ConvShape:
    weight: tuple     # (out channels, in channels per group, kh, kw)
    groups: int
    output_numel: int


def _conv_shape(node) -> _ConvShape:
    args = CONV_ARGS[node.target]
    weight = tuple(int(s) for s in _meta(node.args[args.weight]).shape)
    groups = node.args[args.groups] if len(node.args) > args.groups else 1
    out = node.meta.get("val")
    if isinstance(out, (list, tuple)):   # convolution_backward: the forward's output is grad_output
        out = _meta(node.args[0])
    return _ConvShape(weight, int(groups), int(out.numel()) if isinstance(out, torch.Tensor) else 0)


def _grouped(shape) -> bool:
    return shape.groups > 1 and shape.weight[1] > 1


def _shrinks_channels(shape) -> bool:
    return shape.weight[0] * 2 <= shape.weight[1] and shape.weight[2] > 1


def _small_channels(shape) -> bool:
    return shape.weight[0] <= 64 and shape.weight[1] <= 64


def _inference_flops_favour(shapes) -> bool:
    """Inductor's inference rule: the convolutions' flops weighted by the channels_last
    speedup measured for their kind (grouped 1.358, small 0.783, shrinking 0.725, other
    0.823; below 1 is faster) must not exceed the unweighted total."""
    total = weighted = 0.0
    for shape in shapes:
        flops = 2.0 * shape.output_numel * shape.weight[1] * shape.weight[2] * shape.weight[3]
        if _grouped(shape):
            factor = 1.358
        elif _small_channels(shape):
            factor = 0.783
        elif _shrinks_channels(shape):
            factor = 0.725
        else:
            factor = 0.823
        total += flops
        weighted += flops * factor
    return weighted <= total


def onednn_miscomputes(node) -> bool:
    """Whether ``node`` is a CPU convolution backward that oneDNN gets wrong on channels_last
    inputs: with torch 2.13 (oneDNN 3.12, AVX2) the weight gradient of a 1x1 convolution
    of stride 2 over few input channels (3, 4; 10x10 maps) is wrong in most calls, eager
    included (``conv.to(memory_format=torch.channels_last)``). Such a convolution gets
    eager's (NCHW) layouts instead."""
    if node.target is not aten.convolution_backward.default:
        return False
    weight = _meta(node.args[CONV_ARGS[node.target].weight])
    strides = node.args[4]
    return weight.device.type == "cpu" and tuple(weight.shape[2:]) == (1, 1) and any(s != 1 for s in strides)


def channels_last_nodes(gm) -> set:
    """The FX nodes whose 4-D values are best kept channels_last (Inductor's rule): the
    convolutions, everything that feeds one (so that conv -> batch norm -> relu -> conv
    keeps one layout and needs no copy), and everything downstream of one up to the
    graph's last convolution (so that no kernel mixes layouts in the backward)."""
    nodes = list(gm.graph.nodes)
    convs = set(conv2d_nodes(gm))
    prefer, last_conv = set(), None
    for node in reversed(nodes):
        if node in convs:
            prefer.add(node)
            last_conv = last_conv or node
        elif node.target not in STOPS_PROPAGATION and any(user in prefer for user in node.users):
            prefer.add(node)
    for node in nodes:
        if node is last_conv:
            break
        if node in prefer:
            prefer.update(user for user in node.users if user.target not in STOPS_PROPAGATION)
    return prefer


def _saved_output_slots(gm):
    """(aot_autograd's list for the forward's output strides, the output positions saved
    for the backward) when this compile can report strides; else (None, empty): the saved
    activations must then keep eager's strides, which the backward was traced with."""
    from torch._guards import TracingContext
    context = TracingContext.try_get()
    reported = getattr(context, "output_strides", None)
    metadata = getattr(context, "fw_metadata", None)
    if reported is None or len(reported) != 0 or metadata is None:
        return None, frozenset()
    try:
        saved = metadata.tensors_saved_for_backwards_slice
    except Exception:   # noqa: BLE001 - metadata of another torch version: keep eager's strides
        return None, frozenset()
    outputs = len(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0])
    return reported, frozenset(range(outputs)[saved])


def report_output_strides(reported, strides) -> None:
    """Tell aot_autograd the strides of the forward's outputs (None where not a tensor or
    not static): it restrides the backward's inputs to them before compiling it."""
    if reported is not None and len(reported) == 0:
        reported.extend(None if s is None else tuple(s) for s in strides)


def is_channels_last(size, stride) -> bool:
    """Whether a 4-D tensor of ``size`` and ``stride`` is laid out NHWC and not also NCHW
    (as a tensor of one channel, or of 1x1 maps, is)."""
    return len(size) == 4 and has_strides(size, stride, channels_last_strides(size)) \
        and not has_strides(size, stride, sym.contiguous_strides(sym.sizes_of(size)))


def has_strides(size, stride, want) -> bool:
    """``stride`` equals ``want`` on every dim longer than 1 (the others are never stepped)."""
    return len(size) == len(want) and all(sym.sint(s) == 1 or sym.same_size(have, w)
                                          for s, have, w in zip(size, stride, want))


def walks_channels_last(index, variables, sizes) -> bool:
    """Whether the memory index ``index``, linear in the loop variables of a 4-D loop nest
    (N, C, H, W) of ``sizes``, steps least along C, then W, then H, then N (dims of size 1
    aside): a read in channels_last order, as an element-wise or a pooling window's read of
    a channels_last buffer is."""
    index = sympy.expand(index)
    steps, rest = [], index
    for variable, size in zip(variables, sizes):
        step = index.coeff(variable)
        if step.free_symbols & set(variables) or step.free_symbols - sym.size_symbols(step):
            return False
        rest = rest - step * variable
        steps.append(None if sym.sint(size) == 1 else sym.hint(step))
    if sympy.expand(rest).free_symbols & set(variables):
        return False   # not linear in the loop variables (a division, an indirect read)
    order = [steps[d] for d in (1, 3, 2, 0) if steps[d] is not None]
    return len(order) >= 2 and all(step > 0 for step in order) and order == sorted(order) \
        and len(set(order)) == len(order)


def channels_last_strides(size) -> list:
    """NHWC strides of a 4-D size (N, C, H, W): C fastest, then W, H, N."""
    n, c, h, w = sym.sizes_of(size)
    return [h * w * c, sympy.Integer(1), w * c, c]


def _meta(node):
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _is_symbolic(value) -> bool:
    from .compile_fx import _is_symbolic
    return _is_symbolic(value)
