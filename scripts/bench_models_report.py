"""The tables of the model suite (scripts/bench_models.py): speed-ups, geomeans and the
markdown report, from the rows that bench_models.gather_rows makes."""
from __future__ import annotations

from scripts.bench_common import (Notes, busy_machine_note, fmt, fmt_ratio, geomean, inductor_pairs, machine_line,
                                  markdown_table)

GROUP_TITLES = {"main": "Main models", "held-out": "Held-out models (nobody tunes against these)",
                "extra": "Other models"}


# Baseline suffixes (see bench_models.py's docstring): a pair compared through each
# backend's speed-up over the eager step of its own process, and one timed in one process
# (the "together" phase).
OWN_EAGER = " (own eager)"
SAME_PROCESS = " (same process)"


def ratio_pairs(backends: list[str], rows: list[dict] = ()) -> list[tuple[str, str]]:
    """(baseline, backend) pairs: every backend vs eager, tritonfuse vs inductor, and
    tritonfuse vs inductor through each one's speed-up over its own process's eager; and
    timed in one process, where `rows` have the "together" phase."""
    pairs = [("eager", b) for b in backends]
    versus = inductor_pairs(backends)
    pairs += versus + [(base + OWN_EAGER, b) for base, b in versus]
    if any(row.get("together") for row in rows):
        pairs += [(base + SAME_PROCESS, b) for base, b in versus]
    return pairs


def _speedup_over_own_eager(cell: dict) -> float | None:
    return cell["eager_ms"] / cell["ms"] if cell["status"] == "ok" and cell.get("eager_ms") else None


def speedup_rows(rows: list[dict], backends: list[str]) -> list[dict]:
    """Per row {(baseline, backend): baseline_ms / backend_ms} where both ran and matched.
    Against eager the eager time is the one taken in the backend's own process; against
    "inductor (own eager)", the ratio of the two speed-ups over their own eager; against
    "inductor (same process)", the times of the "together" job (where the cold job of
    `backend` matched eager)."""
    out, pairs = [], ratio_pairs(backends, rows)
    for row in rows:
        cells, ratios = row["cells"], {}
        together = row.get("together") or {}
        for base, b in pairs:
            if base.endswith(SAME_PROCESS):
                ms = together.get("ms", {}) if together.get("status") == "ok" else {}
                theirs, ours = ms.get(base[:-len(SAME_PROCESS)]), ms.get(b)
                if theirs and ours and cells[b]["status"] == "ok":
                    ratios[(base, b)] = theirs / ours
                continue
            cell = cells[b]
            if cell["status"] != "ok":
                continue
            if base.endswith(OWN_EAGER):
                ours, theirs = _speedup_over_own_eager(cell), _speedup_over_own_eager(cells[base[:-len(OWN_EAGER)]])
                if ours and theirs:
                    ratios[(base, b)] = ours / theirs
                continue
            base_ms = cell.get("eager_ms") if base == "eager" else (
                cells[base]["ms"] if cells[base]["status"] == "ok" else None)
            if base_ms:
                ratios[(base, b)] = base_ms / cell["ms"]
        out.append(ratios)
    return out


def summarize(rows: list[dict], backends: list[str]) -> dict:
    """Geomeans of every ratio, per group and mode ("main/train", ...) and per group
    ("main/all"); and of tritonfuse's cold first call over Inductor's."""
    summary: dict = {}
    ratios = speedup_rows(rows, backends)
    for group in sorted({r["group"] for r in rows}):
        for mode in sorted({r["mode"] for r in rows}) + ["all"]:
            picked = [(r, x) for r, x in zip(rows, ratios)
                      if r["group"] == group and mode in ("all", r["mode"])]
            entry = {}
            for base, b in ratio_pairs(backends, rows):
                values = [x[(base, b)] for _, x in picked if (base, b) in x]
                entry[f"{b}_vs_{base}"] = {"geomean": geomean(values), "rows": len(values)}
            if "inductor" in backends and "tritonfuse" in backends:
                firsts = [r["cells"]["tritonfuse"]["first_call_cold_s"]
                          / r["cells"]["inductor"]["first_call_cold_s"] for r, _ in picked
                          if r["cells"]["tritonfuse"].get("first_call_cold_s")
                          and r["cells"]["inductor"].get("first_call_cold_s")]
                entry["tritonfuse_over_inductor_first_call_cold"] = {
                    "geomean": geomean(firsts), "rows": len(firsts)}
            summary[f"{group}/{mode}"] = entry
    return summary


