"""The tables of the dynamic-shape suite (scripts/bench_dynamic.py)."""
from __future__ import annotations

from scripts.bench_common import Notes, busy_machine_note, fmt, fmt_ratio, geomean, machine_line, markdown_table

MODE_TITLES = {"infer": "Inference", "train": "Training step (forward, loss, backward)"}
COUNTER_COLUMNS = (("symbolic_graphs", "symbolic graphs"),
                   ("static_specializations", "static specializations"),
                   ("eager_graphs", "eager graphs"), ("cpp_builds", "C++ builds"))


def _steady(res: dict) -> dict[int, float]:
    return {e["length"]: e["ms"] for e in res["values"].get("second_pass", [])}


def _ratio_over_lengths(slower: dict[int, float], faster: dict[int, float]) -> float | None:
    """Geomean over the lengths both have of slower_ms / faster_ms."""
    return geomean([slower[n] / faster[n] for n in slower if n in faster and faster[n]])


def summarize(report: dict) -> dict:
    """Per mode and backend: status (ok | FAIL | the worker's), first calls, first-pass
    seconds, steady geomean ms and ratios, tritonfuse's counters after the first pass."""
    summary: dict = {}
    for mode, per_backend in report["results"].items():
        summary[mode] = {}
        eager = per_backend.get("eager")
        for backend, res in per_backend.items():
            first = res["values"].get("first_pass", [])
            steady = _steady(res)
            wrong = [e["length"] for e in first if e.get("check") and not e["check"]["ok"]]
            status = res["status"]
            if status == "ok" and len(steady) < len(report["lengths"]):
                status = "error"
            if wrong and status in ("ok", "timeout"):
                status = "FAIL" if status == "ok" else status
            entry = {
                "status": status, "message": res["message"], "wrong_lengths": wrong,
                "first_calls_s": [e["first_call_s"] for e in first],
                "first_pass_s": sum(e["first_call_s"] for e in first) if first else None,
                "lengths_done": len(first),
                "steady_geomean_ms": geomean(list(steady.values())),
                "vs_eager": (_ratio_over_lengths(_steady(eager), steady)
                             if eager and backend != "eager" and not wrong else None),
                "counters": (first[-1].get("tritonfuse") if first else None),
                "dynamo": res["values"].get("dynamo"),
            }
            summary[mode][backend] = entry
        if "inductor" in per_backend and "tritonfuse" in per_backend:
            ok = all(summary[mode][b]["status"] == "ok" for b in ("inductor", "tritonfuse"))
            summary[mode]["tritonfuse"]["vs_inductor"] = (
                _ratio_over_lengths(_steady(per_backend["inductor"]), _steady(per_backend["tritonfuse"]))
                if ok else None)
    return summary


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


def _mode_tables(report: dict, mode: str, notes: Notes) -> list[str]:
    per_backend, summary = report["results"][mode], report["summary"][mode]
    backends = list(per_backend)
    lengths = report["lengths"]
    header = ["backend", "first call per length (s)", "first pass s",
              "second pass: geomean step ms", "vs eager", "tritonfuse vs inductor",
              "Dynamo graphs"] + [title for _, title in COUNTER_COLUMNS] + ["check"]
    rows = []
    for b in backends:
        s = summary[b]
        counters = s["counters"] or {}
        dyn = s["dynamo"] or {}
        status = s["status"]
        if status == "ok":
            check = "ok" if b != "eager" else "reference"
        elif status == "FAIL":
            check = "FAIL " + notes.ref(f"{b} {mode} is WRONG at lengths {s['wrong_lengths']}")
        else:
            check = f"{status} " + notes.ref(
                f"{b} {mode}: {status} after {s['lengths_done']} of {len(lengths)} lengths: {s['message']}")
        first_pass = fmt(s["first_pass_s"], 1)
        if s["lengths_done"] < len(lengths):
            first_pass = f">= {first_pass} ({s['lengths_done']} lengths)"
        rows.append([b, first_calls_text(s["first_calls_s"]), first_pass,
                     fmt(s["steady_geomean_ms"]), fmt_ratio(s.get("vs_eager")),
                     fmt_ratio(s.get("vs_inductor")), str(dyn.get("graphs", "-"))]
                    + [str(counters.get(k, "-")) if counters.get(k) is not None else "-"
                       for k, _ in COUNTER_COLUMNS] + [check])
    lines = markdown_table(header, rows, align_right_from=2)

    lines += ["", "Per length: first call (s) / second-pass step (ms)"
              + ("; tritonfuse's C++ builds, static specializations and eager graphs so far"
                 if "tritonfuse" in per_backend else ""), ""]
    header = ["length"] + [f"{b} first s" for b in backends] + [f"{b} ms" for b in backends]
    tf_first = {e["length"]: e for e in per_backend.get("tritonfuse", {}).get("values", {}).get("first_pass", [])}
    if tf_first:
        header += ["tf C++ builds", "tf static specs", "tf eager graphs"]
    rows = []
    for n in lengths:
        row = [str(n)]
        for b in backends:
            first = {e["length"]: e for e in per_backend[b]["values"].get("first_pass", [])}
            entry = first.get(n)
            text = fmt(entry["first_call_s"], 2) if entry else "-"
            if entry and entry.get("check") and not entry["check"]["ok"]:
                text += " WRONG"
            row.append(text)
        for b in backends:
            row.append(fmt(_steady(per_backend[b]).get(n)))
        if tf_first:
            c = (tf_first.get(n) or {}).get("tritonfuse") or {}
            row += [str(c.get(k)) if c.get(k) is not None else "-"
                    for k in ("cpp_builds", "static_specializations", "eager_graphs")]
        rows.append(row)
    lines += markdown_table(header, rows, align_right_from=1)
    return lines


def render_markdown(report: dict) -> str:
    info = report["machine"]
    lengths = report["lengths"]
    lines = [f"# Dynamic shapes: {', '.join(report['backends'])} on {info['device_name']}", "",
             machine_line(info, report["timing"]), "",
             f"{report['model']}, {report['dtype'].replace('torch.', '')}, batch {report['batch']}, "
             f"{len(lengths)} sequence lengths {lengths[0]}..{lengths[-1]} in order; each "
             f"(step, backend) in one fresh process with empty caches, limit {report['timeout_s']:.0f} s; "
             f"run took {report['wall_s']:.0f} s. First pass: each length's first call (compiles "
             "included). Second pass: the median step time per length; \"vs eager\" and "
             "\"tritonfuse vs inductor\" are geomeans over the lengths of the per-length ratios "
             "(above 1: faster). Each compiled result is checked against eager and a "
             "higher-precision reference at every length."]
    lines += busy_machine_note(info)
    notes = Notes()
    for mode in report["modes"]:
        if mode in report["results"]:
            lines += ["", f"## {MODE_TITLES[mode]}", ""]
            lines += _mode_tables(report, mode, notes)
    lines += notes.lines()
    return "\n".join(lines) + "\n"
