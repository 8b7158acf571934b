"""What tests/test_opinfo.py (and scripts/opinfo_sweep.py's report) accept from an op of
torch's OpInfo table, besides "results match eager and the op generated kernels".

    ALLOWED_FALLBACKS   the op may run entirely as aten calls: Inductor does the same
                        (its sweep on the same samples generates no kernel for it);
                        COLUMN_ALLOWED_FALLBACKS the same for one device column only
    PENDING_LOWERINGS   ops Inductor generates kernels for that still run as aten calls here,
                        with the reason; not accepted as a pass, only named so a failure
                        says why
    EXPECTED_FAILURES   per device column ("all" = every column): the op cannot pass, for
                        a reason that holds for Inductor too

Names are OpInfo names (``op.name`` + ``.variant_test_name``).
"""

# ---- reasons --------------------------------------------------------------------------------

MATMUL = "Inductor also runs it as aten: a matrix multiply (BLAS / cuBLAS extern kernel)"
CONVOLUTION = "Inductor also runs it as aten: a convolution (oneDNN / cuDNN extern kernel)"
SORT = "Inductor also runs it as aten: sorting or selection (sort, topk, kthvalue, median, mode)"
FFT = "Inductor also runs it as aten: an FFT (pocketfft / cuFFT)"
LINALG = "Inductor also runs it as aten: a LAPACK / cuSOLVER factorization or solve"
SPECIAL = "Inductor also runs it as aten: a special function without a decomposition"
DATA_DEPENDENT = "Inductor also runs it as aten: an output whose size or content depends on the values"
EXTERN = "Inductor also runs it as aten: it has no decomposition or lowering of it either"
RANDOM = "Inductor also runs it as aten: random numbers drawn by the aten op"
VIEW_COPY = "Inductor also runs it as aten: a view that aot_autograd keeps as a copy op"
COMPLEX = "Inductor also runs it as aten: complex numbers"
ATTENTION = "Inductor also runs it as aten: a fused attention kernel (flash / memory-efficient, extern)"
SCATTER_REDUCE_GPU = ("Inductor also runs it as aten: scatter_reduce with prod, amin or amax has no atomic form in "
                      "Triton (Inductor's use_scatter_fallback on a GPU; the triton-interpret column runs the same "
                      "Triton backend); the cpu column lowers it as a serial loop")
NEXTAFTER_BF16_GPU = ("Inductor also runs it as aten: nextafter in bfloat16 steps by a bfloat16 ulp, which libdevice's "
                      "float32 nextafter cannot give")
LARGE_WINDOW = ("Inductor also runs it as aten: max pooling over a window of more than 25 elements (the sample's "
                "3x3x3) falls back in both (Inductor's should_fallback_max_pool_with_indices)")

# ---- allowed fallbacks: ops Inductor leaves to aten as well -----------------------------------

