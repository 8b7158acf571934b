"""Views that move no data, and ops that build or gather tensors."""
import torch
import torch.nn.functional as F

import tritonfuse

from common import allocation_count, check, kernel_count, rand, storage_sharing


def test_views_of_inputs(device):
    x = rand(4, 6, 5, device=device)
    check(lambda a: (a.permute(2, 0, 1) * 2, a.transpose(0, 1).reshape(6, 20) + 1, a.view(24, 5).t() - 1,
                     a[:, 1:5:2].unsqueeze(0) * 3, a.select(1, 3).squeeze() + 0, a.expand(2, 4, 6, 5) + 1,
                     a[..., 0].flatten() * 2), x)


def test_views_of_computed_values(device):
    x = rand(4, 6, 5, device=device)
    check(lambda a: ((a + 1).permute(1, 2, 0).reshape(30, 4) * 2, (a * 2).transpose(1, 2)[:, ::2].sum(-1),
                     (a.exp()).view(4, 30)[:, 3:17].amax(-1)), x, rtol=1e-4)


def test_reshape_of_non_contiguous(device):
    x = rand(6, 8, device=device).t()
    check(lambda a: (a.reshape(4, 12) + 1, a.reshape(-1).cumsum(0) if False else a.reshape(2, 4, 6) * 2), x)


def test_as_strided(device):
    x = rand(10, 10, device=device)
    check(lambda a: torch.as_strided(a + 1, (4, 3), (7, 2), 3) * 2, x)


def test_cat_and_pad(device):
    x, y = rand(4, 3, device=device), rand(4, 5, device=device)
    check(lambda a, b: (torch.cat([a, b], 1) * 2, torch.cat([a.t(), b.t() + 1], 0),
                        F.pad(a, (1, 2, 0, 1), value=-1.5), F.pad(b + 1, (-1, 1)), torch.stack([a, a * 2])), x, y)


def test_index_gather_embedding(device):
    table = rand(11, 6, device=device)
    idx = torch.tensor([[0, 3, 10], [-1, 5, 5]], device=device)
    check(lambda t, i: (t[i] * 2, t[:, torch.tensor([1, 0, 5], device=t.device)] + 1,
                        torch.gather(t, 1, (i.abs() % 6).repeat(1, 2)[:, :4].expand(2, 4)),
                        F.embedding(i.abs(), t) + 1, t.index_select(0, i.abs().flatten())), table, idx)


def test_clone_and_copy(device):
    x = rand(5, 3, device=device)
    check(lambda a: (a.clone(), a.t().contiguous(), a.to(torch.float64) * 2, torch.empty_like(a).copy_(a.t().t())),
          x)


def test_outputs_that_are_views_of_one_value_share_its_memory(device):
    """Eager returns views of one tensor: writing to one output shows through the others."""
    def base_then_view(x):
        y = torch.exp(x)
        return y, y.t()

    def view_then_base(x):
        y = torch.exp(x)
        return y.t(), y

    def two_views(x):
        y = torch.exp(x) + 1
        return y.t(), y.view(-1), y[1:]

    def views_of_a_transposed_value(x):   # the value's eager layout is not contiguous
        y = x.permute(1, 0) * 2
        return y[:, 0:2], y[:, 1:3]

    for fn in (base_then_view, view_then_base, two_views, views_of_a_transposed_value):
        x = rand(6, 5, device=device)
        check(fn, x)
        with torch.no_grad():
            outputs = torch.compile(fn, backend="tritonfuse", dynamic=False)(x)
        assert storage_sharing(outputs) == storage_sharing(fn(x)), fn.__name__


def test_output_keeps_eager_strides(device):
    x = rand(6, 8, device=device)
    check(lambda a: ((a + 1).t(), torch.permute(a * 2, (1, 0)).contiguous(), a.t() * 3), x)


def test_fallback_ops_run_inside_compiled_graph(device):
    import tritonfuse
    x, w = rand(6, 8, device=device), rand(8, 4, device=device)
    check(lambda a, b: (torch.relu(a @ b) + 1, torch.sort(a, dim=1).values * 2, torch.cumsum(a, 0)), x, w,
          atol=1e-4, rtol=1e-4)
    assert any("mm" in op for op in tritonfuse.metrics.fallbacks)
    assert any("sort" in op for op in tritonfuse.metrics.fallbacks)
    assert all(reason for reason in tritonfuse.metrics.fallbacks.values())


def test_buffers_used_only_inside_a_kernel_are_not_allocated(device):
    x = rand(16, 64, device=device)
    sources = check(lambda a: torch.softmax(a * 2, -1) + 1, x)
    wrapper = sources[0]
    assert allocation_count(wrapper) == 1, wrapper
    assert kernel_count() == 1


