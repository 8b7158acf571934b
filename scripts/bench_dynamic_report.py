"""The tables of the dynamic-shape suite (scripts/bench_dynamic.py)."""
from __future__ import annotations

from scripts.bench_common import Notes, busy_machine_note, fmt, fmt_ratio, geomean, machine_line, markdown_table

MODE_TITLES = {"infer": "Inference", "train": "Training step (forward, loss, backward)"}
COUNTER_COLUMNS = (("eager_graphs", "eager graphs"), ("symbolic_graphs", "symbolic graphs"),
                   ("static_specializations", "static specializations"),
                   ("cpp_builds", "C++ builds"))
TOGETHER = "together"   # --together's worker (scripts/bench_dynamic.py): every backend in one process
DYNAMIC_TEXT = {"true": "torch.compile(dynamic=True)",
                "auto": "Dynamo's default dynamic= (static first, then a symbolic recompile)"}


def _steady(res: dict, key: str = "ms") -> dict[int, float]:
    """Per length, the second pass's median step ("ms", pipelined) or, on CUDA, the step
    queued behind a sleep ("device_ms": its kernels alone; "host_ms": its enqueue alone)."""
    return {e["length"]: e[key] for e in res["values"].get("second_pass", []) if e.get(key)}


def _ratio_over_lengths(slower: dict[int, float], faster: dict[int, float]) -> float | None:
    """Geomean over the lengths both have of slower_ms / faster_ms."""
    return geomean([slower[n] / faster[n] for n in slower if n in faster and faster[n]])


def _compile_seconds(first: list[dict], steady: dict[int, float]) -> float | None:
    """The first pass less the steady step time of each length: seconds spent compiling
    (and autotuning), over the lengths timed in both passes."""
    extra = [max(0.0, e["first_call_s"] - steady[e["length"]] / 1e3)
             for e in first if e["length"] in steady]
    return sum(extra) if extra else None


def summarize(report: dict) -> dict:
    """Per mode and backend: status (ok | FAIL | the worker's), first calls, first-pass and
    compile seconds, steady geomean ms and ratios, Dynamo's counts and tritonfuse's
    counters after the first pass."""
    summary: dict = {}
    for mode, per_backend in report["results"].items():
        summary[mode] = {}
        eager = per_backend.get("eager")
        for backend, res in per_backend.items():
            if backend == TOGETHER:   # not a backend: every backend in one process (below)
                continue
            first = res["values"].get("first_pass", [])
            steady = _steady(res)
            wrong = [e["length"] for e in first if e.get("check") and not e["check"]["ok"]]
            status = res["status"]
            if status == "ok" and len(steady) < len(report["lengths"]):
                status = "error"
            if wrong and status == "ok":
                status = "FAIL"
            entry = {
                "status": status, "message": res["message"], "wrong_lengths": wrong,
                "first_calls_s": [e["first_call_s"] for e in first],
                "first_pass_s": sum(e["first_call_s"] for e in first) if first else None,
                "compile_s": _compile_seconds(first, steady),
                "lengths_done": len(first),
                "steady_geomean_ms": geomean(list(steady.values())),
                "device_geomean_ms": geomean(list(_steady(res, "device_ms").values())),
                "host_geomean_ms": geomean(list(_steady(res, "host_ms").values())),
                "vs_eager": (_ratio_over_lengths(_steady(eager), steady)
                             if eager and backend != "eager" and not wrong else None),
                "counters": (first[-1].get("tritonfuse") if first else None),
                "dynamo": (first[-1].get("dynamo") if first else None),
            }
            summary[mode][backend] = entry
        if "inductor" in per_backend and "tritonfuse" in per_backend:
            ok = all(summary[mode][b]["status"] == "ok" for b in ("inductor", "tritonfuse"))
            for key, name in (("ms", "vs_inductor"), ("device_ms", "vs_inductor_device")):
                summary[mode]["tritonfuse"][name] = (
                    _ratio_over_lengths(_steady(per_backend["inductor"], key),
                                        _steady(per_backend["tritonfuse"], key)) if ok else None)
        if TOGETHER in per_backend:
            summary[mode][TOGETHER] = _summarize_together(per_backend[TOGETHER], report["lengths"])
    return summary


