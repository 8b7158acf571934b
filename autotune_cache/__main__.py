"""Command line for the autotune cache.

    python -m autotune_cache [--dir DIR] list
    python -m autotune_cache [--dir DIR] show KEY      (a unique key prefix is enough)
    python -m autotune_cache [--dir DIR] clear
    python -m autotune_cache [--dir DIR] export FILE
    python -m autotune_cache [--dir DIR] import FILE

Every problem is one line on stderr ("python -m autotune_cache: error: ...", or
"...: warning: ..." for an entry it skips) and a non-zero exit status, never a traceback:
1 for a failed command, 2 for bad arguments. The CLI reports damaged files but deletes
nothing except on `clear`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import warnings

from .store import AutotuneCache

PROG = "python -m autotune_cache"
_BLOCK_ORDER = {"YBLOCK": 0, "XBLOCK": 1, "RBLOCK": 2}


class CommandError(Exception):
    """A command that cannot be done; its message is the one line the user sees."""


class UsageError(CommandError):
    """Bad arguments (exit status 2)."""


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
        raise CommandError(f"no entry with key {args.key!r} in {cache.directory}")
    if len(matches) > 1:
        raise CommandError(f"key prefix {args.key!r} is ambiguous: {', '.join(m[:16] for m in matches)}")
    entry = cache.get(matches[0])
    if entry is None:
        raise CommandError(f"entry {matches[0]} is invalid (see the warning above)")
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
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always")
        count = cache.import_(args.file)
    for warning in skipped:   # shown by main, like every other warning
        warnings.warn(warning.message)
    note = f" ({len(skipped)} skipped)" if skipped else ""
    print(f"imported {count} entries{note} into {cache.directory}")
    return 0


COMMANDS = {"list": _cmd_list, "show": _cmd_show, "clear": _cmd_clear,
            "export": _cmd_export, "import": _cmd_import}


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # one line, not argparse's usage block
        raise UsageError(f"{message} (see {PROG} --help)")


def _parse(argv):
    parser = _Parser(prog=PROG, description="Inspect and move tritonfuse's autotune cache.")
    parser.add_argument("--dir", help="cache folder (default: $TRITONFUSE_AUTOTUNE_CACHE_DIR "
                                      "or $XDG_CACHE_HOME/tritonfuse/autotune)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="one line per entry: key prefix, kernel, config, device")
    show = sub.add_parser("show", help="all fields of one entry")
    show.add_argument("key", help="the key or a unique prefix of it")
    sub.add_parser("clear", help="remove every entry")
    export = sub.add_parser("export", help="write all entries into one JSON bundle")
    export.add_argument("file")
    import_ = sub.add_parser("import", help="merge a bundle written by export")
    import_.add_argument("file")
    return parser.parse_args(argv)


def _describe(error: OSError) -> str:
    """An OSError as a sentence: what failed, on which path."""
    reason = error.strerror or str(error)
    if isinstance(error, (NotADirectoryError, FileExistsError)):
        reason = "a plain file stands where a folder should be"
    names = [n for n in (error.filename, error.filename2) if n]
    return f"{reason}: {' -> '.join(os.fspath(n) for n in names)}" if names else reason


def run(argv: list[str] | None = None) -> int:
    """The command's exit status; raises CommandError, OSError or ValueError on failure."""
    args = _parse(argv)
    cache = AutotuneCache(args.dir, strict=True)
    if os.path.exists(cache.directory) and not os.path.isdir(cache.directory):
        raise CommandError(f"the cache location {cache.directory} is a file, not a folder")
    return COMMANDS[args.command](cache, args)


def main(argv: list[str] | None = None) -> int:
    """Run the command; every failure is one line on stderr and a non-zero status."""
    with warnings.catch_warnings(record=True) as caught, _quiet_store_log():
        warnings.simplefilter("always")
        status, problem = _run_catching(argv)
    for warning in caught:
        print(f"{PROG}: warning: {warning.message}", file=sys.stderr)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
    return status


@contextlib.contextmanager
def _quiet_store_log():
    """The store logs what it also warns about; the CLI prints the warnings, once each."""
    store_log = logging.getLogger("tritonfuse.autotune")
    saved = store_log.disabled
    store_log.disabled = True
    try:
        yield
    finally:
        store_log.disabled = saved


def _run_catching(argv) -> tuple[int, str | None]:
    try:
        return run(argv), None
    except SystemExit as done:          # --help
        return (done.code if isinstance(done.code, int) else 0), None
    except UsageError as error:
        return 2, str(error)
    except CommandError as error:
        return 1, str(error)
    except BrokenPipeError:             # `... list | head`: the reader has gone
        sys.stdout = open(os.devnull, "w")
        return 1, None
    except OSError as error:
        return 1, _describe(error)
    except (ValueError, KeyError) as error:
        return 1, str(error)
    except KeyboardInterrupt:
        return 130, "interrupted"
    except Exception as error:  # noqa: BLE001 - a bug: still one line, not a traceback
        return 1, f"internal error ({type(error).__name__}: {error})"


if __name__ == "__main__":
    sys.exit(main())
