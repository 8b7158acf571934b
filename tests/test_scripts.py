"""Tests of scripts/: the workload table, bench.py end to end, and the demo.

They run on the CPU with eager (and Dynamo's "eager" backend), so they pass before the
compiler exists; the tritonfuse demo test is skipped while `tritonfuse.backend` cannot be
imported. No test asserts a timing.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts import bench  # noqa: E402
from scripts.models import (WORKLOADS, TransformerBlock, make_block,  # noqa: E402
                            make_block_inputs, select_workloads, tensor_bytes)

SUBPROCESS_TIMEOUT_S = 300


def _run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S)


# ----------------------------------------------------------------------------------------
# scripts/models.py
# ----------------------------------------------------------------------------------------

EXPECTED_WORKLOADS = {
    "pointwise_f32", "pointwise_bf16", "softmax_bf16", "softmax_long_f32", "x_sub_softmax",
    "layer_norm", "rms_norm", "sigmoid_sum_dim1", "column_sum", "transpose_add",
    "cross_entropy", "var_mean", "transformer_block",
    *(f"{gemm}_{shape}" for gemm in ("mm_bias_gelu", "mm_residual", "mm_to_bf16") for shape in ("4k", "8kx1k")),
}


def _expected_shapes(name: str, inputs: tuple) -> list[tuple]:
    """The output shapes each workload must produce, from its inputs."""
    x = inputs[0]
    if name == "sigmoid_sum_dim1":
        return [(x.shape[0], x.shape[2])]
    if name == "column_sum":
        return [(x.shape[1],)]
    if name == "transpose_add":
        return [tuple(inputs[1].shape)]
    if name == "cross_entropy":
        return [()]
    if name == "var_mean":
        return [tuple(x.shape[:-1])] * 2
    if name == "transformer_block":
        return [tuple(inputs[1].shape)]
    if name.startswith("mm_"):
        return [(x.shape[0], inputs[1].shape[1])]
    return [tuple(x.shape)]


def test_workload_table_is_complete():
    names = [w.name for w in WORKLOADS]
    assert len(names) == len(set(names)), "workload names must be unique"
    assert set(names) == EXPECTED_WORKLOADS
    for w in WORKLOADS:
        atol, rtol = w.tolerance
        assert 0 < atol < 1 and 0 < rtol < 1, w.name
    assert [w.name for w in select_workloads("softmax")] == [
        "softmax_bf16", "softmax_long_f32", "x_sub_softmax"]
    assert len(select_workloads("norm,column")) == 3
    assert select_workloads(None) == WORKLOADS


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_workload_runs_in_eager_on_cpu(workload):
    inputs = workload.make_inputs("cpu")
    assert isinstance(inputs, tuple) and inputs
    with torch.no_grad():
        out = workload.fn(*inputs)
    outs = list(out) if isinstance(out, tuple) else [out]
    assert [tuple(o.shape) for o in outs] == _expected_shapes(workload.name, inputs)
    for o in outs:
        assert o.device.type == "cpu"
        assert torch.isfinite(o.float()).all(), workload.name
    first = next(t for t in inputs if isinstance(t, torch.Tensor))
    if workload.name != "cross_entropy":
        assert outs[0].dtype == first.dtype
    # Inputs are read and outputs written at least once; the CPU sizes stay small.
    ideal = workload.ideal_bytes(inputs, out)
    assert ideal == tensor_bytes(inputs) + tensor_bytes(out)
    assert 0 < ideal < 64 * 2**20
    # Same seed, same data: every backend sees the same inputs.
    again = workload.make_inputs("cpu")
    for a, b in zip(inputs, again):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_workload_semantics():
    by_name = {w.name: w for w in WORKLOADS}
    (x,) = by_name["softmax_long_f32"].make_inputs("cpu")
    assert x.shape[-1] >= 16384
    probs = by_name["softmax_long_f32"].fn(x)
    torch.testing.assert_close(probs.sum(-1), torch.ones(x.shape[0]))
    x, w, b = by_name["layer_norm"].make_inputs("cpu")
    y = (by_name["layer_norm"].fn(x, w, b) - b) / w
    torch.testing.assert_close(y.mean(-1), torch.zeros(x.shape[0]), atol=1e-5, rtol=0)
    logits, target = by_name["cross_entropy"].make_inputs("cpu")
    assert target.dtype == torch.int64 and 1024 <= logits.shape[1] <= 32768
    assert int(target.max()) < logits.shape[1]


def test_transformer_block_forward_backward():
    block = make_block(dim=32, heads=4, device="cpu", seed=3)
    same = make_block(dim=32, heads=4, device="cpu", seed=3)
    for p, q in zip(block.parameters(), same.parameters()):
        assert torch.equal(p, q)
    x = make_block_inputs(2, 8, 32, "cpu", seed=1, requires_grad=True)
    assert x.requires_grad and x.shape == (2, 8, 32) and x.dtype == torch.float32
    out = block(x)
    assert out.shape == x.shape
    out.float().pow(2).mean().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert all(p.grad is not None for p in block.parameters())
    assert isinstance(block.act, torch.nn.GELU) and block.act.approximate == "none"
    with pytest.raises(ValueError):
        TransformerBlock(dim=30, heads=4)


# ----------------------------------------------------------------------------------------
# scripts/bench.py
# ----------------------------------------------------------------------------------------


def test_bench_end_to_end_eager(tmp_path):
    out = tmp_path / "bench"
    proc = _run_script("scripts/bench.py", "--device", "cpu", "--backends", "eager",
                       "--workloads", "pointwise_f32,column_sum", "--repeat", "3",
                       "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    report = json.loads((out / "bench.json").read_text())
    machine = report["machine"]
    for key in ("device_name", "torch", "triton", "cpu_count", "torch_threads", "timestamp"):
        assert key in machine
    assert machine["torch"] == torch.__version__
    assert report["device"] == "cpu" and report["backends"] == ["eager"]
    assert [r["workload"] for r in report["results"]] == ["pointwise_f32", "column_sum"]
    for res in report["results"]:
        cell = res["cells"]["eager"]
        assert cell["status"] == "ok"
        assert cell["ms"] > 0 and cell["gbps"] > 0
        assert math.isclose(cell["gbps"], res["ideal_bytes"] / (cell["ms"] * 1e-3) / 1e9)
    assert report["summary"] == {}

    md = (out / "bench.md").read_text()
    assert "| workload" in md and "pointwise_f32" in md and "column_sum" in md
    assert "eager ms" in md and torch.__version__ in md
    assert "pointwise_f32" in proc.stdout  # the table is printed too
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib" in proc.stdout
    else:
        assert (out / "bench.png").stat().st_size > 1000


def _wrong_backend(gm, example_inputs):
    """A backend that compiles fine and returns results off by one."""
    def run(*args):
        return tuple(o + 1 if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                     for o in gm(*args))
    return run


def test_bench_reports_wrong_results_and_errors(tmp_path):
    if "wrong_for_test" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_wrong_backend, name="wrong_for_test")
    out = tmp_path / "bench"
    rc = bench.main(["--device", "cpu", "--backends", "eager,wrong_for_test,no_such_backend",
                     "--workloads", "column_sum", "--repeat", "2", "--out", str(out)])
    assert rc == 1
    report = json.loads((out / "bench.json").read_text())
    cells = report["results"][0]["cells"]
    assert cells["wrong_for_test"]["status"] == "FAIL"
    assert cells["wrong_for_test"]["max_abs_err"] == pytest.approx(1.0, abs=1e-3)
    assert cells["no_such_backend"]["status"] == "error"
    assert "no_such_backend" in cells["no_such_backend"]["message"]
    assert report["summary"]["wrong_for_test_vs_eager"]["workloads"] == 0
    md = (out / "bench.md").read_text()
    assert "wrong_for_test FAIL" in md and "WRONG" in md and "error [" in md


def test_bench_max_autotune_backends(tmp_path):
    """"<backend>-max-autotune" compiles with mode="max-autotune" (on the CPU the C++
    backend keeps the matmul on aten); both modes get their tritonfuse-vs-inductor ratios."""
    from scripts import bench_common
    assert bench_common.split_backend("inductor-max-autotune") == ("inductor", "max-autotune")
    assert bench_common.split_backend("tritonfuse") == ("tritonfuse", None)
    resolved = bench_common.resolve_backend("tritonfuse-max-autotune")
    assert resolved.keywords == {"mode": "max-autotune"}
    assert bench_common.resolve_backend("inductor-max-autotune").keywords["config_patches"]["max_autotune"]
    assert bench.ratio_columns(["eager", "inductor", "inductor-max-autotune", "tritonfuse-max-autotune"]) == [
        ("eager", "inductor"), ("eager", "inductor-max-autotune"), ("eager", "tritonfuse-max-autotune"),
        ("inductor-max-autotune", "tritonfuse-max-autotune"), ("inductor", "tritonfuse-max-autotune")]
    out = tmp_path / "bench"
    rc = bench.main(["--device", "cpu", "--backends", "eager,tritonfuse-max-autotune", "--workloads",
                     "mm_residual_4k", "--repeat", "2", "--out", str(out)])
    assert rc == 0
    cell = json.loads((out / "bench.json").read_text())["results"][0]["cells"]["tritonfuse-max-autotune"]
    assert cell["status"] == "ok" and "aten.mm.default" in cell["metrics"]["fallbacks"]


def test_tritonfuse_backend_unavailable_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "tritonfuse.backend", None)  # makes the import fail
    with pytest.raises(bench.BackendUnavailable, match="tritonfuse.backend"):
        bench.resolve_backend("tritonfuse")
    assert bench.resolve_backend("inductor") == "inductor"


# ----------------------------------------------------------------------------------------
# scripts/demo.py
# ----------------------------------------------------------------------------------------

TINY_DEMO = ("--batch", "2", "--seq", "16", "--dim", "32", "--heads", "2", "--steps", "3")
DEMO_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_demo_checks_and_reports_with_dynamo_eager_backend():
    proc = _run_script("scripts/demo.py", "--device", "cpu", "--backend", "eager", *TINY_DEMO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for text in ("Correctness vs eager", "grad fc2.bias", "Speed", "PASS"):
        assert text in proc.stdout


@pytest.mark.parametrize("device", DEMO_DEVICES)
def test_demo_tritonfuse(device):
    proc = _run_script("scripts/demo.py", "--device", device, "--no-graph-cache", *TINY_DEMO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout
    assert "Kernels generated" in proc.stdout and "Fallbacks" in proc.stdout


# ----------------------------------------------------------------------------------------
# bench.py --suite models and --suite dynamic (worker processes; tiny CPU sizes)
# ----------------------------------------------------------------------------------------

# nn-lm is the zoo's plain torch.nn language model: it needs no transformers.
SUITE_ARGS = ("--device", "cpu", "--threads", "1", "--repeat", "3")
CRASH, HANG = "tests.script_backends:crash", "tests.script_backends:hang"


def _run_suite(tmp_path, suite: str, returncode: int, *args: str) -> tuple[dict, str, str]:
    """Run ``bench.py --suite <suite>`` on the CPU; check its exit status; return its
    report (JSON), its markdown and what it printed."""
    out = tmp_path / suite
    proc = _run_script("scripts/bench.py", "--suite", suite, *args, *SUITE_ARGS, "--out", str(out))
    assert proc.returncode == returncode, proc.stdout + proc.stderr
    return (json.loads((out / f"{suite}.json").read_text()), (out / f"{suite}.md").read_text(),
            proc.stdout)


def test_models_suite_tritonfuse_cold_and_warm(tmp_path):
    report, md, _ = _run_suite(tmp_path, "models", 0, "--models", "nn-lm", "--modes", "train",
                               "--backends", "tritonfuse")
    assert report["backends"] == ["tritonfuse"] and report["unfinished_models"] == []
    (row,) = report["rows"]
    assert (row["model"], row["group"], row["mode"]) == ("nn-lm", "extra", "train")
    cell = row["cells"]["tritonfuse"]
    assert cell["status"] == "ok" and cell["warm_status"] == "ok", cell["message"]
    assert cell["check"]["ok"] and cell["warm_check"]["ok"]
    assert cell["check"]["grad_err"] is not None  # gradients were compared too
    assert cell["ms"] > 0 and cell["eager_ms"] > 0
    assert cell["first_call_cold_s"] > 0 and cell["first_call_warm_s"] > 0
    metrics = cell["tritonfuse"]
    assert metrics["generated_kernel_count"] > 0 and metrics["eager_graphs"] == 0
    assert cell["tritonfuse_warm"]["graph_cache_hits"] > 0  # the warm run found the graphs
    assert cell["dynamo"]["graphs"] >= 1
    assert "## Other models" in md and "| nn-lm" in md and "tritonfuse warm" in md


def test_models_suite_reports_crashes_and_timeouts_and_goes_on(tmp_path):
    # --timeout counts from the worker's go: model, reference, eager step and Dynamo's trace
    # come before the backend crashes, which takes well over 10 s on a busy 2-core machine.
    report, md, printed = _run_suite(tmp_path, "models", 1, "--models", "nn-lm", "--modes", "infer",
                                     "--backends", f"{CRASH},{HANG}", "--timeout", "40")
    cells = report["rows"][0]["cells"]
    assert cells[CRASH]["status"] == "crashed"
    assert "SIGABRT" in cells[CRASH]["message"]
    assert cells[HANG]["status"] == "timeout" and "--timeout" in cells[HANG]["message"]
    for backend in (CRASH, HANG):  # a warm run needs its cold run's caches
        assert cells[backend]["warm_status"] == "skipped"
        assert "did not finish" in cells[backend]["warm_message"]
    assert report["unfinished_models"] == []  # nothing was cut by the run's time limit
    assert "crashed [" in md and "timeout [" in md and "SIGABRT" in md
    assert "NOT CLEAN" in printed


def test_models_suite_time_limit_skips_what_does_not_fit(tmp_path):
    report, md, printed = _run_suite(tmp_path, "models", 1, "--models", "resnet,nn-lm",
                                     "--backends", "tritonfuse", "--time-limit", "1")
    assert report["time_limit_s"] == 1
    assert [(r["model"], r["mode"]) for r in report["rows"]] == [
        ("resnet", "train"), ("resnet", "infer"), ("nn-lm", "train"), ("nn-lm", "infer")]
    for row in report["rows"]:
        cell = row["cells"]["tritonfuse"]
        assert cell["status"] == "skipped" and cell["out_of_time"]
        assert cell["warm_status"] == "skipped"
    assert report["unfinished_models"] == ["resnet", "nn-lm"]
    assert "--models resnet,nn-lm" in printed and "--models resnet,nn-lm" in md


def test_models_suite_plans_model_after_model():
    from scripts import bench_models, model_zoo
    from scripts.bench_runner import RunSettings

    args = bench_models.parse_args(["--device", "cpu", "--backends", "inductor,tritonfuse",
                                    "--cache-root", "/nonexistent"])
    run = RunSettings.from_args(args, 0.0, bench_models.REPEAT, bench_models.TIMEOUT_S,
                                bench_models.TIME_LIMIT_S)
    models = model_zoo.select_models("resnet,nn-lm")
    jobs = bench_models.plan_jobs(models, ["train"], ["cold", "warm"], run)
    assert [j.key for j in jobs] == [
        "resnet/train/inductor/cold", "resnet/train/tritonfuse/cold",
        "resnet/train/inductor/warm", "resnet/train/tritonfuse/warm",
        "nn-lm/train/inductor/cold", "nn-lm/train/tritonfuse/cold",
        "nn-lm/train/inductor/warm", "nn-lm/train/tritonfuse/warm"]
    warm = jobs[3]
    assert warm.after == "resnet/train/tritonfuse/cold" and warm.cache_dir == jobs[1].cache_dir
    assert all(j.after is None for j in jobs if j.params["phase"] == "cold")


def test_dynamic_suite_one_symbolic_compile_serves_every_length(tmp_path):
    lengths = [8, 11, 16]
    report, md, _ = _run_suite(tmp_path, "dynamic", 0, "--model", "nn-lm", "--modes", "infer",
                               "--backends", "tritonfuse", "--batch", "2",
                               "--lengths", ",".join(map(str, lengths)))
    assert report["dynamic"] == "true" and report["backends"] == ["eager", "tritonfuse"]
    summary = report["summary"]["infer"]
    assert summary["eager"]["status"] == "ok" and summary["tritonfuse"]["status"] == "ok"
    tf = summary["tritonfuse"]
    assert tf["lengths_done"] == len(lengths) and tf["wrong_lengths"] == []
    assert tf["first_pass_s"] > 0 and 0 <= tf["compile_s"] <= tf["first_pass_s"]
    assert tf["steady_geomean_ms"] > 0 and tf["vs_eager"] > 0
    # dynamic=True: one graph, compiled once with symbolic sizes, serves every length.
    assert tf["dynamo"]["graphs"] == 1 and tf["dynamo"]["recompiles"] == 0
    assert tf["counters"]["symbolic_graphs"] == 1 and tf["counters"]["eager_graphs"] == 0
    assert tf["counters"]["static_specializations"] == 0
    first_pass = report["results"]["infer"]["tritonfuse"]["values"]["first_pass"]
    assert [e["length"] for e in first_pass] == lengths
    assert all(e["check"]["ok"] for e in first_pass)
    builds = [e["tritonfuse"]["cpp_builds"] for e in first_pass]
    assert builds[0] > 0 and builds == [builds[0]] * len(lengths)  # no build after the first
    assert "torch.compile(dynamic=True)" in md and "compile s" in md and "recompiles" in md


def test_dynamic_suite_together_times_every_length_in_one_process(tmp_path):
    lengths = [8, 13]
    report, md, _ = _run_suite(tmp_path, "dynamic", 0, "--model", "nn-lm", "--modes", "infer",
                               "--backends", "tritonfuse", "--batch", "2", "--together",
                               "--lengths", ",".join(map(str, lengths)))
    together = report["summary"]["infer"]["together"]
    assert together["status"] == "ok", together
    assert [e["length"] for e in together["per_length"]] == lengths
    assert all(e["ms"]["eager"] > 0 and e["ms"]["tritonfuse"] > 0 and not e["errors"]
               for e in together["per_length"])
    assert together["first_pass_s"]["tritonfuse"] > 0
    assert "together" not in report["summary"]["infer"]["tritonfuse"]   # its own entry, not a backend's
    assert "Same process" in md and "| 13 " in md


def test_dynamic_report_together_ratios():
    from scripts.bench_dynamic_report import _summarize_together
    rows = [{"length": 8, "ms": {"eager": 3.0, "inductor": 2.0, "tritonfuse": 1.0}, "errors": {}},
            {"length": 16, "ms": {"eager": 3.0, "inductor": 2.0, "tritonfuse": 2.5}, "errors": {}}]
    res = {"status": "ok", "message": "", "values": {"interleaved": rows, "first_pass": {
        "inductor": [{"length": 8, "first_call_s": 4.0}, {"length": 16, "first_call_s": 1.0}]}}}
    s = _summarize_together(res, [8, 16])
    assert s["ratios"] == {8: 2.0, 16: 0.8} and s["worst"] == (16, 0.8)
    assert abs(s["vs_inductor"] - (2.0 * 0.8) ** 0.5) < 1e-12
    assert s["first_pass_s"] == {"inductor": 5.0}
    assert _summarize_together(res, [8, 16, 24])["status"] == "error"   # a length missing


# ----------------------------------------------------------------------------------------
# bench.py --sweep (scripts/bench_sweep.py): the machinery on a tiny grid
# ----------------------------------------------------------------------------------------


def test_sweep_checks_every_cell_against_eager(tmp_path):
    """Two workloads x two dtypes x both layouts at 33 x 65, with Dynamo's eager backend
    (every cell must match) and the off-by-one backend (every cell must be FAIL)."""
    from scripts import bench_sweep

    if "wrong_for_test" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_wrong_backend, name="wrong_for_test")
    out = tmp_path / "sweep"
    rc = bench.main(["--sweep", "--sweep-shapes", "33x65", "--sweep-workloads", "gelu_mul,layer_norm",
                     "--sweep-dtypes", "f32,bf16", "--backends", "eager,wrong_for_test",
                     "--repeat", "2", "--out", str(out)])
    assert rc == 1   # the wrong backend's cells are FAIL
    report = json.loads((out / "sweep.json").read_text())
    results = report["results"]
    cells = {(r["workload"], r["dtype"], r["layout"], r["set"]) for r in results}
    assert len(results) == len(cells) == 2 * 2 * 2 * 2   # tuned and held-out sets
    for res in results:
        assert res["shape"] == [33, 65]
        assert res["cells"]["eager"]["status"] == "ok" and res["cells"]["eager"]["ms"] > 0
        wrong = res["cells"]["wrong_for_test"]
        assert wrong["status"] == "FAIL" and wrong["max_abs_err"] == pytest.approx(1.0, abs=0.02)
    assert {r["layout"] for r in results} == {"contiguous", "transposed"}
    md = (out / "sweep.md").read_text()
    assert "worst cell per workload" in md and "FAIL" in md


def test_sweep_grid_and_inputs():
    from scripts import bench_sweep

    cells = bench_sweep.plan_cells()
    shapes = {(c.rows, c.cols) for c in cells}
    assert (64, 64) in shapes and (16384, 16384) in shapes and (513, 1531) in shapes and (777, 3001) in shapes
    assert {c.dtype for c in cells} == {"f32", "bf16", "f16"}
    assert {c.set for c in cells} == {"tuned", "heldout"}
    issue = {"gelu_mul", "layer_norm", "rms_norm_f32_math", "transpose_add"}
    assert issue <= {c.workload.name for c in cells if c.set == "tuned"}
    held = {w.name for w in bench_sweep.HELDOUT_WORKLOADS}
    assert not held & {c.workload.name for c in cells if c.set == "tuned"}
    # a transposed cell's matrices are transposed views; dtypes as asked
    spec = bench_sweep.CellSpec(bench_sweep.TUNED_WORKLOADS[1], 5, 7, "bf16", "transposed", "tuned")
    x, w, b = spec.as_workload().make_inputs("cpu")
    assert x.shape == (5, 7) and x.stride() == (1, 5) and x.dtype == w.dtype == torch.bfloat16
    assert w.shape == b.shape == (7,)


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            pass
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find the worker")
def test_a_worker_does_not_outlive_a_killed_run(tmp_path):
    """A worker runs in its own session (a kill takes its compile workers too); when the run
    itself is killed (SIGKILL: nothing of it runs again) its hanging worker exits by itself."""
    import os
    import signal
    import time
    root = tmp_path / "root"
    run = subprocess.Popen([sys.executable, "scripts/bench.py", "--suite", "models", "--models", "nn-lm",
                            "--modes", "infer", "--backends", HANG, *SUITE_ARGS, "--timeout", "600",
                            "--cache-root", str(root), "--out", str(tmp_path / "out")],
                           cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        workers = []
        while not workers and time.monotonic() < deadline:
            time.sleep(0.5)
            workers = [p for p in _processes_mentioning(str(root)) if p != run.pid]
        assert workers, "the run started no worker"
        run.send_signal(signal.SIGKILL)
        run.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and
                                                   "Z" not in _state(p) for p in workers):
            time.sleep(0.5)
        alive = [p for p in workers if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
        for p in alive:
            os.kill(p, signal.SIGKILL)
        assert not alive, "a worker outlived its killed run"
    finally:
        if run.poll() is None:
            run.kill()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


# ----------------------------------------------------------------------------------------
# scripts/memory_report.py
# ----------------------------------------------------------------------------------------


def test_memory_report_allocation_timeline_on_a_hand_computed_case():
    """4 MiB tensors: y and z live together (8 MiB), then y dies and w joins z (8 MiB)."""
    from torch.autograd.profiler import profile
    from scripts.memory_report import allocation_timeline
    x = torch.randn(1024, 1024)

    def f():
        y = x * 2
        z = y + 1
        del y
        return z * z
    with profile(profile_memory=True, use_kineto=True) as prof:
        out = f()
    peak, end, graphs = allocation_timeline(prof, torch.autograd.DeviceType.CPU)
    assert 8 * 2 ** 20 <= peak < 8 * 2 ** 20 + 4096 and end >= out.nbytes and graphs == []


def test_memory_report_nn_lm_training_step():
    from scripts import memory_report
    rows = memory_report.main(["nn-lm", "--backends", "eager,tritonfuse", "--device", "cpu", "--dtype", "f32"])
    eager, compiled = rows
    assert eager["saved_bytes"] == 0 and eager["peak"] > 0
    assert compiled["graphs"] == ["forward", "backward"]
    assert compiled["saved_bytes"] > 0
    assert [g.name for g in compiled["graph_peaks"]] == ["graph", "graphBackward"]
    assert 0 < compiled["peak"] <= eager["peak"]


def test_models_report_compares_backends_directly_and_through_their_own_eager():
    """tritonfuse vs Inductor twice: step against step across processes, and speed-up over
    the eager step of its own process against Inductor's (the host's speed varies between
    processes on a shared VM; each process's eager measures its host)."""
    from scripts.bench_models_report import OWN_EAGER, speedup_rows, summarize

    def cell(eager_ms, ms, status="ok"):
        return {"status": status, "ms": ms, "eager_ms": eager_ms}

    rows = [{"group": "main", "mode": "infer", "model": "a",
             "cells": {"inductor": cell(2.0, 0.8), "tritonfuse": cell(3.0, 1.0)}},
            {"group": "main", "mode": "infer", "model": "b",
             "cells": {"inductor": cell(2.0, 1.0, status="FAIL"), "tritonfuse": cell(2.0, 1.0)}}]
    backends = ["inductor", "tritonfuse"]
    first, second = speedup_rows(rows, backends)
    assert first[("inductor", "tritonfuse")] == pytest.approx(0.8)
    assert first[("inductor" + OWN_EAGER, "tritonfuse")] == pytest.approx((3.0 / 1.0) / (2.0 / 0.8))
    assert ("inductor", "tritonfuse") not in second and ("inductor" + OWN_EAGER, "tritonfuse") not in second
    summary = summarize(rows, backends)["main/infer"]
    assert summary["tritonfuse_vs_inductor" + OWN_EAGER] == {"geomean": pytest.approx(1.2), "rows": 1}