def _status_note(notes: Notes, row: dict, backend: str, status: str, message: str) -> str:
    return notes.ref(f"{backend} on {row['model']} {row['mode']}: {status}: {message}")


def _time_cell(notes: Notes, row: dict, backend: str) -> str:
    cell = row["cells"][backend]
    if cell["status"] == "ok":
        return fmt(cell["ms"])
    text = cell["status"] + (f" {fmt(cell['ms'])}" if cell.get("ms") else "")
    return f"{text} {_status_note(notes, row, backend, cell['status'], cell['message'])}"


def _check_cell(notes: Notes, row: dict, backends: list[str]) -> str:
    parts = []
    for b in backends:
        cell = row["cells"][b]
        if cell["status"] == "FAIL":
            what = f"{b} on {row['model']} {row['mode']} is WRONG: {cell['message']}"
            parts.append(f"{b} FAIL {notes.ref(what)}")
        elif cell["status"] == "ok":
            parts.append(f"{b} ok")
        else:
            parts.append(f"{b} -")
    return ", ".join(parts)


def _warm_cell(notes: Notes, row: dict, backend: str) -> str:
    cell = row["cells"][backend]
    status, seconds = cell.get("warm_status"), cell.get("first_call_warm_s")
    if status is None or (status == "ok" and seconds is not None):
        return fmt(seconds, 1)
    note = _status_note(notes, row, f"{backend} (warm)", status, cell.get("warm_message", ""))
    return f"{status} {fmt(seconds, 1) if seconds else ''} {note}".replace("  ", " ")


def short_op_names(ops) -> str:
    """"aten.mm.default, aten.cumsum.default" -> "mm, cumsum"."""
    names = sorted({op.removeprefix("aten.").removesuffix(".default") for op in ops})
    return ", ".join(names) or "-"


def _err(check: dict | None, key: str) -> str:
    if not check or check.get(key) is None:
        return "-"
    return f"{check[key]:.1e} ({check[key + '_eager']:.1e})"


