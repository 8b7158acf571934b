"""The explicit decomposition table handed to aot_autograd: composite aten ops that are
rewritten into the primitives tritonfuse lowers (softmax -> amax/sub/exp/sum/div, layer
norm -> var_mean and pointwise math, GELU/SiLU and their backwards, ...). Ops left out
either have a lowering of their own or run as aten fallbacks (mm, convolution, sort...)."""
import torch
from torch._decomp import get_decompositions

from . import extra_decompositions, pool_offsets

aten = torch.ops.aten

DECOMPOSED_OPS = [
    # normalizations and softmax
    "_softmax", "_safe_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "logsumexp",
    "native_layer_norm", "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "_batch_norm_with_update", "_batch_norm_with_update_functional",
    "_batch_norm_no_update", "native_batch_norm_backward", "batch_norm_backward",
    "rms_norm", "_fused_rms_norm", "linalg_vector_norm", "norm", "std_mean", "aminmax",
    # activations and their backwards
    "gelu", "gelu_backward", "silu", "silu_backward", "sigmoid_backward", "tanh_backward", "threshold_backward",
    "leaky_relu", "leaky_relu_backward", "hardtanh", "hardtanh_backward", "elu", "elu_backward",
    "hardsigmoid", "hardsigmoid_backward", "hardswish", "hardswish_backward", "softplus", "softplus_backward",
    "mish", "mish_backward", "log_sigmoid_forward", "log_sigmoid_backward", "logit", "xlogy",
    # losses
    "mse_loss", "mse_loss_backward", "smooth_l1_loss", "huber_loss", "nll_loss_forward", "nll_loss2d_forward",
    "nll_loss_backward", "nll_loss2d_backward",   # one-hot scatters: pointwise (lowering/indexing.py)
    "embedding_dense_backward",                   # zeros + masked index_put(accumulate=True), where allowed
    "binary_cross_entropy", "binary_cross_entropy_backward", "binary_cross_entropy_with_logits",
    # pointwise composites
    "rsub", "addcmul", "addcdiv", "lerp", "masked_fill", "frac", "deg2rad", "rad2deg", "square", "mvlgamma",
    # views, gathers and scatters expressible as views/where/cat
    "index_select", "split", "split_with_sizes", "unbind", "narrow", "stack", "hstack", "vstack", "repeat",
    "expand_as", "select_backward", "select_scatter",   # slice_backward, slice_scatter: lowering/tensor_ops.py
    "diagonal_backward",
    # small linear algebra into mul + sum (large matmuls stay aten fallbacks)
    "dot", "addmv", "baddbmm", "trace",
    # ops Inductor turns into kernels through the same decompositions (the OpInfo sweep's
    # lowering gaps): activations, losses, shuffles and rotations, diagonal fills,
    # ranges, im2col, dropout's backward
    "glu", "celu", "threshold", "_prelu_kernel", "soft_margin_loss", "native_dropout_backward",
    "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "rot90", "diag_embed",
    "block_diag", "linspace", "logspace", "renorm", "linalg_cross", "ldexp", "dist",
    "im2col", "unfold_copy", "_chunk_cat", "max_unpool2d", "max_unpool3d", "grid_sampler_2d",
    "adaptive_max_pool2d", "adaptive_max_pool3d",
    "as_strided_copy",
    # creation: the identity as a comparison of two ranges (one kernel instead of aten.eye)
    "eye",
]


def decomposition_table():
    ops = [getattr(aten, name) for name in DECOMPOSED_OPS if hasattr(aten, name)]
    table = get_decompositions(ops)
    table.update(extra_decompositions.table())
    table.update(pool_offsets.table())
    table[aten.embedding_dense_backward.default] = _embedding_backward_where_lowered(
        table[aten.embedding_dense_backward.default])
    table[aten._to_copy.default] = _dtype_cast_as_convert_element_type
    table[aten.detach.default] = _detach_as_alias
    return table


