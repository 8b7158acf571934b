"""The OpenMP C++ backend: outer-loop fusion with local buffers, vector tails, outer-dim
reductions, the build cache. Runs only where cpu_backend is registered (a C++ compiler)."""
import pytest
import torch

import tritonfuse
from common import allocation_count, assert_same, check, kernel_count, rand
from conftest import DEVICE_MATRIX

pytestmark = pytest.mark.skipif(not any(e[0] == "cpu" for e in DEVICE_MATRIX),
                                reason="no C++ compiler with OpenMP on this machine")


@pytest.fixture(autouse=True)
def cpp_backend(monkeypatch):
    monkeypatch.setattr(tritonfuse.config, "cpu_backend", "cpp")


def test_softmax_local_buffer_matches_reference_pr():
    # the check of the reference PR (Inductor #126967), same shape
    x = torch.randn(4, 12, 1023, 1022)
    sources = check(lambda a: a - torch.softmax(a, -1), x)
    assert len(tritonfuse.metrics.outer_loop_fusions) == 1
    fusion = tritonfuse.metrics.outer_loop_fusions[0]
    assert fusion.inner_kernel_count == 3
    assert fusion.local_buffer_count == 1
    wrapper = sources[0]
    assert allocation_count(wrapper) == 1, wrapper   # the output only: no global exp buffer
    assert "LocalBuffer" in sources[1]


def test_outer_loop_fusion_of_layer_norm():
    x, w, b = rand(64, 300), rand(300), rand(300)
    check(lambda a, w, b: torch.nn.functional.layer_norm(a, (300,), w, b), x, w, b, atol=1e-4, rtol=1e-4)
    assert kernel_count() == 1
    assert tritonfuse.metrics.outer_loop_fusions


