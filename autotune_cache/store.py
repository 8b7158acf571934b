"""The on-disk store of best Triton launch configs: one JSON file per key.

A key is the sha256 of everything that decides which config wins: the kernel source,
the candidate configs, the device name and the software versions (`make_key`). Writes are
atomic (temp file in the same folder, fsync, os.replace), so processes tuning at once
never lose an entry nor leave a torn file; readers treat anything that does not validate
as a miss, with a warning, and the next `put` overwrites it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import time
import warnings
from typing import Any, Iterator

log = logging.getLogger("tritonfuse.autotune")

# Bump when the entry layout or key recipe changes: older entries then miss.
FORMAT_VERSION = 1
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
    config = entry["config"]
    if not isinstance(config.get("kwargs"), dict) or not isinstance(config.get("num_warps"), int):
        return "config lacks kwargs/num_warps"
    # Entries written by the launcher carry what the key was made of: check they agree.
    if "source_sha256" in entry and "candidates" in entry:
        recomputed = _key_from_parts(entry["source_sha256"], entry["candidates"],
                                     entry["device"], entry["versions"])
        if recomputed != entry["key"]:
            return "key does not match the entry's source/candidates/device/versions"
        if config not in entry["candidates"]:
            return "chosen config is not one of the entry's candidates"
    return None


def _atomic_write_json(path: str, obj: Any) -> None:
    """Write `obj` as JSON to `path` so that readers see the old file or the new one."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, stacklevel=3)


class AutotuneCache:
    """Best launch configs on disk, one `<key>.json` file per tuned kernel.

    directory: defaults to `default_directory()`, read when the object is made.
    """

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        directory = os.fspath(directory) if directory is not None else ""
        self.directory = os.path.abspath(directory) if directory else default_directory()

    def _path(self, key: str) -> str:
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise ValueError(f"not an autotune cache key (64 hex digits): {key!r}")
        return os.path.join(self.directory, key + ".json")

    def _read(self, key: str) -> dict | None:
        """The valid entry filed under `key`, None if absent; warns about bad files."""
        path = self._path(key)
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
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
        os.makedirs(self.directory, exist_ok=True)
        _atomic_write_json(self._path(key), entry)

    def keys(self) -> list[str]:
        """Keys of all files in the store (valid or not), sorted."""
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
        """Remove every entry (and stale temp files); returns the number of entries removed."""
        removed = 0
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        for name in names:
            is_entry = name.endswith(".json") and _KEY_RE.match(name[:-5])
            if is_entry or name.startswith(".tmp-"):
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
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        _atomic_write_json(path, bundle)
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
        imported = 0
        for i, entry in enumerate(bundle["entries"]):
            problem = validate_entry(entry)
            if problem:
                _warn(f"autotune cache: skipping bundle entry #{i} of {path}: {problem}")
                continue
            self.put(entry["key"], entry)
            imported += 1
        return imported