def _detach_as_alias(x):
    """``detach`` (autograd's own, in the backward's reads of saved values) as ``alias``: a
    view the min-cut partitioner knows fuses into its reader; a ``detach`` between the
    log-softmax and the backward's ``exp`` made it save the float32 log-softmax itself rather
    than the bf16 logits and two per-row scalars."""
    return torch.ops.aten.alias.default(x)


def _dense(x) -> bool:
    """x covers its storage span without holes or overlaps (False when that depends on a symbol)."""
    import torch._prims_common as prims_common
    test = getattr(prims_common, "is_non_overlapping_and_dense_or_false", None)   # torch >= 2.13
    if test is None:
        test = prims_common.is_non_overlapping_and_dense
    return bool(test(x))


def _dtype_cast_as_convert_element_type(x, *, dtype=None, layout=None, device=None, pin_memory=None,
                                        non_blocking=False, memory_format=None):
    """``x.to(dtype)`` as ``prims.convert_element_type``: the same kernel, and the form
    aot_autograd's min-cut partitioner knows it may recompute in the backward (it never
    recomputes ``aten._to_copy``, so a language model's float32 copy of its bf16 logits, or
    the log-softmax computed from it, was saved for the backward at twice the bytes of the
    logits). Copies that change the device, layout or memory format stay ``_to_copy``."""
    if (dtype is None or dtype == x.dtype or (device is not None and torch.device(device) != x.device)
            or layout not in (None, torch.strided) or pin_memory
            or memory_format not in (None, torch.preserve_format) or not _dense(x)):
        return NotImplemented
    return torch.ops.prims.convert_element_type.default(x, dtype)


def _embedding_backward_where_lowered(decomposition):
    """embedding_dense_backward as a scatter-add that fuses (lowering/indexing.py):

    * where the backend adds a table row's gradients in a fixed order, as eager's kernel
      does: torch's decomposition (zeros + masked index_put(accumulate=True));
    * where it may add them in none (float atomics on a GPU outside deterministic mode, as
      torch.compile's default compiler does; indexing.UNORDERED_AS_TORCH_COMPILE): zeros +
      index_add, an op whose eager kernel adds in no fixed order there as well;
    * elsewhere eager's own kernel (NotImplemented keeps the op)."""
    def decompose(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
        from .codegen.registry import deterministic_scatter
        from .lowering.indexing import scatter_sum_lowered
        if deterministic_scatter(grad_output.device.type):
            return decomposition(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
        if not scatter_sum_lowered(grad_output.device, "embedding_dense_backward"):
            return NotImplemented
        return _embedding_backward_as_index_add(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    return decompose


def _embedding_backward_as_index_add(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The table's gradient as zeros + index_add of the rows of ``grad_output`` (16-bit
    gradients summed in float32, as torch's decomposition does); rows of ``padding_idx``
    add nothing; with ``scale_grad_by_freq`` each row is divided by its index's count (an
    integer index_add: exact in any order)."""
    width = grad_output.shape[indices.dim():]
    row_shape = (-1,) + (1,) * len(width)
    result_dtype = grad_output.dtype
    sum_dtype = torch.float32 if result_dtype in (torch.float16, torch.bfloat16) else result_dtype
    rows = grad_output.to(sum_dtype).reshape((-1,) + tuple(width))
    flat = indices.reshape(-1).long()
    if scale_grad_by_freq:
        counts = torch.ops.aten.index_add.default(flat.new_zeros(num_weights), 0, flat, torch.ones_like(flat))
        rows = rows / counts[flat].reshape(row_shape)
    if padding_idx >= 0:
        rows = rows.masked_fill((flat == padding_idx).reshape(row_shape), 0)
    table = rows.new_zeros((num_weights,) + tuple(width))
    return torch.ops.aten.index_add.default(table, 0, flat, rows).to(result_dtype)
