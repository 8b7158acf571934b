"""Reductions of the C++ backend: accumulators, their updates inside the vector loops
and their final combination. A mixin of CppKernel (it uses the kernel's code buffers:
``pre`` before the loop, ``code`` inside it, ``post`` after it)."""
import torch

from tritonfuse.ops_table import reduction_identity

from . import common
from .common import CppVar, cexpr, compute_dtype, cpp_constant, ctype

_COMBINE = {
    "sum": "{acc} + {value}",
    "prod": "{acc} * {value}",
    "max": "tf::maximum({acc}, {value})",
    "min": "tf::minimum({acc}, {value})",
    "any": "{acc} | {value}",
    "all": "{acc} & {value}",
}

_LANE_COMBINE = {
    "sum": "({a} + {b})",
    "prod": "({a} * {b})",
    "max": "tf::maximum({a}, {b})",
    "min": "tf::minimum({a}, {b})",
    "any": "({a} | {b})",
    "all": "({a} & {b})",
}

_HORIZONTAL = {"sum": "reduce_add", "prod": "reduce_mul", "max": "reduce_max", "min": "reduce_min",
               "any": "reduce_any", "all": "reduce_all"}


class CppReductions:
    def reduction(self, dtype, src_dtype, reduction_type, value):
        if reduction_type.startswith("welford"):
            return self._welford(value, compute_dtype(src_dtype))[0 if reduction_type == "welford_mean" else 1]
        if self.vec_mode and self.axis == "r" and not value.vec:
            # a value the same in every lane (a constant, a row's scalar) still counts once
            # per lane: sum(ones) over 125 elements is 125, not one per vector chunk
            value = CppVar(self._vec_if(value, True), value.dtype, True)
        key = f"reduction:{reduction_type}:{value}"
        if key in self.cse.cache:
            return self.cse.cache[key]
        acc_dtype = compute_dtype(src_dtype)
        t = ctype(acc_dtype)
        identity = cpp_constant(reduction_identity(reduction_type, acc_dtype), acc_dtype)
        acc = f"acc{self.acc_counter}"
        self.acc_counter += 1
        vec = value.vec
        lane_wise = self.axis == "x"          # lanes are different rows: no horizontal reduce
        if self.partials is not None:   # an outer reduction (outer_reduction.py)
            result = self._rows_outer_reduction_op(reduction_type, self._vec_if(value, True), acc, t, identity,
                                                   _LANE_COMBINE[reduction_type], dtype)
        elif reduction_type in ("argmax", "argmin"):
            result = self._arg_reduction(reduction_type, value, acc, t, lane_wise)
        elif reduction_type in ("max", "min") and vec and acc_dtype.is_floating_point:
            result = self._float_extremum(reduction_type, value, acc, t, identity, dtype, lane_wise)
        elif vec and not lane_wise:
            acc_type = "tf::Vec<bool>" if acc_dtype == torch.bool else f"tf::Vec<{t}>"
            self._declare_slots(acc_type, acc, identity)
            v = f"tf::tail_fill<TAIL>({value}, {identity}, count)"
            slot = self._slot(acc)
            self.code.writeline(f"{slot} = {_COMBINE[reduction_type].format(acc=slot, value=v)};")
            total = self._combine_slots(acc, lambda a, b: _COMBINE[reduction_type].format(acc=a, value=b))
            result = CppVar(f"{acc}_result", dtype, False)
            self.post.writeline(f"const {ctype(dtype) if dtype != torch.bool else 'bool'} {result} = "
                                f"tf::{_HORIZONTAL[reduction_type]}({total});")
        else:
            acc_type = ("tf::Vec<bool>" if acc_dtype == torch.bool else f"tf::Vec<{t}>") if vec else t
            self.pre.writeline(f"{acc_type} {acc}({identity});")
            self.code.writeline(f"{acc} = {_COMBINE[reduction_type].format(acc=acc, value=value)};")
            result = CppVar(acc, dtype, vec)
        if self.split:
            t = "bool" if dtype == torch.bool else ctype(dtype)
            self.split_results.append((result, t, _LANE_COMBINE[reduction_type]))
        self.finished_reductions[key] = result
        self.cse.cache[key] = result
        return result

    def _welford(self, value, dtype):
        """(mean, m2) of ``value`` over the reduced dims, one pass, shared by the
        welford_mean and welford_m2 nodes of a var_mean."""
        key = f"reduction:welford:{value}"
        if key in self.cse.cache:
            return self.cse.cache[key]
        t = ctype(dtype)
        acc = f"acc{self.acc_counter}"
        self.acc_counter += 1
        vector = self._vec_if(value, True)
        if self.partials is not None:   # an outer reduction: accumulator rows (outer_reduction.py)
            m2 = f"acc{self.acc_counter}"
            self.acc_counter += 1
            result = self._rows_welford_op(vector, acc, m2, t, dtype)
        elif self.axis == "x":   # lanes are rows, each a step a time: one step count for all
            self.pre.writeline(f"tf::WelfordLanes<{t}> {acc};")
            self.code.writeline(f"{acc} = tf::welford_lanes_update({acc}, {vector});")
            result = (CppVar(f"{acc}.mean", dtype, True), CppVar(f"{acc}.m2", dtype, True))
        else:
            self.pre.writeline(f"tf::WelfordAcc<{t}> {acc};")
            self.code.writeline(f"tf::welford_add<TAIL>({acc}, {vector}, count);")
            self.post.writeline(f"const auto {acc}_result = tf::welford_finish({acc});")
            result = (CppVar(f"{acc}_result.mean", dtype, False), CppVar(f"{acc}_result.m2", dtype, False))
        self.finished_reductions[key] = result
        self.cse.cache[key] = result
        return result

    def _declare_slots(self, acc_type, acc, identity):
        self.pre.writeline(" ".join(f"{acc_type} {acc}_{k}({identity});" for k in range(common.UNROLL)))

    @staticmethod
    def _slot(acc) -> str:
        """The accumulator of the current unroll slot (see tf::slot)."""
        if common.UNROLL == 1:
            return f"{acc}_0"
        return f"tf::slot<SLOT>({', '.join(f'{acc}_{k}' for k in range(common.UNROLL))})"

    def _combine_slots(self, acc, combine) -> str:
        total = f"{acc}_0"
        for k in range(1, common.UNROLL):
            total = combine(total, f"{acc}_{k}")
        return total

    def _float_extremum(self, reduction_type, value, acc, t, identity, dtype, lane_wise):
        """max/min over vectors: a one-instruction combine plus a separate NaN flag."""
        nan = cpp_constant(float("nan"), dtype)
        extremum = f"tf::{reduction_type}_ignoring_nan"
        if lane_wise:
            self.pre.writeline(f"tf::Vec<{t}> {acc}({identity});")
            self.pre.writeline(f"tf::Vec<bool> {acc}_nan(false);")
            self.code.writeline(f"{acc} = {extremum}({acc}, {value});")
            self.code.writeline(f"{acc}_nan = {acc}_nan | tf::isnan({value});")
            result = CppVar(f"{acc}_result", dtype, True)
            self.post.writeline(f"const auto {result} = tf::where({acc}_nan, tf::Vec<{t}>({nan}), {acc});")
            return result
        self._declare_slots(f"tf::Vec<{t}>", acc, identity)
        self._declare_slots("tf::Vec<bool>", f"{acc}_nan", "false")
        v = f"tf::tail_fill<TAIL>({value}, {identity}, count)"
        slot, nan_slot = self._slot(acc), self._slot(f"{acc}_nan")
        self.code.writeline(f"{slot} = {extremum}({slot}, {v});")
        self.code.writeline(f"{nan_slot} = {nan_slot} | tf::isnan({v});")
        values = self._combine_slots(acc, lambda a, b: f"{extremum}({a}, {b})")
        nans = self._combine_slots(f"{acc}_nan", lambda a, b: f"({a} | {b})")
        result = CppVar(f"{acc}_result", dtype, False)
        self.post.writeline(f"const {t} {result} = tf::reduce_any({nans}) ? {nan} : "
                            f"tf::reduce_{reduction_type}({values});")
        return result

    def _arg_reduction(self, reduction_type, value, acc, t, lane_wise):
        flat_r = cexpr(self._local_index())
        vec = value.vec
        if vec and not lane_wise:
            self.pre.writeline(" ".join(f"tf::ArgAcc<tf::Vec<{t}>> {acc}_{k};" for k in range(common.UNROLL)))
            self._ensure_lanes(self.vector_var)
            index = f"tf::Vec<int64_t>({flat_r} - r{len(self.r_sizes) - 1}) + r{len(self.r_sizes) - 1}_lanes"
            slot = self._slot(acc)
            self.code.writeline(f"if constexpr (TAIL) {slot} = tf::{reduction_type}_update_partial("
                                f"{slot}, {value}, {index}, count);")
            self.code.writeline(f"else {slot} = tf::{reduction_type}_update({slot}, {value}, {index});")
            lanes = [f"tf::{reduction_type}_reduce_lanes({acc}_{k})" for k in range(common.UNROLL)]
            total = lanes[0]
            for lane in lanes[1:]:
                total = f"tf::{reduction_type}_combine({total}, {lane})"
            result = CppVar(f"{acc}_result", torch.int64, False)
            self.post.writeline(f"const int64_t {result} = {total}.index;")
            return result
        if vec:
            self.pre.writeline(f"tf::ArgAcc<tf::Vec<{t}>> {acc};")
            self.code.writeline(f"{acc} = tf::{reduction_type}_update({acc}, {value}, tf::Vec<int64_t>({flat_r}));")
            return CppVar(f"{acc}.index", torch.int64, True)
        self.pre.writeline(f"tf::ArgAcc<{t}> {acc};")
        self.code.writeline(f"{acc} = tf::{reduction_type}_update({acc}, {value}, int64_t({flat_r}));")
        return CppVar(f"{acc}.index", torch.int64, False)
