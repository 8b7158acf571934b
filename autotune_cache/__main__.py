"""Command line for the autotune cache.

    python -m autotune_cache [--dir DIR] list
    python -m autotune_cache [--dir DIR] show KEY      (a unique key prefix is enough)
    python -m autotune_cache [--dir DIR] clear
    python -m autotune_cache [--dir DIR] export FILE
    python -m autotune_cache [--dir DIR] import FILE
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from .store import AutotuneCache


_BLOCK_ORDER = {"YBLOCK": 0, "XBLOCK": 1, "RBLOCK": 2}


def _format_config(config: dict) -> str:
    kwargs = sorted(config.get("kwargs", {}).items(), key=lambda kv: (_BLOCK_ORDER.get(kv[0], 3), kv[0]))
    blocks = " ".join(f"{k}={v}" for k, v in kwargs)
    return f"{blocks} w={config.get('num_warps')} s={config.get('num_stages', 1)}"


def _cmd_list(cache: AutotuneCache, args) -> int:
    entries = sorted(cache.entries(), key=lambda e: (e["kernel_name"], e["key"]))
    if not entries:
        print(f"no entries in {cache.directory}")
        return 0
    rows = [(e["key"][:12], e["kernel_name"], _format_config(e["config"]), e["device"])
            for e in entries]
    header = ("KEY", "KERNEL", "CONFIG", "DEVICE")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    print(f"{len(entries)} entries in {cache.directory}")
    return 0


def _cmd_show(cache: AutotuneCache, args) -> int:
    matches = [k for k in cache.keys() if k.startswith(args.key.lower())]
    if not matches:
        print(f"no entry with key {args.key!r} in {cache.directory}", file=sys.stderr)
        return 1
    if len(matches) > 1:
        print(f"key prefix {args.key!r} is ambiguous: {', '.join(m[:16] for m in matches)}",
              file=sys.stderr)
        return 1
    entry = cache.get(matches[0])
    if entry is None:
        print(f"entry {matches[0]} is invalid (see the warning above)", file=sys.stderr)
        return 1
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry["created"]))
    print(f"key:     {entry['key']}")
    print(f"kernel:  {entry['kernel_name']}")
    print(f"device:  {entry['device']}")
    print(f"config:  {_format_config(entry['config'])}")
    print(f"versions: {json.dumps(entry['versions'], sort_keys=True)}")
    print(f"created: {created}")
    print("timings (ms):")
    for name, ms in sorted(entry["timings_ms"].items(), key=lambda kv: kv[1]):
        print(f"  {ms:10.4f}  {name}")
    return 0


def _cmd_clear(cache: AutotuneCache, args) -> int:
    print(f"removed {cache.clear()} entries from {cache.directory}")
    return 0


def _cmd_export(cache: AutotuneCache, args) -> int:
    print(f"exported {cache.export(args.file)} entries to {args.file}")
    return 0


def _cmd_import(cache: AutotuneCache, args) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            count = cache.import_(args.file)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    skipped = f" ({len(caught)} skipped)" if caught else ""
    print(f"imported {count} entries{skipped} into {cache.directory}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune_cache",
                                     description="Inspect and move tritonfuse's autotune cache.")
    parser.add_argument("--dir", help="cache folder (default: $TRITONFUSE_AUTOTUNE_CACHE_DIR "
                                      "or $XDG_CACHE_HOME/tritonfuse/autotune)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="one line per entry: key prefix, kernel, config, device")
    show = sub.add_parser("show", help="all fields of one entry")
    show.add_argument("key", help="the key or a unique prefix of it")
    sub.add_parser("clear", help="remove every entry")
    export = sub.add_parser("export", help="write all entries into one JSON bundle")
    export.add_argument("file")
    import_ = sub.add_parser("import", help="merge a bundle written by export")
    import_.add_argument("file")
    args = parser.parse_args(argv)

    cache = AutotuneCache(args.dir)
    commands = {"list": _cmd_list, "show": _cmd_show, "clear": _cmd_clear,
                "export": _cmd_export, "import": _cmd_import}
    return commands[args.command](cache, args)


if __name__ == "__main__":
    sys.exit(main())
