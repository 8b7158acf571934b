"""scripts/warmup_autotune.py end to end on the CPU (Triton interpreter, tuning forced).

The script's plumbing (targets, stats, second run all hits, export, exit status) is tested
with Dynamo's "eager" backend around a hand-written TritonLauncher kernel; the run through
the real compiler is skipped while `tritonfuse.backend` cannot be imported.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "warmup_autotune.py"


def run_warmup(tmp_path, *args, graph_cache="cache"):
    env = dict(os.environ, TRITONFUSE_CACHE_DIR=str(tmp_path / graph_cache),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--no-builtin",
                           "--cache-dir", str(tmp_path / "autotune"), *args],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300)
    counts = {}
    for label in ("kernels tuned", "cache hits"):
        match = re.search(rf"^{label}: (\d+)$", proc.stdout, re.M)
        counts[label] = int(match.group(1)) if match else None
    return proc, counts


def test_warmup_plumbing_second_run_is_all_hits(tmp_path):
    target = ["--backend", "eager", "--target", "tests/warmup_targets.py:launcher_add_fn",
              "--shapes", "64,64"]
    bundle = tmp_path / "bundle.json"
    first, counts = run_warmup(tmp_path, *target, "--export", str(bundle))
    assert first.returncode == 0, first.stdout + first.stderr
    assert counts == {"kernels tuned": 1, "cache hits": 0}, first.stdout
    assert "1/1" in first.stderr                      # the progress bar
    assert len(json.loads(bundle.read_text())["entries"]) == 1
    second, counts = run_warmup(tmp_path, *target)
    assert second.returncode == 0, second.stdout + second.stderr
    assert counts == {"kernels tuned": 0, "cache hits": 1}, second.stdout


def test_warmup_failing_target_sets_exit_status(tmp_path):
    proc, _ = run_warmup(tmp_path, "--backend", "eager",
                         "--target", "tests/warmup_targets.py:broken_fn", "--shapes", "4")
    assert proc.returncode == 1
    assert "FAIL" in proc.stdout and "always fails" in proc.stdout


def test_warmup_bad_arguments(capsys):
    sys.path.insert(0, str(REPO))
    from scripts import warmup_autotune
    assert warmup_autotune.main(["--no-builtin", "--target", "no_colon_here", "--shapes", "4"]) == 2
    assert "module:function" in capsys.readouterr().err
    assert warmup_autotune.main(["--no-builtin", "--target", "a:b", "--target", "c:d",
                                 "--shapes", "4", "--shapes", "4", "--shapes", "4"]) == 2
    assert warmup_autotune.parse_shapes("8x128, 4") == [(8, 128), (4,)]
    with pytest.raises(SystemExit):
        warmup_autotune.main(["--no-builtin"])            # nothing to do


def test_warmup_compiles_user_target_with_tritonfuse(tmp_path):
    target = ["--target", "tests/warmup_targets.py:softmax_fn", "--shapes", "4x16"]
    first, counts = run_warmup(tmp_path, *target)
    assert first.returncode == 0, first.stdout + first.stderr
    assert counts["kernels tuned"] >= 1 and counts["cache hits"] == 0, first.stdout
    tuned = counts["kernels tuned"]
    second, counts = run_warmup(tmp_path, *target)
    assert second.returncode == 0, second.stdout + second.stderr
    assert counts == {"kernels tuned": 0, "cache hits": tuned}, second.stdout


def test_warmup_max_autotune_covers_matmuls(tmp_path):
    """--max-autotune: the matmul's choice (GEMM template configs against aten) is made and
    stored on the first run; the second run (another process, no compiled graphs to reuse)
    finds it, and every other tuning, in the autotune cache."""
    target = ["--max-autotune", "--target", "tests/warmup_targets.py:matmul_relu_fn", "--shapes", "37x29,29x50"]
    first, counts = run_warmup(tmp_path, *target)
    assert first.returncode == 0, first.stdout + first.stderr
    assert counts["kernels tuned"] >= 1 and counts["cache hits"] == 0, first.stdout
    entries = [json.loads(p.read_text()) for p in (tmp_path / "autotune").glob("*.json")]
    assert [e["kernel_name"] for e in entries if e.get("kind") == "gemm"] == ["mm 37x29 @ 29x50 float32"]
    tuned = counts["kernels tuned"]
    second, counts = run_warmup(tmp_path, *target, graph_cache="another_cache")
    assert second.returncode == 0, second.stdout + second.stderr
    assert counts == {"kernels tuned": 0, "cache hits": tuned}, second.stdout
