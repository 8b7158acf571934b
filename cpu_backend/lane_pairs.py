"""Two (LANE_GROUPS) vectors of rows per step for lanes-are-rows reductions
(x - softmax(x) over a strided dim). A mixin of CppKernel.

In the plain lanes-are-rows form each step of the row loop takes kVecLanes rows (8 floats
on AVX2: half a cache line of each reduced position) through every r loop. Its reads of
the input and its writes of an output laid out like the input then touch each line twice,
a whole reduced dim apart: at a power-of-two row stride (1024x1024 transposed) the lines
conflict in L1 and L2 before the second half comes, and a half-written output line is
read for ownership, evicted and read again. Here a step takes two vectors of rows: the
body is generated once, copied with its names renamed for the second vector (`tmp3` ->
`tmp3_b`, the lane base `x1` -> `x1_b`, local buffers and read caches get a second set),
and the two copies are interleaved inside each r loop, so each iteration reads and writes
whole lines. Kernel alone (ctypes on torch tensors, fresh output), one thread,
x - softmax(x) f32 transposed: 1024x1024 2.04 -> 1.19 ms, 513x1531 1.04 -> 0.87 ms.

The jam is textual, so it accepts only bodies it can read: straight statements and
`for (...) {` blocks whose headers the rename leaves alone, every declared name renamed.
Anything else (masks, transposed output tiles, lambdas) keeps the one-vector form.
"""
import re
from typing import Optional

from tritonfuse import sym

from .common import cexpr

# Vectors of rows per step: 2 (16 floats on AVX2, one cache line of each reduced position);
# 4 was no better in one loaded run (x - softmax(x), 1024x1024 / 513x1531 / 2048x512).
LANE_GROUPS = 2
_LANE_NAMES = r"tmp\d+|acc\d+\w*|local_\w+|cache_\w+"
# a declaration: [alignas(n)] [const] type[*] [__restrict__] name followed by = ( [ or ;
_DECLARATION = re.compile(r"^\s*(?:alignas\(\d+\)\s+)?(?:const\s+)?[\w:<>]+\*?(?:\s+__restrict__)?\s+(\w+)\s*[=(\[;{]")
_FOR = re.compile(r"^\s*for \(.*\) \{$")


class CppLanePairs:
    def _lane_pairs_eligible(self) -> bool:
        """The plain lanes-are-rows form of a reduction with values kept across its loops
        (local buffers or read caches), static reduced sizes, no tiles."""
        return (LANE_GROUPS > 1 and self.axis == "x" and self.is_reduction and not self.tiled
                and bool(self.local_buffers or self.read_cache)
                and all(sym.is_static(s) for s in self.r_sizes))

    def _emit_lane_pair_loop(self, out, inner) -> bool:
        """The vector loop over the last x dim, LANE_GROUPS vectors per step; False
        (nothing written) when the body cannot be jammed."""
        var = f"x{len(self.x_sizes) - 1}"
        groups = LANE_GROUPS
        jammed = jam_vectors(inner.getvalue(), var, groups)
        if jammed is None:
            return False
        size = cexpr(self.x_sizes[-1])
        step = f"{groups} * tf::kVecLanes"
        out.writeline(f"for (int64_t {var} = 0; {var} < {size}; {var} += {step}) {{")
        with out.indent():
            out.writeline(f"if ({var} + {step} <= {size}) {{   // {groups} whole vectors of rows")
            with out.indent():
                out.writeline("constexpr bool TAIL = false;")
                out.writeline("(void)TAIL;")
                out.writeline("const int count = tf::kVecLanes;")
                for k, suffix in enumerate(suffixes(groups)[1:], 1):
                    out.writeline(f"const int64_t {var}{suffix} = {var} + {k} * tf::kVecLanes;")
                for line in jammed:
                    out.writeline(line)
            out.writeline("} else {   // the last rows, a vector at a time")
            with out.indent():
                out.writeline(f"for (int64_t {var}_rest = {var}; {var}_rest < {size}; {var}_rest += tf::kVecLanes) {{")
                with out.indent():
                    out.writeline(f"const int64_t {var} = {var}_rest;")
                    self._emit_chunk(out, inner, f"{size} - {var} < tf::kVecLanes ? int({size} - {var}) : tf::kVecLanes")
                out.writeline("}")
            out.writeline("}")
        out.writeline("}")
        self.lane_groups = groups
        return True

    def _declare_lane_group_buffers(self, code, declared: str):
        """The other vectors' local buffers and read caches: copies of the declarations."""
        for suffix in suffixes(self.lane_groups)[1:]:
            for line in declared.splitlines():
                if line.strip():
                    code.writeline(re.sub(r"\b(local_\w+?|cache_\w+?)(_storage)?\b",
                                          lambda m: f"{m.group(1)}{suffix}{m.group(2) or ''}", line.strip()))


def suffixes(groups: int) -> list:
    """Name suffixes of the vectors of one step: "" for the first, then _b, _c, ..."""
    return [""] + [f"_{chr(ord('b') + k)}" for k in range(groups - 1)]


def _rename(line: str, var: str, suffix: str) -> str:
    if not suffix:
        return line
    return re.sub(rf"\b({_LANE_NAMES}|{var})\b", lambda m: m.group(1) + suffix, line)


def _blocks(lines):
    """Lines -> items: a statement (str) or a for block (header, [items]); None if a line
    is neither (an if, a lambda, a statement over several lines)."""
    stack = [[]]
    headers = []
    for line in lines:
        text = line.strip()
        if not text or text.startswith("//"):
            continue
        if _FOR.match(line):
            headers.append(text)
            stack.append([])
        elif text == "}":
            if not headers:
                return None
            items = stack.pop()
            stack[-1].append((headers.pop(), items))
        elif text.endswith(";") and "{" not in text and "}" not in text:
            stack[-1].append(text)
        else:
            return None
    return stack[0] if not headers else None


def _jam(copies, out, depth):
    """Interleave item lists of the same shape; False if their shapes differ."""
    if len({len(items) for items in copies}) != 1:
        return False
    statements = []
    for items in zip(*copies):
        if len({isinstance(item, str) for item in items}) != 1:
            return False
        if isinstance(items[0], str):
            statements.append(items)
            continue
        if len({header for header, _ in items}) != 1:   # a loop whose bounds depend on the lanes
            return False
        _flush(statements, out, depth)
        out.append("    " * depth + items[0][0])
        if not _jam([body for _, body in items], out, depth + 1):
            return False
        out.append("    " * depth + "}")
    _flush(statements, out, depth)
    return True


def _flush(statements, out, depth):
    """Each copy's statements in a run (they are independent), copy after copy."""
    for copy in zip(*statements):
        out.extend("    " * depth + line for line in copy)
    statements.clear()


def jam_vectors(body: str, var: str, groups: int) -> Optional[list]:
    """The lines of ``body`` for ``groups`` vectors of rows (lane bases ``var``,
    ``var``_b, ...), interleaved inside each loop; None when the body has a construct this
    does not read or declares a name the rename would not give each vector its own copy of."""
    lines = body.splitlines()
    for line in lines:
        declared = _DECLARATION.match(line)
        if declared and not re.fullmatch(_LANE_NAMES, declared.group(1)):
            return None
    copies = [_blocks([_rename(line, var, suffix) for line in lines]) for suffix in suffixes(groups)]
    if any(items is None for items in copies):
        return None
    out = []
    return out if _jam(copies, out, 0) else None