def test_horizontal_fusion_of_shared_reads(device):
    x = rand(8, 32, device=device)
    check(lambda a: (a.sum(-1), a.amax(-1), (a * a).sum(-1)), x, rtol=1e-4)
    assert kernel_count() == 1


def test_empty_tensors(device):
    x = rand(0, 4, device=device)
    check(lambda a: (a + 1, a.sum(1)), x)


def test_diagonal_views(device):
    x = rand(4, 5, 6, device=device)
    check(lambda a: (torch.diagonal(a) + 1, torch.diagonal(a, 1, 1, 2) * 2, torch.diagonal(a + 1, -2, 0, 2) * 3,
                     torch.diagonal(a.t() if a.dim() == 2 else a.transpose(0, 2), 0, -1, 0).sum(-1)), x)


def test_view_copies_never_alias_their_input(device):
    """``*_copy`` ops give a tensor of their own: view_copy was once lowered as a view, so
    the compiled output shared the input's memory (a write to one showed in the other)."""
    x = rand(4, 6, device=device)
    aten = torch.ops.aten
    fn = lambda a: (aten.view_copy(a, [24]), aten.t_copy(a), aten.transpose_copy(a, 0, 1), aten.alias_copy(a),
                    aten.expand_copy(a, [2, 4, 6]), aten.diagonal_copy(a), aten.narrow_copy(a, 1, 2, 3),
                    *aten.unbind_copy(a, 0), *aten.split_with_sizes_copy(a, [2, 4], 1))
    check(fn, x)
    outputs = torch.compile(fn, backend="tritonfuse")(x)
    assert not any(storage_sharing([x, out])[0][1] for out in outputs)


def test_unsafe_split_is_a_view(device):
    x = rand(7, 4, device=device)
    check(lambda a: [part * 2 for part in torch.unsafe_split(a, 3)] + [a.unsafe_chunk(2, 1)[1] + 1], x)


def _relative_position_bias(table, x):
    """BEiT's relative position bias: an index built on the CPU (torch.arange without a
    device) gathers from a table on the model's device. On a GPU the graph's gather kernel
    was handed the CPU index and the graph ran eagerly."""
    coords = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(3), indexing="ij")).flatten(1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + 2
    index = relative[..., 0] * 5 + relative[..., 1]
    bias = table[index.view(-1)].view(9, 9, -1).permute(2, 0, 1)
    return torch.softmax(x + bias, -1), table[index[0]] * 2, table[:, 1][index.view(-1)[:4] + 1]


def test_an_index_made_on_the_cpu_gathers_on_the_graphs_device(device):
    check(_relative_position_bias, rand(25, 4, device=device), rand(2, 4, 9, 9, device=device), rtol=1e-4)


def _shifted_windows(x):
    """A Swin block's data movement on its tokens (batch, height * width, channels): layer
    norm, roll, window partition, the windows' own work, window reverse, roll back and the
    residual, each a reshape of a reshape."""
    x = x.flatten(2).transpose(1, 2)   # patch embeddings (batch, channels, h, w) -> tokens
    b, tokens, c = x.shape
    h = w = int(tokens ** 0.5)
    normed = torch.nn.functional.layer_norm(x, (c,)).view(b, h, w, c)
    shifted = torch.roll(normed, shifts=(-2, -2), dims=(1, 2))
    windows = shifted.view(b, h // 4, 4, w // 4, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 4, 4, c).view(-1, 16, c)
    windows = torch.softmax(windows, 1) * 2
    merged = windows.view(-1, 4, 4, c).view(b, h // 4, w // 4, 4, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
    return torch.roll(merged, shifts=(2, 2), dims=(1, 2)).reshape(b, tokens, c) + x


def test_reshapes_of_reshapes_keep_their_indices_small(device, monkeypatch):
    """Each reshape's index is folded with its own ranges: through Swin's roll, window
    partition and reverse the composed indices once grew to 50,000 characters before the
    scheduler folded them (the same kernels in the end, after minutes of sympy and of the
    C++ compiler for a two-stage Swin). Measured: the longest index the scheduler reads."""
    from tritonfuse import dependencies
    longest = []
    fold = dependencies.simplify_with_ranges

    def recording(expr, ranges):
        longest.append(len(str(expr)))
        return fold(expr, ranges)
    monkeypatch.setattr(dependencies, "simplify_with_ranges", recording)
    monkeypatch.setattr(tritonfuse.config, "graph_cache", False)
    check(_shifted_windows, rand(2, 8, 8, 8, device=device), rtol=1e-4)
    assert 0 < max(longest) < 1000, max(longest)
