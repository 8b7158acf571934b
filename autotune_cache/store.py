"""The on-disk store of best Triton launch configs: one JSON file per key.

A key is the sha256 of everything that decides which config wins: the kernel source,
the candidate configs, the device name and the software versions (`make_key`). Files go
through tritonfuse.cache_store: writes are atomic (temp file in the same folder, fsync,
os.replace) with a size/hash record, so processes tuning at once never lose an entry nor
leave a torn file. A file that does not match its record is deleted (logged once) and
reads as a miss, so the kernel is tuned again; an entry that does not validate reads as
a miss with a warning, and the next `put` overwrites it. A store made with
``strict=True`` (the CLI) reports bad files but deletes nothing, and a write it cannot
make raises instead of going to the process's private folder.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
import warnings
from typing import Any, Iterator

from tritonfuse import cache_store

log = logging.getLogger("tritonfuse.autotune")

# Bump when the entry layout, the key recipe or the files change: older entries then miss.
# 2: files written through cache_store, with size/hash records
# 3: records name their file (cache_store "tritonfuse-sum 2")
FORMAT_VERSION = 3
BUNDLE_KIND = "tritonfuse-autotune-bundle"
ENV_DIR = "TRITONFUSE_AUTOTUNE_CACHE_DIR"

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_REQUIRED = {
    "key": str,
    "kernel_name": str,
    "config": dict,
    "device": str,
    "versions": dict,
    "timings_ms": dict,
    "created": (int, float),
}


def default_directory() -> str:
    """tritonfuse.config.autotune_cache_dir: $TRITONFUSE_AUTOTUNE_CACHE_DIR, else
    $XDG_CACHE_HOME/tritonfuse/autotune."""
    from tritonfuse import config
    return config.autotune_cache_dir


def current_versions() -> dict[str, Any]:
    """{"triton": ..., "torch": ..., "format": FORMAT_VERSION} of this process."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # the store itself works without triton
        triton_version = "none"
    import torch
    return {"triton": str(triton_version), "torch": str(torch.__version__), "format": FORMAT_VERSION}


def source_hash(kernel_source: str) -> str:
    return hashlib.sha256(kernel_source.encode("utf-8")).hexdigest()


