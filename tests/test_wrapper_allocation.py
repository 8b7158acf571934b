"""How generated host code allocates: CUDA graphs run under their device's guard and
allocate through the fast allocator (empty_strided_cuda, which takes the current device);
graphs on several devices, or CPU only, keep explicit devices. Only the generated text is
checked here (a CUDA run is tests/test_compile_pipeline.py's cuda column)."""
import types

import sympy
import torch

from tritonfuse.codegen import wrapper as wrapper_module
from tritonfuse.codegen.wrapper import WrapperCodeGen
from tritonfuse.ir import Buffer, InputBuffer, Layout


def _graph(*devices):
    """A graph of one input and one buffer per device in `devices` (the input on the first)."""
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    arg0 = InputBuffer("arg0", Layout.contiguous(torch.device(devices[0]), torch.float32, [s0, 4]))
    buffers = {f"buf{i}": Buffer(f"buf{i}", Layout.contiguous(torch.device(d), torch.float32, [s0, 4]))
               for i, d in enumerate(devices)}
    graph = types.SimpleNamespace(graph_id="g", input_order=["arg0"], symbol_sources={s0: "arg0.size()[0]"},
                                  graph_inputs={"arg0": arg0}, constants={}, name_to_buffer=buffers,
                                  outputs=list(buffers.values()))
    return graph, list(buffers.values())


def _generate(monkeypatch, *devices, allocator=object()):
    monkeypatch.setattr("tritonfuse.runtime.wrapper_helpers.empty_strided_cuda", allocator)
    graph, buffers = _graph(*devices)
    wrapper = WrapperCodeGen(graph)
    for buffer in buffers:
        wrapper.allocate(buffer)
    code = wrapper.generate()
    compile(code, "wrapper", "exec")
    return code


def test_a_cuda_graph_allocates_under_its_device_guard(monkeypatch):
    code = _generate(monkeypatch, "cuda:1", "cpu")
    assert "with torch.cuda._DeviceGuard(1):" in code and "return call_on_device(args)" in code
    assert "buf0 = empty_strided_cuda((s0, 4, ), (4, 1, ), torch.float32)" in code
    assert "buf1 = empty_strided_cpu(" in code


def test_graphs_on_two_devices_or_without_the_allocator_name_the_device(monkeypatch):
    for code in (_generate(monkeypatch, "cuda:0", "cuda:1"), _generate(monkeypatch, "cuda:0", allocator=None)):
        assert "_DeviceGuard" not in code and "empty_strided_cuda((" not in code
        assert "buf0 = empty_strided((s0, 4, ), (4, 1, ), device='cuda:0', dtype=torch.float32)" in code


def test_a_cpu_graph_is_unchanged(monkeypatch):
    code = _generate(monkeypatch, "cpu")
    assert "_DeviceGuard" not in code and "def call(args):" in code and "call_on_device" not in code
    assert wrapper_module._only_cuda_index(_graph("cpu")[0]) is None


def test_gemm_fallbacks_call_the_torch_function_of_the_same_overload():
    """torch.mm & co. bind the overload generated code names (default, or out with out=);
    other ops keep torch.ops."""
    from tritonfuse.codegen.wrapper import TORCH_FUNCTION_OPS, op_call_reference
    aten = torch.ops.aten
    a, b, c = torch.randn(2, 3), torch.randn(3, 4), torch.randn(2, 4)
    for name in TORCH_FUNCTION_OPS:
        assert op_call_reference(getattr(aten, name).default) == f"torch.{name}"
        assert op_call_reference(getattr(aten, name).out) == f"torch.{name}"
    assert op_call_reference(aten.convolution.default) == "torch.ops.aten.convolution.default"
    assert op_call_reference(aten.mm.dtype) == "torch.ops.aten.mm.dtype"
    out = torch.empty(2, 4)
    torch.addmm(c, a, b, beta=0.5, alpha=1, out=out)
    torch.testing.assert_close(out, aten.addmm.default(c, a, b, beta=0.5, alpha=1))
    x, y = torch.randn(2, 2, 3), torch.randn(2, 3, 4)
    torch.testing.assert_close(torch.baddbmm(torch.zeros(2, 2, 4), x, y, beta=1, alpha=2), aten.bmm.default(x, y) * 2)