def _summarize_together(res: dict, lengths: list[int]) -> dict:
    """--together's worker: per length the interleaved medians of every backend, the
    geomean over the lengths of tritonfuse vs inductor, and the lowest length's ratio."""
    rows = res["values"].get("interleaved", [])
    status = res["status"]
    if status == "ok" and len(rows) < len(lengths):
        status = "error"
    ratios = {e["length"]: e["ms"]["inductor"] / e["ms"]["tritonfuse"] for e in rows
              if e["ms"].get("inductor") and e["ms"].get("tritonfuse")}
    first = res["values"].get("first_pass", {}) or {}
    return {"status": status, "message": res["message"], "per_length": rows, "ratios": ratios,
            "vs_inductor": geomean(list(ratios.values())),
            "worst": min(ratios.items(), key=lambda kv: kv[1]) if ratios else None,
            "first_pass_s": {b: sum(e["first_call_s"] for e in v) for b, v in first.items()}}


def first_calls_text(seconds: list[float]) -> str:
    """"15.3, 12.6, then 0.05 (max 0.08) for the other 8": the first two, then the rest."""
    if not seconds:
        return "-"
    if len(seconds) <= 3:
        return ", ".join(fmt(s, 2) for s in seconds)
    head = ", ".join(fmt(s, 2) for s in seconds[:2])
    rest = seconds[2:]
    if not rest:
        return head
    median = sorted(rest)[len(rest) // 2]
    return f"{head}, then {fmt(median, 2)} (max {fmt(max(rest), 2)}) for the other {len(rest)}"


def _count(counts: dict | None, key: str) -> str:
    value = (counts or {}).get(key)
    return "-" if value is None else str(value)


def _check_text(notes: Notes, backend: str, mode: str, s: dict, lengths: list[int]) -> str:
    status = s["status"]
    if status == "ok":
        return "ok" if backend != "eager" else "reference"
    if status == "FAIL":
        return "FAIL " + notes.ref(f"{backend} {mode} is WRONG at lengths {s['wrong_lengths']}")
    return f"{status} " + notes.ref(f"{backend} {mode}: {status} after {s['lengths_done']} of "
                                    f"{len(lengths)} lengths: {s['message']}")


def _together_table(report: dict, mode: str, notes: Notes) -> list[str]:
    """--together's table: each length timed with every backend interleaved in one process."""
    s = report["summary"][mode].get(TOGETHER)
    if s is None:
        return []
    names = ["eager"] + [b for b in report["backends"] if b != "eager"]
    status = "" if s["status"] == "ok" else f" ({s['status']} {notes.ref(s['message'] or s['status'])})"
    worst = f"; lowest {fmt_ratio(s['worst'][1])} at {s['worst'][0]}" if s["worst"] else ""
    lines = ["", f"Same process{status}: every backend compiled in one worker (first pass "
             + ", ".join(f"{b} {fmt(v, 1)} s" for b, v in s["first_pass_s"].items())
             + "), then each length's steps timed interleaved, so the host is the same for all; "
             f"tritonfuse vs inductor over the lengths: {fmt_ratio(s['vs_inductor'])}{worst}.", ""]
    rows = []
    for e in s["per_length"]:
        ratio = s["ratios"].get(e["length"])
        rows.append([str(e["length"])] + [fmt(e["ms"].get(b)) for b in names]
                    + [fmt_ratio(ratio) if ratio else "-"])
    return lines + markdown_table(["length"] + [f"{b} ms" for b in names] + ["tritonfuse vs inductor"],
                                  rows, align_right_from=1)


def _mode_tables(report: dict, mode: str, notes: Notes) -> list[str]:
    per_backend, summary = report["results"][mode], report["summary"][mode]
    backends = [b for b in per_backend if b != TOGETHER]
    compiled = [b for b in backends if b != "eager"]
    lengths = report["lengths"]
    timed_alone = any(summary[b].get("device_geomean_ms") for b in backends)
    header = (["backend", "first call per length (s)", "first pass s", "compile s",
               "Dynamo graphs", "recompiles", "graph breaks"]
              + [title for _, title in COUNTER_COLUMNS]
              + ["second pass: geomean step ms", "vs eager", "tritonfuse vs inductor"]
              + (["device ms", "host ms", "device: tritonfuse vs inductor"] if timed_alone else [])
              + ["check"])
    rows = []
    for b in backends:
        s = summary[b]
        first_pass = fmt(s["first_pass_s"], 1)
        if s["lengths_done"] < len(lengths):
            first_pass = f">= {first_pass} ({s['lengths_done']} lengths)"
        rows.append([b, first_calls_text(s["first_calls_s"]), first_pass, fmt(s["compile_s"], 1)]
                    + [_count(s["dynamo"], k) for k in ("graphs", "recompiles", "graph_breaks")]
                    + [_count(s["counters"], k) for k, _ in COUNTER_COLUMNS]
                    + [fmt(s["steady_geomean_ms"]), fmt_ratio(s.get("vs_eager")),
                       fmt_ratio(s.get("vs_inductor"))]
                    + ([fmt(s["device_geomean_ms"]), fmt(s["host_geomean_ms"]),
                        fmt_ratio(s.get("vs_inductor_device"))] if timed_alone else [])
                    + [_check_text(notes, b, mode, s, lengths)])
    lines = markdown_table(header, rows, align_right_from=2)

    tf_first = {e["length"]: e for e in per_backend.get("tritonfuse", {}).get("values", {}).get("first_pass", [])}
    lines += ["", "Per length: first call (s), second-pass step (ms), Dynamo graphs / recompiles so "
              "far" + ("; tritonfuse's C++ builds, static specializations and eager graphs so far"
                       if tf_first else ""), ""]
    both = "inductor" in per_backend and "tritonfuse" in per_backend
    header = (["length"] + [f"{b} first s" for b in backends] + [f"{b} ms" for b in backends]
              + (["tritonfuse vs inductor"] if both else [])
              + ([f"{b} device ms" for b in backends] if timed_alone else [])
              + (["device: tritonfuse vs inductor"] if both and timed_alone else [])
              + [f"{b} graphs / recompiles" for b in compiled])
    if tf_first:
        header += ["tf C++ builds", "tf static specs", "tf eager graphs"]
    firsts = {b: {e["length"]: e for e in per_backend[b]["values"].get("first_pass", [])}
              for b in backends}
    steadies = {b: _steady(per_backend[b]) for b in backends}
    devices = {b: _steady(per_backend[b], "device_ms") for b in backends}
    rows = []
    for n in lengths:
        row = [str(n)]
        for b in backends:
            entry = firsts[b].get(n)
            text = fmt(entry["first_call_s"], 2) if entry else "-"
            if entry and entry.get("check") and not entry["check"]["ok"]:
                text += " WRONG"
            row.append(text)
        row += [fmt(steadies[b].get(n)) for b in backends]
        if both:
            ind, tf = steadies["inductor"].get(n), steadies["tritonfuse"].get(n)
            row.append(fmt_ratio(ind / tf) if ind and tf else "-")
        if timed_alone:
            row += [fmt(devices[b].get(n)) for b in backends]
            if both:
                ind, tf = devices["inductor"].get(n), devices["tritonfuse"].get(n)
                row.append(fmt_ratio(ind / tf) if ind and tf else "-")
        for b in compiled:
            dyn = (firsts[b].get(n) or {}).get("dynamo")
            row.append(f"{dyn['graphs']} / {dyn['recompiles']}" if dyn else "-")
        if tf_first:
            c = (tf_first.get(n) or {}).get("tritonfuse")
            row += [_count(c, k) for k in ("cpp_builds", "static_specializations", "eager_graphs")]
        rows.append(row)
    lines += markdown_table(header, rows, align_right_from=1)
    return lines + _together_table(report, mode, notes)


def render_markdown(report: dict) -> str:
    info = report["machine"]
    lengths = report["lengths"]
    limit = f", {report['time_limit_s']:.0f} s for the run" if report.get("time_limit_s") else ""
    lines = [f"# Dynamic shapes: {', '.join(report['backends'])} on {info['device_name']}", "",
             machine_line(info, report["timing"]), "",
             f"{report['model']}, {report['dtype'].replace('torch.', '')}, batch {report['batch']}, "
             f"{len(lengths)} sequence lengths {lengths[0]}..{lengths[-1]} in order; compiled with "
             f"{DYNAMIC_TEXT[report['dynamic']]}; each (step, backend) in one fresh process with "
             f"empty caches, limit {report['timeout_s']:.0f} s{limit}; run took "
             f"{report['wall_s']:.0f} s. First pass: each length's first call (compiles "
             "included); compile s = the first pass less the steady step of each length. "
             "Dynamo graphs: every graph handed to the backend (recompiles included); "
             "eager graphs: graphs tritonfuse ran eagerly. Second pass: the median step time "
             "per length; \"vs eager\" and "
             "\"tritonfuse vs inductor\" are geomeans over the lengths of the per-length ratios "
             "(above 1: faster). On a GPU, device ms and host ms: the same step queued whole "
             "behind a sleep kernel (median of 5), so its kernels' time and its enqueue time "
             "show apart; a step whose host ms exceeds its device ms is host-bound, and its "
             "pipelined time moves with the host between processes. Each compiled result is "
             "checked against eager and a higher-precision reference at every length."]
    lines += busy_machine_note(info)
    notes = Notes()
    for mode in report["modes"]:
        if mode in report["results"]:
            lines += ["", f"## {MODE_TITLES[mode]}", ""]
            lines += _mode_tables(report, mode, notes)
    lines += notes.lines()
    return "\n".join(lines) + "\n"
