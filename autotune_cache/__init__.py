"""Persistent store of the best Triton launch configs found by tritonfuse's autotuner.

    from autotune_cache import AutotuneCache, make_key, current_versions
    cache = AutotuneCache()                  # $TRITONFUSE_AUTOTUNE_CACHE_DIR or XDG cache
    key = make_key(source, [c.to_dict() for c in candidates], device_name, current_versions())
    entry = cache.get(key)                   # dict or None

CLI: ``python -m autotune_cache [--dir DIR] list | show KEY | clear | export FILE | import FILE``.
"""
from .store import (
    BUNDLE_KIND,
    ENV_DIR,
    FORMAT_VERSION,
    AutotuneCache,
    current_versions,
    default_directory,
    make_key,
    source_hash,
    validate_entry,
)

__all__ = [
    "AutotuneCache",
    "BUNDLE_KIND",
    "ENV_DIR",
    "FORMAT_VERSION",
    "current_versions",
    "default_directory",
    "make_key",
    "source_hash",
    "validate_entry",
]
