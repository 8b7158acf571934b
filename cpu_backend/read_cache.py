"""Read caches for kernels whose vector lanes are rows (a softmax of a transposed input,
x - softmax(x) over a strided dim). A mixin of CppKernel.

The plain lanes-are-rows form walks the whole reduced dim once per loop for each vector
of rows; a loop that reads the input again (softmax: the max, then exp(x - max) and its
sum, then the output) reads it again from memory, kVecLanes elements from each of
r_numel rows that lie a whole row stride apart. At power-of-two strides those lines all
fall into one cache set and are evicted before the next loop comes (x - softmax(x) over a
16384 x 128 transposed input: every reread went to L3). Here the first loop that reads
such an element also stores it, lane-interleaved, into a thread-local buffer of one row
per lane (as the local buffers of values crossing loops are laid out); later loops read
that buffer, contiguous, from L1 / L2.

Chosen after a first generation: the reads seen in two or more loops, contiguous across
the lanes and strided along the reduced dim, are cached when the buffers stay within
READ_CACHE_BYTES per thread; the kernel is then generated again with them.
"""
from tritonfuse import sym

from .common import cexpr, compute_dtype, ctype

# Bytes of one thread's read caches: past L2 a cached row no longer comes back faster
# than the strided reread.
READ_CACHE_BYTES = 512 * 1024


class CppReadCache:
    def _init_read_cache(self):
        self.read_cache = None      # (buffer, index text) -> (cache name, first loop); None: not chosen yet
        self.loop_reads = {}        # (buffer, index text) -> loops that read it, contiguous across lanes

    def _cache_eligible(self, name, index, dtype) -> bool:
        """A read of an input inside an r loop of the plain lanes-are-rows form, contiguous
        across the lanes and moving with the reduced index."""
        if self.axis != "x" or not self.is_reduction or not self.in_r_loop or self.block_width is not None:
            return False
        if self.out_tiles is None or self.mask_stack or not dtype.is_floating_point:
            return False   # out_tiles is a dict only while the plain form's r loops are generated
        r_vars = {f"r{i}" for i in range(len(self.r_sizes))}
        return (self._access_kind(index) == "contiguous"
                and any(s.name in r_vars for s in index.free_symbols))

    def _cached_load(self, name, pointer, index, dtype):
        """The load of ``pointer[index]`` through the read cache, or None for a plain load."""
        if not self._cache_eligible(name, index, dtype):
            return None
        key = (name, str(index))
        self.loop_reads.setdefault(key, set()).add(self.segment_index)
        if not self.read_cache or key not in self.read_cache:
            return None
        cache, first = self.read_cache[key]
        offset = self._lane_local_offset()
        if self.segment_index != first:
            return self._emit(f"tf::vload<TAIL>({cache} + {offset}, count)", dtype, True)
        value = self._load_from(pointer, index, dtype)
        self.code.writeline(f"tf::vstore<TAIL>({cache} + {offset}, {value}, count);")
        return value

    def _reads_worth_caching(self) -> dict:
        """After a first generation: the reads of two or more loops, within the budget."""
        if not all(sym.is_static(s) for s in self.r_sizes):
            return {}
        repeated = sorted((key, min(loops)) for key, loops in self.loop_reads.items() if len(loops) > 1)
        row_bytes = sym.to_int(sym.product(self.r_sizes)) * 16 * 4   # 16: the widest vector's lanes
        chosen = {}
        for key, first in repeated:
            if (len(chosen) + 1) * row_bytes > READ_CACHE_BYTES:
                break
            chosen[key] = (f"cache_{key[0]}_{len(chosen)}", first)
        return chosen

    def _declare_read_caches(self, code):
        rows = f"{cexpr(sym.product(self.r_sizes))} * tf::kVecLanes"
        for (name, _), (cache, _) in (self.read_cache or {}).items():
            t = ctype(compute_dtype(self.graph.name_to_buffer[name].get_dtype()))
            code.writeline(f"tf::LocalBuffer<{t}> {cache}_storage({rows});  // a row per vector lane of {name}, "
                           f"read again by later loops")
            code.writeline(f"{t}* __restrict__ {cache} = {cache}_storage.get();")