def _key_from_parts(src_sha: str, candidates: list[dict], device_name: str,
                    versions: dict) -> str:
    payload = {
        "source_sha256": src_sha,
        "candidates": candidates,
        "device": device_name,
        "versions": versions,
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def make_key(kernel_source: str, candidates: list[dict], device_name: str,
             versions: dict[str, Any]) -> str:
    """sha256 hex over a canonical JSON of source, candidate configs, device and versions."""
    return _key_from_parts(source_hash(kernel_source), candidates, device_name, versions)


def validate_entry(entry: Any, key: str | None = None) -> str | None:
    """Why `entry` is not a usable entry (filed under `key` if given), or None if it is."""
    if not isinstance(entry, dict):
        return f"entry is a {type(entry).__name__}, not a JSON object"
    for field, types in _REQUIRED.items():
        if field not in entry:
            return f"missing field {field!r}"
        if not isinstance(entry[field], types):
            return f"field {field!r} has type {type(entry[field]).__name__}"
    if not _KEY_RE.match(entry["key"]):
        return f"stored key {entry['key']!r} is not a sha256 hex digest"
    if key is not None and entry["key"] != key:
        return f"stored key {entry['key'][:12]} differs from the key it is filed under"
    if entry["versions"].get("format") != FORMAT_VERSION:
        return f"format {entry['versions'].get('format')!r} is not {FORMAT_VERSION}"
    if not math.isfinite(entry["created"]):
        return f"created {entry['created']!r} is not a time"
    problem = _config_problem(entry["config"]) or _timings_problem(entry["timings_ms"])
    if problem:
        return problem
    config = entry["config"]
    # Entries written by the launcher carry what the key was made of: check they agree.
    if "source_sha256" in entry and "candidates" in entry:
        recomputed = _key_from_parts(entry["source_sha256"], entry["candidates"],
                                     entry["device"], entry["versions"])
        if recomputed != entry["key"]:
            return "key does not match the entry's source/candidates/device/versions"
        if config not in entry["candidates"]:
            return "chosen config is not one of the entry's candidates"
    return None


def _whole(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _config_problem(config: dict) -> str | None:
    """Why a stored launch config could not be launched (a hand-edited or imported entry
    is checked here, so no launch meets a block size "abc"), or None."""
    kwargs = config.get("kwargs")
    if not isinstance(kwargs, dict) or "num_warps" not in config:
        return "config lacks kwargs/num_warps"
    if not all(isinstance(name, str) and _whole(size, 1) for name, size in kwargs.items()):
        return f"config kwargs {kwargs!r} are not whole numbers >= 1"
    if not _whole(config["num_warps"], 1) or not _whole(config.get("num_stages", 1), 1):
        return "config num_warps/num_stages are not whole numbers >= 1"
    return None


def _timings_problem(timings: dict) -> str | None:
    """Why the timings are unusable (a NaN or a string would decide a GEMM choice), or None."""
    for name, ms in timings.items():
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms < 0:
            return f"timing {name!r} is {ms!r}, not a finite number of milliseconds"
    return None


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode("utf-8")


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, stacklevel=3)


class AutotuneCache:
    """Best launch configs on disk, one `<key>.json` file per tuned kernel.

    directory: defaults to `default_directory()`, read when the object is made (an empty
    one too). strict: see the module docstring (the CLI's store).
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, strict: bool = False) -> None:
        directory = os.fspath(directory) if directory is not None else ""
        self.directory = os.path.abspath(directory) if directory else default_directory()
        self.strict = strict

    def _path(self, key: str) -> str:
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise ValueError(f"not an autotune cache key (64 hex digits): {key!r}")
        return os.path.join(self.directory, key + ".json")

    def _read(self, key: str) -> dict | None:
        """The valid entry filed under `key`, None if absent; warns about bad files."""
        path = self._path(key)
        if not self.strict:
            data = cache_store.read(path)   # a damaged file: deleted and logged there
        else:
            data, why = cache_store.check(path)
            if why not in (None, cache_store.ABSENT):
                _warn(f"autotune cache: ignoring damaged entry {path}: {why}")
        if data is None:
            return None
        try:
            entry = json.loads(data)
        except ValueError as e:
            _warn(f"autotune cache: ignoring unreadable entry {path}: {e}")
            return None
        problem = validate_entry(entry, key)
        if problem:
            _warn(f"autotune cache: ignoring entry {path}: {problem}")
            return None
        return entry

    def get(self, key: str) -> dict | None:
        """The entry stored under `key`, or None (absent, corrupt or mismatched)."""
        return self._read(key)

    def put(self, key: str, entry: dict) -> None:
        """Store `entry` under `key` atomically (overwrites any previous file)."""
        entry = dict(entry, key=key)
        entry.setdefault("created", time.time())
        problem = validate_entry(entry, key)
        if problem:
            raise ValueError(f"refusing to store an invalid autotune entry: {problem}")
        cache_store.sweep_once(self.directory, folders=())   # temp files of killed writers
        cache_store.write(self._path(key), _json_bytes(entry), fallback=not self.strict)

    def keys(self) -> list[str]:
        """Keys of all files in the store (valid or not), sorted. Raises OSError if the
        store's location exists but cannot be listed (a plain file, no permission)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        keys = [name[:-5] for name in names if name.endswith(".json")]
        return sorted(k for k in keys if _KEY_RE.match(k))

    def entries(self) -> Iterator[dict]:
        """Every valid entry; invalid files are skipped with a warning."""
        for key in self.keys():
            entry = self._read(key)
            if entry is not None:
                yield entry

    def clear(self) -> int:
        """Remove every entry, its record and stale temp files; returns the number of
        entries removed."""
        removed = 0
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        with cache_store.lock(self.directory):
            for name in names:
                stem = name[:-len(cache_store.RECORD_SUFFIX)] if name.endswith(cache_store.RECORD_SUFFIX) else name
                is_entry = name.endswith(".json") and _KEY_RE.match(name[:-5])
                is_ours = stem.endswith(".json") and _KEY_RE.match(stem[:-5])
                if is_ours or name.startswith(cache_store.TEMP_PREFIXES):
                    try:
                        os.unlink(os.path.join(self.directory, name))
                        removed += bool(is_entry)
                    except FileNotFoundError:
                        pass
        return removed

    def export(self, path: str | os.PathLike) -> int:
        """Write every valid entry into one JSON bundle at `path`; returns the count."""
        entries = list(self.entries())
        bundle = {
            "kind": BUNDLE_KIND,
            "format": FORMAT_VERSION,
            "exported": time.time(),
            "entries": entries,
        }
        cache_store.write(os.path.abspath(os.fspath(path)), _json_bytes(bundle), record=False,
                          fallback=False)
        return len(entries)

    def import_(self, path: str | os.PathLike) -> int:
        """Merge a bundle written by `export`; invalid entries are skipped with a warning.

        Returns the number of entries imported. Raises ValueError if the file is not a
        bundle at all.
        """
        with open(path, encoding="utf-8") as f:
            try:
                bundle = json.load(f)
            except ValueError as e:
                raise ValueError(f"{path}: not a JSON autotune bundle: {e}") from e
        if not isinstance(bundle, dict) or bundle.get("kind") != BUNDLE_KIND \
                or not isinstance(bundle.get("entries"), list):
            raise ValueError(f"{path}: not an autotune bundle (kind {BUNDLE_KIND!r})")
        os.makedirs(self.directory, exist_ok=True)   # an unusable location fails here
        imported = 0
        for i, entry in enumerate(bundle["entries"]):
            problem = validate_entry(entry)
            if problem:
                _warn(f"autotune cache: skipping bundle entry #{i} of {path}: {problem}")
                continue
            self.put(entry["key"], entry)
            imported += 1
        return imported
