"""The on-disk autotune store: keys, validation, atomic writes, bundles and the CLI."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import autotune_cache
from autotune_cache import AutotuneCache, current_versions, make_key
from autotune_cache.__main__ import main as cli_main
from tritonfuse import cache_store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "import triton\n@triton.jit\ndef k(x, XBLOCK: tl.constexpr):\n    pass\n"
CANDS = [{"kwargs": {"XBLOCK": 128}, "num_warps": 1, "num_stages": 1},
         {"kwargs": {"XBLOCK": 1024}, "num_warps": 4, "num_stages": 1}]
VERSIONS = {"triton": "3.9.0", "torch": "2.13.0", "format": autotune_cache.FORMAT_VERSION}


def entry_for(source=SOURCE, cands=CANDS, device="NVIDIA H100", versions=VERSIONS, pick=1,
              name="triton_poi_k_0"):
    key = make_key(source, cands, device, versions)
    return key, {
        "key": key, "kernel_name": name, "config": cands[pick], "device": device,
        "versions": versions, "timings_ms": {"a": 0.5, "b": 0.25}, "created": 1700000000.0,
        "source_sha256": autotune_cache.source_hash(source), "candidates": cands,
    }


def env_with(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_make_key_is_stable_and_sensitive_to_every_part():
    key = make_key(SOURCE, CANDS, "NVIDIA H100", VERSIONS)
    assert len(key) == 64 and int(key, 16) >= 0
    assert key == make_key(SOURCE, [dict(c) for c in CANDS], "NVIDIA H100", dict(VERSIONS))
    variants = [
        make_key(SOURCE + "\n", CANDS, "NVIDIA H100", VERSIONS),
        make_key(SOURCE, CANDS[:1], "NVIDIA H100", VERSIONS),
        make_key(SOURCE, CANDS[::-1], "NVIDIA H100", VERSIONS),
        make_key(SOURCE, CANDS, "NVIDIA H200", VERSIONS),
        make_key(SOURCE, CANDS, "NVIDIA H100", dict(VERSIONS, triton="3.6.0")),
        make_key(SOURCE, CANDS, "NVIDIA H100", dict(VERSIONS, torch="2.11.0")),
        make_key(SOURCE, CANDS, "NVIDIA H100", dict(VERSIONS, format=99)),
    ]
    assert len(set(variants + [key])) == len(variants) + 1


def test_current_versions():
    import torch
    import triton
    v = current_versions()
    assert v == {"triton": triton.__version__, "torch": torch.__version__,
                 "format": autotune_cache.FORMAT_VERSION}


def test_default_directory(monkeypatch, tmp_path):
    from tritonfuse import config
    monkeypatch.setattr(config, "autotune_cache_dir", str(tmp_path / "a"))
    assert AutotuneCache().directory == str(tmp_path / "a")
    assert AutotuneCache("").directory == str(tmp_path / "a")       # empty means unset

    def from_env(**environ):
        values, problems = config.from_environment(environ)
        assert problems == []
        return values["autotune_cache_dir"]

    assert from_env(TRITONFUSE_AUTOTUNE_CACHE_DIR=str(tmp_path / "b")) == str(tmp_path / "b")
    assert from_env(XDG_CACHE_HOME=str(tmp_path / "xdg")) == str(tmp_path / "xdg" / "tritonfuse" / "autotune")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home_default = str(tmp_path / "home" / ".cache" / "tritonfuse" / "autotune")
    assert from_env() == home_default
    assert from_env(TRITONFUSE_AUTOTUNE_CACHE_DIR="", XDG_CACHE_HOME="") == home_default


def test_put_get_keys_entries_clear(tmp_path):
    cache = AutotuneCache(tmp_path / "c")
    assert cache.get("0" * 64) is None and cache.keys() == [] and cache.clear() == 0
    key, entry = entry_for()
    cache.put(key, entry)
    assert cache.get(key) == entry
    assert cache.keys() == [key]
    assert [e["key"] for e in cache.entries()] == [key]
    # the entry and its size/hash record; no temp files left behind
    assert sorted(os.listdir(tmp_path / "c")) == [".lock", key + ".json", key + ".json.sum"]
    assert cache.clear() == 1
    assert cache.get(key) is None and cache.keys() == []
    assert os.listdir(tmp_path / "c") == [".lock"]


def test_put_rejects_invalid_entries_and_bad_keys(tmp_path):
    cache = AutotuneCache(tmp_path)
    key, entry = entry_for()
    with pytest.raises(ValueError):
        cache.put(key, {k: v for k, v in entry.items() if k != "config"})
    with pytest.raises(ValueError):
        cache.put(key, dict(entry, config={"kwargs": {"XBLOCK": 7}, "num_warps": 1, "num_stages": 1}))
    with pytest.raises(ValueError):
        cache.get("../../etc/passwd")


def test_corrupt_entry_is_deleted_misses_and_is_rewritten(tmp_path):
    from tritonfuse import metrics
    cache = AutotuneCache(tmp_path)
    key, entry = entry_for()
    cache.put(key, entry)
    path = tmp_path / f"{key}.json"
    path.write_text(path.read_text()[:40])         # a torn write
    with pytest.warns(UserWarning, match="damaged"):   # the CLI's store reports, keeps the file
        assert AutotuneCache(tmp_path, strict=True).get(key) is None
    assert path.exists()
    repairs = metrics.cache_repairs
    assert cache.get(key) is None                  # the compiler's store deletes it: a miss
    assert metrics.cache_repairs == repairs + 1 and not path.exists()
    assert list(cache.entries()) == []
    cache.put(key, entry)
    assert cache.get(key) == entry


@pytest.mark.parametrize("tamper,reason", [
    (lambda e: e.update(key="f" * 64), "differs"),
    (lambda e: e["versions"].update(format=autotune_cache.FORMAT_VERSION + 1), "format"),
    (lambda e: e["versions"].update(triton="0.0.1"), "does not match"),
    (lambda e: e.update(device="other GPU"), "does not match"),
    (lambda e: e.pop("timings_ms"), "missing"),
    (lambda e: e.update(config=[1, 2]), "type"),
])
def test_mismatched_entry_is_a_miss(tmp_path, tamper, reason):
    cache = AutotuneCache(tmp_path)
    key, entry = entry_for()
    tampered = json.loads(json.dumps(entry))
    tamper(tampered)
    cache_store.write(str(tmp_path / f"{key}.json"), json.dumps(tampered))   # a valid record
    with pytest.warns(UserWarning, match=reason):
        assert cache.get(key) is None


def _hand_written(entry):
    """An entry as a person or another tool writes it: without the key's material, so the
    chosen config is not checked against candidates."""
    return {k: v for k, v in entry.items() if k not in ("source_sha256", "candidates")}


@pytest.mark.parametrize("tamper,reason", [
    (lambda e: e["config"].update(kwargs={"XBLOCK": "abc"}), "whole numbers"),
    (lambda e: e["config"].update(kwargs={"XBLOCK": 128.5}), "whole numbers"),
    (lambda e: e["config"].update(kwargs={"XBLOCK": True}), "whole numbers"),
    (lambda e: e["config"].update(num_stages="x"), "whole numbers"),
    (lambda e: e["config"].update(num_warps=0), "whole numbers"),
    (lambda e: e.update(timings_ms={"a": float("nan")}), "finite"),
    (lambda e: e.update(timings_ms={"a": "fast"}), "finite"),
    (lambda e: e.update(timings_ms={"a": -1.0}), "finite"),
    (lambda e: e.update(created=float("inf")), "not a time"),
])
def test_entry_with_unusable_values_is_a_miss(tmp_path, tamper, reason):
    """Wrong types and NaN timings in an entry with a valid record (hand-edited, or
    imported): a miss with a warning, never a launch with them or a crash."""
    cache = AutotuneCache(tmp_path)
    key, entry = entry_for()
    tampered = _hand_written(json.loads(json.dumps(entry)))
    tamper(tampered)
    cache_store.write(str(tmp_path / f"{key}.json"), json.dumps(tampered))
    with pytest.warns(UserWarning, match=reason):
        assert cache.get(key) is None
    with pytest.raises(ValueError, match=reason):
        cache.put(key, tampered)
    cache.put(key, _hand_written(entry))     # a sound hand-written entry is used
    assert cache.get(key) == _hand_written(entry)


def test_version_change_is_a_miss(tmp_path):
    cache = AutotuneCache(tmp_path)
    key, entry = entry_for()
    cache.put(key, entry)
    new_key = make_key(SOURCE, CANDS, "NVIDIA H100", dict(VERSIONS, triton="3.10.0"))
    assert new_key != key and cache.get(new_key) is None


def test_export_import_roundtrip_skips_bad_entries(tmp_path):
    src = AutotuneCache(tmp_path / "src")
    made = [entry_for(name=f"k{i}", source=SOURCE + f"# {i}\n") for i in range(3)]
    for key, entry in made:
        src.put(key, entry)
    bundle_path = tmp_path / "bundle.json"
    assert src.export(bundle_path) == 3
    bundle = json.loads(bundle_path.read_text())
    bundle["entries"].append({"key": "nonsense"})
    bad = dict(made[0][1], key=made[1][0])           # filed under another kernel's key
    bundle["entries"].append(bad)
    bundle_path.write_text(json.dumps(bundle))
    dst = AutotuneCache(tmp_path / "dst")
    with pytest.warns(UserWarning, match="skipping bundle entry"):
        assert dst.import_(bundle_path) == 3
    for key, entry in made:
        assert dst.get(key) == entry
    (tmp_path / "not_a_bundle.json").write_text("[]")
    with pytest.raises(ValueError, match="not an autotune bundle"):
        dst.import_(tmp_path / "not_a_bundle.json")


def test_cli_list_show_export_import_clear(tmp_path, capsys):
    src = tmp_path / "src"
    cache = AutotuneCache(src)
    key, entry = entry_for(name="triton_red_fused_sum_0")
    cache.put(key, entry)

    assert cli_main(["--dir", str(src), "list"]) == 0
    out = capsys.readouterr().out
    assert key[:12] in out and "triton_red_fused_sum_0" in out
    assert "XBLOCK=1024 w=4 s=1" in out and "NVIDIA H100" in out

    assert cli_main(["--dir", str(src), "show", key[:10]]) == 0
    out = capsys.readouterr().out
    assert key in out and "0.2500" in out
    assert cli_main(["--dir", str(src), "show", "abc"]) == 1

    bundle = tmp_path / "b.json"
    assert cli_main(["--dir", str(src), "export", str(bundle)]) == 0
    assert "exported 1 entries" in capsys.readouterr().out
    dst = tmp_path / "dst"
    assert cli_main(["--dir", str(dst), "import", str(bundle)]) == 0
    assert "imported 1 entries" in capsys.readouterr().out
    assert AutotuneCache(dst).get(key) == entry
    assert cli_main(["--dir", str(dst), "clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert AutotuneCache(dst).keys() == []


def test_cli_as_module_uses_env_dir(tmp_path):
    key, entry = entry_for(name="triton_per_fused_softmax_0")
    AutotuneCache(tmp_path).put(key, entry)
    proc = subprocess.run([sys.executable, "-m", "autotune_cache", "list"], capture_output=True,
                          text=True, env=env_with(TRITONFUSE_AUTOTUNE_CACHE_DIR=str(tmp_path)),
                          cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "triton_per_fused_softmax_0" in proc.stdout and key[:12] in proc.stdout


WRITER = textwrap.dedent("""
    import sys
    from autotune_cache import AutotuneCache, make_key, FORMAT_VERSION
    directory, tag = sys.argv[1], sys.argv[2]
    cache = AutotuneCache(directory)
    versions = {"triton": "t", "torch": "p", "format": FORMAT_VERSION}
    cands = [{"kwargs": {"XBLOCK": 64}, "num_warps": 2, "num_stages": 1}]
    def write(name):
        key = make_key(name, cands, "dev", versions)
        cache.put(key, {"kernel_name": name, "config": cands[0], "device": "dev",
                        "versions": versions, "timings_ms": {"x": 1.0}, "created": 1.0,
                        "candidates": cands, "source_sha256": __import__("hashlib").sha256(
                            name.encode()).hexdigest(), "padding": tag * 2000})
    for i in range(50):
        write(f"{tag}_{i}")
        write(f"shared_{i % 10}")      # both processes also race on the same keys
""")


def test_concurrent_writers_lose_nothing(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    directory = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, str(script), str(directory), tag],
                              env=env_with(), stderr=subprocess.PIPE, text=True)
             for tag in ("a", "b")]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    names = os.listdir(directory)
    assert not [n for n in names if n.startswith(".tmp-")]
    cache = AutotuneCache(directory)
    assert len(cache.keys()) == 110
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # any torn or invalid file would warn
        entries = list(cache.entries())
    assert len(entries) == 110
    names_seen = {e["kernel_name"] for e in entries}
    assert {f"a_{i}" for i in range(50)} <= names_seen
    assert {f"b_{i}" for i in range(50)} <= names_seen
    assert {f"shared_{i}" for i in range(10)} <= names_seen