@pytest.mark.parametrize("cols", [1, 7, 15, 16, 17, 33, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_vector_tails(cols, dtype):
    x = rand(5, cols, dtype=dtype)
    check(lambda a: (torch.exp(a) * 2 + 1, a.sum(-1), a.amax(-1), torch.tanh(a).mean(-1), torch.erf(a)), x,
          atol=3e-2 if dtype != torch.float32 else 1e-5, rtol=2e-2 if dtype != torch.float32 else 1e-5)


@pytest.mark.parametrize("shape", [(1000, 37), (64, 3), (5000, 16)])
def test_outer_dim_reductions(shape):
    x = rand(*shape)
    check(lambda a: (a.sum(0), a.amax(0), a.argmax(0), a.mean(0)), x, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape, dim, form", [
    ((40, 3000), 0, "row blocks"),         # one row dim too wide for a row per thread: blocks of
                                           # columns, the last with a tail
    ((300, 1000), 0, "row blocks"),        # one row dim, wide: strips of 128 columns, accumulators
                                           # in registers, the last strip short
    ((4000, 32), 0, "partial rows"),       # strips too narrow to hide the add latency: each
                                           # thread a share of the rows
    ((8, 128, 256), 1, "row blocks"),      # whole rows, one per (collapsed) outer index
    ((3, 400, 40), 1, "row blocks"),       # 3 outer rows for 2 threads: split into blocks
    ((6000, 8), 0, "partial rows"),        # too few columns for the threads: split the reduction
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outer_reduction_forms(shape, dim, form, dtype, monkeypatch):
    monkeypatch.setattr("cpu_backend.scheduling.default_num_threads", lambda: 2)   # the forms depend on it
    x = rand(*shape, dtype=dtype)
    tol = dict(atol=1e-3, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.5, rtol=2e-2)
    sources = check(lambda a: (torch.sigmoid(a.sum(dim)), a.amax(dim), a.amin(dim) * 2, (a > 2.5).any(dim)),
                    x, **tol)
    assert kernel_count() == 1
    kernel = sources[1]
    assert ("_partial" in kernel) == (form == "partial rows"), kernel
    # partial rows fold each thread's float sum in chunks (cascade_rows.py)
    assert ("sum_fold_vec" in kernel or "sum_rows_fold" in kernel) == (form == "partial rows"), kernel


@pytest.mark.parametrize("shape, dims, form", [
    ((8, 64, 56, 56), (0, 2, 3), "registers"),   # channels-last batch-norm statistics: 64 outputs
    ((20000, 8), (0,), "partial rows"),          # rows of 8: not whole vectors, kept in memory
    ((17000, 40), (0,), "partial rows"),
    ((17000, 300), (0,), "partial rows"),        # rows wider than the registers
    ((2, 17000, 48), (1,), "row blocks"),        # a strip of whole vectors per outer row
    ((3, 17000, 40), (1,), "row blocks"),        # blocks with a tail
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_welford_in_accumulator_rows(shape, dims, form, dtype, monkeypatch):
    # var_mean over outer dims, longer than two_pass_variance_max_row: one Welford pass in
    # the outer-reduction forms (it did not compile: the graph ran eagerly). The cascade
    # (cascade_rows.CASCADE_CHUNK) keeps the mean of values around 5 within 1e-5.
    monkeypatch.setattr("cpu_backend.scheduling.default_num_threads", lambda: 2)   # the forms depend on it
    x = (rand(*shape) + 5).to(dtype)
    if len(shape) == 4:
        x = x.to(memory_format=torch.channels_last)
    tol = dict(atol=1e-5, rtol=1e-6) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    sources = check(lambda a: torch.var_mean(a, dim=dims, correction=1), x, **tol)
    kernel = sources[1]
    assert "welford_row_update" in kernel, kernel
    assert ("_partial" in kernel) == (form != "row blocks"), kernel
    assert ("acc0_row[kRows]" in kernel) == (form == "registers"), kernel


def test_channels_last_batch_norm_training_statistics():
    # forward and backward of a batch norm in training on a channels-last input
    x = (rand(8, 64, 30, 30) + 2).to(memory_format=torch.channels_last).requires_grad_()
    w, b, weights = rand(64).requires_grad_(), rand(64).requires_grad_(), rand(8, 64, 30, 30)

    def step(x, w, b, running_mean, running_var):
        out = torch.nn.functional.batch_norm(x, running_mean, running_var, w, b, training=True)
        return out, running_mean, running_var, torch.autograd.grad((out * weights).sum(), (x, w, b))

    expected = step(x, w, b, torch.zeros(64), torch.ones(64))
    actual = torch.compile(step, backend="tritonfuse")(x, w, b, torch.zeros(64), torch.ones(64))
    assert tritonfuse.metrics.eager_graphs == 0
    # the weight's gradient sums 7200 terms to a few hundred: 1e-2 is 3e-5 of its scale
    assert_same(actual, expected, atol=1e-2, rtol=1e-4)
    assert actual[0].stride() == expected[0].stride()


@pytest.mark.parametrize("make", [
    lambda dtype: rand(513, 1531, dtype=dtype),                # odd sizes, a tail
    lambda dtype: rand(2048, 512, dtype=dtype),
    lambda dtype: rand(700, 40, dtype=dtype)[:, 3:37],         # sliced: rows a stride apart
    lambda dtype: rand(1531, 513, dtype=dtype).t(),            # transposed
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_column_reductions_in_register_strips(make, dtype, monkeypatch):
    # x.sum(0) of wide rows with fewer output rows than threads: the threads take strips of
    # columns, each a loop of constant trip count over whole vectors (unrolled: accumulators
    # in registers), instead of shares of the rows (partial rows)
    monkeypatch.setattr("cpu_backend.scheduling.default_num_threads", lambda: 2)
    x = make(dtype)
    tol = dict(atol=1e-3, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.5, rtol=2e-2)
    sources = check(lambda a: (a.sum(0), a.amax(0) * 2), x, **tol)
    if x.is_contiguous():
        assert "_partial" not in sources[1] and "#pragma GCC unroll" in sources[1], sources[1]


@pytest.mark.parametrize("make", [
    lambda dtype: rand(1531, 513, dtype=dtype).t(),            # odd sizes: a pair, then one vector and a tail
    lambda dtype: rand(64, 40, dtype=dtype).t(),               # 40 rows: whole steps, then one vector
    lambda dtype: rand(100, 37, dtype=dtype).t(),
    lambda dtype: rand(100, 50, dtype=dtype)[:, 3:44].t(),     # sliced: rows a stride apart
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lanes_are_rows_two_vectors_a_step(make, dtype):
    # x - softmax(x) over a strided dim: two vectors of rows a step through every loop
    # (lane_pairs.py), the last rows a vector at a time
    x = make(dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    sources = check(lambda a: a - torch.softmax(a, -1), x, **tol)
    assert "x1_b" in sources[1] or "x0_b" in sources[1], sources[1]
    assert "the last rows, a vector at a time" in sources[1]


@pytest.mark.parametrize("rows, cols", [(100, 37), (513, 131)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_of_transposed_logits_two_vectors_a_step(rows, cols, dtype):
    # the log-softmax kernel of cross_entropy over a strided class dim takes the jam too
    logits = rand(cols, rows, dtype=dtype).t()
    target = torch.randint(0, cols, (rows,))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    sources = check(lambda a, t: torch.nn.functional.cross_entropy(a, t), logits, target, **tol)
    assert "x0_b" in "".join(sources[1:]), sources


def test_lane_pairs_jam_refuses_what_it_cannot_read():
    from cpu_backend.lane_pairs import jam_vectors
    body = "tf::Vec<float> acc0(0.0f);\nfor (int64_t r0 = 0; r0 < 9; ++r0) {\nacc0 = acc0 + tf::vload<TAIL>(p + 9*r0 + x0, count);\n}\n"
    jammed = jam_vectors(body, "x0", 2)
    assert jammed[1].strip() == "tf::Vec<float> acc0_b(0.0f);" and "x0_b" in jammed[4], jammed
    assert jam_vectors(body.replace("acc0(", "total("), "x0", 2) is None          # a name not renamed
    assert jam_vectors(body + "if (x0 > 1) {\n}\n", "x0", 2) is None            # an if block
    assert jam_vectors(body.replace("r0 < 9", "r0 < x0"), "x0", 2) is None        # bounds by lane


def test_full_reduction_of_a_large_tensor():
    x = rand(300, 700)
    check(lambda a: (a.sum(), a.amax(), a.argmin()), x, atol=1e-2, rtol=1e-4)


@pytest.mark.parametrize("shape", [(64, 48), (64, 96), (70, 53), (3, 40, 33)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_tiled_transposed_read(shape, dtype):
    # full tiles (compile-time extents: 16x16, 32x16 for 16-bit types), edge tiles, and a
    # batch dim outside the tiles
    x = rand(*shape, dtype=dtype) if dtype.is_floating_point else torch.randint(-9, 9, shape)
    y = rand(*shape[:-2], shape[-1], shape[-2], dtype=dtype) if dtype.is_floating_point else \
        torch.randint(-9, 9, (*shape[:-2], shape[-1], shape[-2]))
    sources = check(lambda a, b: a.transpose(-1, -2) * 2 + b, x, y, atol=1e-2, rtol=1e-2)
    copy = {torch.bfloat16: "transpose_bf16_to_tile<16>", torch.float16: "transpose_half_to_tile<16>"}
    assert copy.get(dtype, "transpose_to_tile<16>") in sources[1]
    rows = 32 if dtype in copy else 16   # one tile row of a 16-bit read fills a cache line
    assert f"_tile += {rows})" in sources[1]


@pytest.mark.parametrize("rows, cols", [(500, 2048), (70, 4096)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiles_are_32_square_where_rows_share_one_l1_set(rows, cols, dtype, monkeypatch):
    # rows of a row-major buffer 4 KB apart fall in one L1 set (64 sets of 64 bytes): a
    # 32x16 tile leaves half of each of their lines for the next tile, after the set
    # evicted them (x.t() + y at 2048x512 bf16: 216 us, Inductor 90-105); a 32x32 tile uses
    # whole lines (98 us). Edge tiles: 500 and 70 rows
    monkeypatch.setattr("cpu_backend.cache_sets.l1_sets", lambda: 64)
    x = rand(rows, cols, dtype=dtype)                        # rows 4 and 8 KB apart
    y = rand(cols, rows, dtype=dtype)
    sources = check(lambda a, b: a.t() + b, x, y, atol=1e-2, rtol=1e-2)
    copy = "transpose_bf16_to_tile<32>" if dtype == torch.bfloat16 else "transpose_half_to_tile<32>"
    assert copy in sources[1] and "_tile += 32)" in sources[1], sources[1]
    z = rand(2 * rows, 1000, dtype=dtype)                     # rows 2000 bytes apart: 32x16
    sources = check(lambda a, b: a.t() + b, z, rand(1000, 2 * rows, dtype=dtype), atol=1e-2, rtol=1e-2)
    assert copy.replace("<32>", "<16>") in sources[1], sources[1]


def test_a_short_strided_reduction_vectorizes_along_rows():
    # GQA's backward sums the heads that share a KV head: 2 elements 16 apart per output.
    # Vectors along r would hold 2 gathered lanes (and the epilogue's sin ran in scalars:
    # 106 us a call on the dynamic llama step, now 18); along x they are whole loads
    # (symbolic lengths keep the dims apart; the frequencies are read as w[x % 8]: a gather
    # along x too)
    from tritonfuse.testing import run_and_get_code

    def fn(a, f):
        positions = torch.arange(a.shape[3], dtype=torch.float32)[:, None]
        return a.sum(2) * (positions * torch.cat([f, f])).sin()

    compiled = torch.compile(fn, backend="tritonfuse")
    w = rand(8)
    generated = []
    for length in (64, 37):        # one compile with a symbolic length, then another length
        x = rand(4, 2, 2, length, 16)
        torch._dynamo.mark_dynamic(x, 3)
        actual, sources = run_and_get_code(compiled, x, w)
        assert_same(actual, fn(x, w), atol=1e-5, rtol=1e-5)
        generated += sources[1:]
    assert "r0_lanes" not in generated[0] and "tf::vload<TAIL>(in_ptr0" in generated[0], generated


def test_a_costly_value_read_through_views_is_computed_once():
    # the rotary table: cos(positions x frequencies), unsqueezed and read for q and for k in
    # every layer; the C++ backend keeps it in a buffer instead of recomputing the cosine
    # for every batch row and head of each reader
    positions, freqs = rand(64), rand(8)
    q, k = rand(4, 3, 64, 8), rand(4, 2, 64, 8)

    def fn(p, f, q, k):
        table = torch.outer(p, f).cos().unsqueeze(0).unsqueeze(0)
        return q * table, k * table, (q * table).sum()

    sources = check(fn, positions, freqs, q, k, atol=1e-4, rtol=1e-4)
    kernels = [kernel for source in sources[1:] for kernel in source.split('extern "C"')[1:]]
    assert sum("tf::cos(" in kernel for kernel in kernels) == 1, sources


def test_transposed_and_gathered_access():
    x = rand(40, 50).t()
    idx = torch.randint(0, 50, (30,))
    check(lambda a, i: (a + 1, a.sum(1), a[i] * 2, a.t().contiguous()), x, idx)


def test_build_cache_second_process_compiles_nothing(tmp_path):
    import os
    import subprocess
    import sys
    code = ("import torch, tritonfuse\n"
            "tritonfuse.config.graph_cache = False\n"
            "f = torch.compile(lambda a: torch.softmax(a, -1) * 2, backend='tritonfuse')\n"
            "x = torch.randn(8, 100)\n"
            "torch.testing.assert_close(f(x), torch.softmax(x, -1) * 2)\n"
            "print('builds', tritonfuse.metrics.cpp_builds, 'hits', tritonfuse.metrics.cpp_build_cache_hits)\n")
    env = dict(os.environ, TRITONFUSE_CACHE_DIR=str(tmp_path), TRITONFUSE_CPU_BACKEND="cpp")
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert "builds 1 hits 0" in runs[0].stdout, runs[0].stdout
    assert "builds 0 hits 1" in runs[1].stdout, runs[1].stdout


def test_welford_for_rows_longer_than_the_cache():
    # rows past two_pass_variance_max_row take one Welford pass (with a partial last vector)
    x = rand(3, 20007) * 3 + 50
    sources = check(lambda a: (torch.var_mean(a, -1), torch.std(a, -1, correction=0)), x, atol=1e-3, rtol=1e-4)
    assert "welford_add" in sources[1]
    assert kernel_count() == 1


def test_full_reduction_split_among_threads():
    # one output element: every thread reduces a share, partials combine in thread order
    x = rand(4, 50, 3001)
    x[1, 2, 3] = float("nan")
    y = rand(100000)
    sources = check(lambda a, b: (a.amax(), b.sum(), (b > 2.9).any(), torch.sigmoid(b.mean())), x, y,
                    atol=1e-2, rtol=1e-4)
    if torch.get_num_threads() > 1:
        assert "_partial[tid]" in "\n".join(sources)


@pytest.mark.parametrize("unroll", [1, 2, 3, 4])
def test_unrolled_reduction_loops(unroll, monkeypatch):
    # every unroll factor compiles (one accumulator per slot) and keeps the result
    import cpu_backend.common
    monkeypatch.setattr(cpu_backend.common, "UNROLL", unroll)
    monkeypatch.setattr(tritonfuse.config, "graph_cache", False)
    x, y = rand(9, 300), rand(100003)   # y: one output, its elements split among threads
    check(lambda a, b: (a.sum(-1), a.amax(-1), torch.var_mean(a, -1), torch.softmax(a, -1), b.sum(), b.amax()),
          x, y, atol=1e-2, rtol=1e-5)
    assert tritonfuse.metrics.eager_graphs == 0


def test_fewer_openmp_threads_than_requested(tmp_path):
    """OMP_THREAD_LIMIT (or OMP_DYNAMIC) may give a parallel region fewer threads than the
    kernel asks for: per-thread partial results must be combined over the threads that ran."""
    import os
    import subprocess
    import sys
    code = (
        "import torch, tritonfuse\n"
        "torch.set_num_threads(4)\n"
        "tritonfuse.config.cpu_backend = 'cpp'\n"
        "cases = [(lambda a: (a.sum(0), a.amax(0)), torch.randn(100000, 16)),\n"   # partial rows
        "         (lambda a: torch.var_mean(a, 0), torch.randn(100000, 16)),\n"     # and their Welford
        "         (lambda a: (a.sum(), a.amin()), torch.randn(1000003))]\n"         # a split full reduction
        "for fn, x in cases:\n"
        "    for got, want in zip(torch.compile(fn, backend='tritonfuse')(x), fn(x)):\n"
        "        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-4)\n"
        "print('ok')\n")
    env = dict(os.environ, OMP_THREAD_LIMIT="1", TRITONFUSE_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("shape", [(48, 32), (37, 21), (20, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_row_softmax_of_a_transposed_input(shape, dtype):
    # the lanes are rows (the input is contiguous along them): exp lives in a thread-local
    # buffer holding a row per lane, and the output (contiguous along the reduced dim) is
    # staged in tiles and written transposed; full and partial tiles and vectors
    x = rand(*shape[:-2], shape[-1], shape[-2], dtype=dtype).transpose(-1, -2)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    sources = check(lambda a: (torch.softmax(a, -1), torch.nn.functional.layer_norm(a, a.shape[-1:])), x,
                    atol=tol, rtol=tol)
    kernels = "\n".join(sources[1:])
    assert "a row per vector lane" in kernels
    writer = {torch.bfloat16: "store_tile_transposed_bf16(", torch.float16: "store_tile_transposed_half("}
    assert writer.get(dtype, "store_tile_transposed(") in kernels
    assert "vscatter" not in kernels


@pytest.mark.parametrize("make", [
    lambda dt: rand(48, 64, dtype=dt).t(),
    lambda dt: rand(21, 37, dtype=dt).t(),                  # a partial vector of rows
    lambda dt: rand(1000, 300, dtype=dt).t(),
    lambda dt: rand(3, 33, 40, dtype=dt).transpose(1, 2),   # an outer row dim
    lambda dt: rand(300, 64, dtype=dt),                     # contiguous rows: two passes
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_of_strided_rows_takes_one_welford_pass(make, dtype):
    # var_mean over trailing dims read with a stride (welford_for_strided_rows): one Welford
    # pass with one step count for all lanes, where two passes would stream the rows twice
    x = make(dtype) * 2 + 3
    w, b = rand(x.shape[-1], dtype=dtype), rand(x.shape[-1], dtype=dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=2e-2)
    sources = check(lambda a, w, b: (torch.nn.functional.layer_norm(a, a.shape[-1:], w, b),
                                     torch.var_mean(a.float(), -1)), x, w, b, **tol)
    kernels = "\n".join(sources[1:])
    assert ("welford_lanes_update" in kernels) == (x.stride(-1) != 1), kernels


def _rms_and_range(a, w):
    # two loops over the reduced dim (sum of squares, then the normalized row), a statistic
    # stored as an output, max/min reductions and a row-wise value reused by the last loop
    h = a.float()
    ms = h.pow(2).mean(-1, keepdim=True)
    spread = a.amax(-1, keepdim=True) - a.amin(-1, keepdim=True)
    mu = h.mean(-1, keepdim=True)   # a layer norm in two passes (var_mean of strided rows takes Welford)
    centered = h - mu
    norm = centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + 1e-5) * w
    return (h * torch.rsqrt(ms + 1e-6)).to(a.dtype) * w, ms, a * spread + torch.sigmoid(spread), \
        norm.to(a.dtype).contiguous()   # row-major output: block tiles written transposed


@pytest.mark.parametrize("make", [
    lambda dt: rand(48, 64, dtype=dt).t(),                  # whole vectors, one block
    lambda dt: rand(21, 37, dtype=dt).t(),                  # 37 rows: a partial vector
    lambda dt: rand(1000, 300, dtype=dt).t(),               # blocks of rows (the input exceeds one block)
    lambda dt: rand(50, 70, dtype=dt).t()[3:40, 5:45],      # a sliced transposed view
    lambda dt: rand(3, 33, 40, dtype=dt).transpose(1, 2),   # an outer row dim
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_row_blocks_of_loops_over_a_strided_reduced_dim(make, dtype, threads, monkeypatch, tmp_path):
    # the lanes are rows and the kernel has several loops: each loop walks the reduced dim
    # once per block of rows, row-wise values kept in block arrays (row_blocks.py)
    monkeypatch.setattr("cpu_backend.scheduling.default_num_threads", lambda: threads)
    monkeypatch.setattr(tritonfuse.config, "cache_dir", str(tmp_path))   # its key has torch's threads
    x = make(dtype)
    w = rand(x.shape[-1], dtype=dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=2e-2)
    sources = check(_rms_and_range, x, w, **tol)
    kernels = "\n".join(sources[1:])
    assert "_blk[" in kernels and "_row[" in kernels and "store_tile_transposed" in kernels, kernels
    for kernel in kernels.split('extern "C"'):
        if "xb_end" in kernel:   # a row-block kernel
            assert "vscatter" not in kernel and "vgather" not in kernel, kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
@pytest.mark.parametrize("cols", [2, 33, 64, 97])
def test_every_other_element_reads(cols, dtype):
    # lanes two elements apart load as two masked loads and a deinterleave (vload_stride2):
    # odd lengths end in a tail, the slice from 1 ends one element before the buffer
    x = rand(3, cols, dtype=dtype) if dtype.is_floating_point else torch.randint(-99, 99, (3, cols), dtype=dtype)
    sources = check(lambda a: (a[:, ::2] * 3 + 1, a[:, 1::2] - 2), x)
    assert "vload_stride2" in "\n".join(sources[1:])


def test_stride_two_pooling_window_reads_with_padding():
    # max pooling of stride 2 with padding: window reads masked where they leave the input,
    # every other element of a row; forward and backward against eager
    from tritonfuse.testing import run_and_get_code

    def fn(a):
        return torch.nn.functional.max_pool2d(torch.relu(a), 3, 2, 1)

    x = rand(2, 5, 13, 17)
    grad = rand(2, 5, 7, 9)
    eager_x = x.clone().requires_grad_()
    expected = fn(eager_x)
    expected.backward(grad)
    compiled_x = x.clone().requires_grad_()

    def step():
        out = torch.compile(fn, backend="tritonfuse", dynamic=False)(compiled_x)
        out.backward(grad)
        return out

    actual, sources = run_and_get_code(step)
    assert tritonfuse.metrics.eager_graphs == 0
    assert_same(actual, expected, None, None)
    assert_same(compiled_x.grad, eager_x.grad, None, None)
    assert "vload_stride2" in "\n".join(sources)