ALLOWED_FALLBACKS = {
    # matrix multiplies
    **dict.fromkeys([
        "addmm", "addmm.decomposed", "addbmm", "addr", "bmm", "bmm.triton_optimized", "mm", "mv", "vdot",
        "nn.functional.linear", "linalg.multi_dot", "linalg.vecdot", "inner", "matmul", "__rmatmul__", "einsum",
        "tensordot", "kron", "nn.functional.bilinear", "chain_matmul", "linalg.matrix_power",
    ], MATMUL),
    # convolutions
    **dict.fromkeys([
        "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.conv_transpose1d",
        "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d",
    ], CONVOLUTION),
    # sorting and selection
    **dict.fromkeys([
        "sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode",
    ], SORT),
    # FFTs
    **dict.fromkeys([
        "fft.fft", "fft.fft2", "fft.fftn", "fft.hfft", "fft.hfft2", "fft.hfftn", "fft.rfft", "fft.rfft2",
        "fft.rfftn", "fft.ifft", "fft.ifft2", "fft.ifftn", "fft.ihfft", "fft.ihfft2", "fft.ihfftn", "fft.irfft",
        "fft.irfft2", "fft.irfftn", "stft", "istft",
    ], FFT),
    # linear algebra
    **dict.fromkeys([
        "cholesky", "cholesky_inverse", "cholesky_solve", "geqrf", "lu", "lu_solve", "lu_unpack", "ormqr", "qr",
        "svd", "triangular_solve", "matrix_exp", "logdet", "linalg.cholesky", "linalg.cholesky_ex", "linalg.det",
        "linalg.eig", "linalg.eigvals", "linalg.eigh", "linalg.eigvalsh", "linalg.householder_product",
        "linalg.inv", "linalg.inv_ex", "linalg.ldl_factor", "linalg.ldl_factor_ex", "linalg.ldl_solve",
        "linalg.lstsq", "linalg.lstsq.grad_oriented", "linalg.lu", "linalg.lu_factor", "linalg.lu_factor_ex",
        "linalg.lu_solve", "linalg.pinv", "linalg.pinv.singular", "linalg.pinv.hermitian", "linalg.qr",
        "linalg.slogdet", "linalg.solve", "linalg.solve_ex", "linalg.solve_triangular", "linalg.svd",
        "linalg.svdvals", "linalg.tensorinv", "linalg.tensorsolve", "linalg.matrix_rank",
        "linalg.matrix_rank.hermitian", "linalg.cond", "pinverse", "linalg.norm.subgradients_at_zero",
        "norm.nuc", "linalg.matrix_norm",
    ], LINALG),
    # complex numbers
    **dict.fromkeys(["view_as_complex", "complex", "polar", "cdouble", "cfloat", "chalf"], COMPLEX),
    # data-dependent outputs
    **dict.fromkeys(["masked_scatter", "nonzero_static", "histogram", "histogramdd", "histc"], DATA_DEPENDENT),
    # no kernel from Inductor either on the sweep's samples (docs/results/opinfo_cpu.md)
    **dict.fromkeys([
        "cdist", "nn.functional.pdist", "bucketize", "searchsorted", "nn.functional.embedding_bag",
        "grid_sampler_3d", "hash_tensor", "_segment_reduce.lengths", "_segment_reduce.offsets",
        "index_reduce.prod", "index_reduce.amin", "index_reduce.amax", "_upsample_bilinear2d_aa",
        "nn.functional.linear_cross_entropy.chunked", "nn.functional.linear_cross_entropy.chunked_none",
    ], EXTERN),
    "nn.functional.max_pool3d": LARGE_WINDOW,
    "torch.ops.aten._flash_attention_forward": ATTENTION,
    "torch.ops.aten._efficient_attention_forward": ATTENTION,
}

# ---- allowed fallbacks of one column only: {column: {op: reason}} ------------------------------

_TRITON_SCATTER_REDUCE = dict.fromkeys(["scatter_reduce.prod", "scatter_reduce.amin", "scatter_reduce.amax"],
                                       SCATTER_REDUCE_GPU)
COLUMN_ALLOWED_FALLBACKS = {
    "cuda": {**_TRITON_SCATTER_REDUCE, "nextafter": NEXTAFTER_BF16_GPU},
    "triton-interpret": dict(_TRITON_SCATTER_REDUCE),
}


def allowed_fallback(name: str, column: str):
    """Why ``name`` may run as aten calls only on ``column`` (Inductor does too), or None."""
    return COLUMN_ALLOWED_FALLBACKS.get(column, {}).get(name) or ALLOWED_FALLBACKS.get(name)

# ---- pending lowerings: ops Inductor makes kernels for that still run as aten here ------------

PENDING_LOWERINGS: dict = {}

# ---- expected failures: {column: {op: reason}}; "all" applies to every column --------------------

EXPECTED_FAILURES = {
    "all": {},
    "cpu": {},
    "triton-interpret": {},
    "cuda": {},
}


def expected_failure(name: str, column: str):
    """The reason ``name`` is expected to fail on ``column``, or None."""
    return EXPECTED_FAILURES.get(column, {}).get(name) or EXPECTED_FAILURES["all"].get(name)
