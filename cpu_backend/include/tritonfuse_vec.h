// tritonfuse_vec.h: the header-only SIMD library that generated C++ kernels include.
//
//   #include "tritonfuse_vec.h"
//   for (int64_t i = 0; i < n; i += tf::kVecLanes) {
//       int count = n - i < tf::kVecLanes ? int(n - i) : tf::kVecLanes;
//       auto x = tf::Vec<float>::load_partial(in_ptr0 + i, count);
//       auto y = tf::exp(x - tf::reduce_max(x));
//       y.store_partial(out_ptr0 + i, count);
//   }
//
// Everything lives in namespace tf. Pieces:
//   tf_vec_core.h    Vec<T>, Vec<bool> masks, load/store/partial/masked/gather, arange,
//                    operators, comparisons, where, convert<U>, bitcast<U>
//   tf_vec_math.h    exp exp2 expm1 log log2 log10 log1p sqrt rsqrt tanh sigmoid erf sin cos
//                    pow fmod abs floor ceil trunc round maximum minimum sign reciprocal
//                    isnan isinf isfinite copysign (+ per-lane libm fallbacks: tan lgamma cbrt)
//   tf_vec_special.h asin acos atan atan2 sinh cosh asinh acosh atanh erfc hypot (vectorized),
//                    erfcx nextafter signbit
//   tf_special_loops.h  the recurrence loops of torch.special's orthogonal polynomials
//   tf_vec_half.h    bf16 / fp16 <-> float, scalar and vector
//   tf_vec_reduce.h  reduce_add/mul/max/min/any/all, Welford, ArgAcc (argmax/argmin)
//   tf_int.h         integer ops with eager's semantics: wrap, shifts, checked division
//
// Compiled with the flags of cpu_backend/build.py (-O3 -march=native -fwrapv, no -ffast-math).
#pragma once

#include "tf_vec_core.h"
#include "tf_vec_math.h"
#include "tf_vec_special.h"
#include "tf_special_loops.h"
#include "tf_vec_half.h"
#include "tf_vec_reduce.h"
#include "tf_int.h"