def test_models_suite_plans_a_together_job_on_the_cold_jobs_caches():
    """--phases cold,together: after a model's cold jobs, one job per step times every
    backend in one process, from the caches each backend's cold job filled."""
    from scripts import bench_models, model_zoo
    from scripts.bench_runner import RunSettings, worker_env

    args = bench_models.parse_args(["--device", "cpu", "--backends", "inductor,tritonfuse",
                                    "--phases", "cold,together", "--cache-root", "/nonexistent"])
    run = RunSettings.from_args(args, 0.0, bench_models.REPEAT, bench_models.TIMEOUT_S,
                                bench_models.TIME_LIMIT_S)
    jobs = bench_models.plan_jobs(model_zoo.select_models("nn-lm"), ["infer"], ["cold", "together"], run)
    assert [j.key for j in jobs] == ["nn-lm/infer/inductor/cold", "nn-lm/infer/tritonfuse/cold",
                                     "nn-lm/infer/together"]
    inductor, ours, together = jobs
    assert together.after == (inductor.key, ours.key)
    assert together.params["backends"] == ["inductor", "tritonfuse"]
    env = worker_env(together.cache_dir, "cpu", together.cache_dirs)
    assert env["TRITONFUSE_CACHE_DIR"] == str(ours.cache_dir / "tritonfuse")
    assert env["TRITONFUSE_AUTOTUNE_CACHE_DIR"] == str(ours.cache_dir / "autotune")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(inductor.cache_dir / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(inductor.cache_dir / "triton")


def test_models_report_takes_the_together_jobs_times_as_the_same_process_ratio():
    from scripts.bench_models_report import SAME_PROCESS, speedup_rows

    ok = {"status": "ok", "ms": 1.0, "eager_ms": 2.0}
    row = {"group": "main", "mode": "infer", "model": "a", "cells": {"inductor": dict(ok), "tritonfuse": dict(ok)},
           "together": {"status": "ok", "ms": {"eager": 2.0, "inductor": 0.9, "tritonfuse": 0.6}}}
    [ratios] = speedup_rows([row], ["inductor", "tritonfuse"])
    assert ratios[("inductor" + SAME_PROCESS, "tritonfuse")] == pytest.approx(1.5)
    row["cells"]["tritonfuse"]["status"] = "FAIL"      # a wrong result has no speed
    [ratios] = speedup_rows([row], ["inductor", "tritonfuse"])
    assert ("inductor" + SAME_PROCESS, "tritonfuse") not in ratios


def test_models_suite_lists_a_model_whose_together_job_ran_out_of_time():
    from scripts.bench_models import _unfinished_models

    ok = {"status": "ok", "out_of_time": False}
    rows = [{"model": "a", "cells": {"tritonfuse": ok}, "together": {"status": "ok", "out_of_time": False}},
            {"model": "b", "cells": {"tritonfuse": ok}, "together": {"status": "skipped", "out_of_time": True}},
            {"model": "c", "cells": {"tritonfuse": ok}}]
    assert _unfinished_models(rows) == ["b"]


def test_wide_check_reference_falls_back_to_eager_float32_where_float64_fails():
    """scripts/wide_models_check.py measures each compiled model against the model in
    float64; a model whose own code cannot run in float64 (MoE's grouped_mm on the CPU)
    is measured against eager float32 instead, and says so."""
    from types import SimpleNamespace
    from scripts import wide_models_check as wide

    class Tiny(torch.nn.Module):
        def __init__(self, float64_works):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)
            self.float64_works = float64_works

        def forward(self, x, labels):
            if x.dtype == torch.float64 and not self.float64_works:
                raise RuntimeError("no double kernel")
            logits = self.linear(x)
            return SimpleNamespace(logits=logits, loss=torch.nn.functional.cross_entropy(logits, labels))

    batch = dict(x=torch.randn(5, 4), labels=torch.tensor([0, 1, 2, 0, 1]))
    for works in (True, False):
        model = Tiny(works)
        (ref, ref_grads), (eager, eager_grads), label = wide.reference_and_eager(model, batch, train=True)
        assert set(ref_grads) == set(eager_grads) == {"linear.weight", "linear.bias"}
        if works:
            assert label == "float64" and ref.dtype == torch.float64
            torch.testing.assert_close(ref.float(), eager, rtol=1e-5, atol=1e-6)
        else:
            assert label.startswith("eager float32 (float64 raised RuntimeError: no double kernel")
            assert ref is eager and all(ref_grads[n] is eager_grads[n] for n in ref_grads)