def _group_tables(rows: list[dict], backends: list[str], summary: dict, group: str,
                  notes: Notes) -> list[str]:
    pairs = ratio_pairs(backends, rows)
    ratios = speedup_rows(rows, backends)
    lines = ["### Step time (ms, median)", ""]
    header = (["model", "step", "shape", "eager ms"] + [f"{b} ms" for b in backends]
              + [f"{b} vs {base}" for base, b in pairs] + ["check"])
    table = []
    for row, r in zip(rows, ratios):
        line = [row["model"], row["mode"], row["shape"], fmt(row["eager"]["ms"])]
        line += [_time_cell(notes, row, b) for b in backends]
        line += [fmt_ratio(r.get(pair)) for pair in pairs]
        line.append(_check_cell(notes, row, backends))
        table.append(line)
    modes = sorted({r["mode"] for r in rows})
    for mode in modes + (["all"] if len(modes) > 1 else []):
        entry = summary.get(f"{group}/{mode}", {})
        line = [f"geomean {mode}", "", "", ""] + [""] * len(backends)
        for base, b in pairs:
            s = entry.get(f"{b}_vs_{base}", {})
            line.append(f"{fmt_ratio(s['geomean'])} (n={s['rows']})" if s.get("geomean") else "-")
        table.append(line + [""])
    lines += markdown_table(header, table, align_right_from=3)

    lines += ["", "### First call (s, compile included) and peak memory of a step (MB, GPUs)", ""]
    header = ["model", "step"] + [f"{b} {phase}" for b in backends for phase in ("cold", "warm")]
    if "inductor" in backends and "tritonfuse" in backends:
        header.append("tritonfuse / inductor cold")
    with_memory = any(row["eager"]["peak_mb"] for row in rows)  # measured on GPUs only
    if with_memory:
        header += ["eager MB"] + [f"{b} MB" for b in backends]
    table = []
    for row in rows:
        cells = row["cells"]
        line = [row["model"], row["mode"]]
        for b in backends:
            line.append(fmt(cells[b].get("first_call_cold_s"), 1))
            line.append(_warm_cell(notes, row, b))
        if "inductor" in backends and "tritonfuse" in backends:
            tf, ind = cells["tritonfuse"].get("first_call_cold_s"), cells["inductor"].get("first_call_cold_s")
            line.append(fmt_ratio(tf / ind) if tf and ind else "-")
        if with_memory:
            line.append(fmt(row["eager"]["peak_mb"], 0))
            line += [fmt(cells[b].get("peak_mb"), 0) for b in backends]
        table.append(line)
    lines += markdown_table(header, table, align_right_from=2)

    if "tritonfuse" in backends:
        lines += ["", "### tritonfuse: kernels, fallbacks, graphs", ""]
        header = ["model", "step", "kernels", "eager graphs", "Dynamo graphs (breaks)",
                  "warm: graphs from cache", "fallback ops"]
        table = []
        for row in rows:
            cell = row["cells"]["tritonfuse"]
            m, warm, dyn = cell.get("tritonfuse") or {}, cell.get("tritonfuse_warm") or {}, cell.get("dynamo") or {}
            table.append([row["model"], row["mode"], str(m.get("generated_kernel_count", "-")),
                          str(m.get("eager_graphs", "-")),
                          f"{dyn['graphs']} ({dyn['graph_breaks']})" if dyn else "-",
                          str(warm.get("graph_cache_hits", "-")),
                          short_op_names(m.get("fallbacks", {}))])
        lines += markdown_table(header, table, align_right_from=2)
        reasons = [(row["model"], row["mode"], graph, why) for row in rows
                   for graph, why in ((row["cells"]["tritonfuse"].get("tritonfuse") or {})
                                      .get("eager_graph_reasons", {}).items())]
        if reasons:
            lines += ["", "Graphs tritonfuse ran eagerly, and why:", ""]
            lines += [f"- {model} {mode}, {graph}: {why}" for model, mode, graph, why in reasons]

    lines += ["", "### Accuracy: relative L2 error vs the higher-precision reference "
              "(eager's own in parentheses)", ""]
    header = ["model", "step"] + [f"{b} {q}" for b in backends for q in ("output", "worst grad")]
    table = [[row["model"], row["mode"]] + [_err(row["cells"][b].get("check"), q)
                                            for b in backends for q in ("output_err", "grad_err")]
             for row in rows]
    lines += markdown_table(header, table, align_right_from=2)
    return lines


def _run_limit(report: dict) -> str:
    limit = report.get("time_limit_s")
    return f", run limit {limit:.0f} s" if limit else ""


def render_markdown(report: dict) -> str:
    rows, backends = report["rows"], report["backends"]
    info = report["machine"]
    lines = [f"# Model benchmark: eager, {', '.join(backends)} on {info['device_name']}", "",
             machine_line(info, report["timing"]), "",
             f"{report['dtype'].replace('torch.', '')}, random weights, dropout 0; modes: "
             f"{', '.join(report['modes'])}; phases: {', '.join(report['phases'])}; worker limit "
             f"{report['timeout_s']:.0f} s{_run_limit(report)}; run took {report['wall_s']:.0f} s. "
             "Each (model, step, "
             "backend) ran in a fresh process with empty caches (cold), then in another that "
             "found those caches (warm). \"X vs eager\" = eager_ms / X_ms with eager timed in "
             "X's process, interleaved with it; \"tritonfuse vs inductor\" = inductor_ms / "
             "tritonfuse_ms; \"(own eager)\": the ratio of their speed-ups over the eager of "
             "their own processes; \"(same process)\": both timed interleaved in one more "
             "process (phase together); above 1: faster. A check FAILs when an output's or a "
             "gradient's error exceeds 3x eager's own (and the dtype's rounding floor)."]
    lines += busy_machine_note(info)
    if report.get("unfinished_models"):
        lines += ["", f"**Not all run:** the run's time limit skipped or cut short jobs of "
                  f"{', '.join(report['unfinished_models'])}; run them with `--models "
                  f"{','.join(report['unfinished_models'])}`."]
    notes = Notes()
    for group in GROUP_TITLES:
        picked = [r for r in rows if r["group"] == group]
        if picked:
            lines += ["", f"## {GROUP_TITLES[group]}", ""]
            lines += _group_tables(picked, backends, report["summary"], group, notes)
    lines += notes.lines()
    return "\n".join(lines) + "\n"
