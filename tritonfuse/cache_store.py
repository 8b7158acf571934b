"""Every file tritonfuse keeps on disk goes through here: graph modules and their meta,
C++ sources and libraries, Triton kernel files, compiler probe records, autotune records.

    path = write(path, data)          # atomic, with a record of size and hash; returns
                                      # where the file lives (see "unwritable" below)
    data = read(path)                 # the verified bytes; None if absent or damaged
    if verify(path): ...              # for a file another loader opens (dlopen a .so)
    path = ensure(path, data)         # a file that must hold exactly `data`
    discard(path, why)                # an entry that failed to load: delete it
    tmp = temp_path(path, ".so")      # a tool writes `tmp` (the C++ compiler) ...
    path = publish(tmp, path)         # ... and it is moved into place with its record
    with lock(folder): ...            # one writer per folder, across threads and processes
    sweep_once(root)                  # temporary files that killed processes left behind

Writes. The data goes to a temporary file in the target's folder, is fsynced and then
``os.replace``d over the target, so a reader sees the old file or the new one, never a
torn one. The record ``<file>.sum`` (one line: ``tritonfuse-sum 2 <size> <sha256> <name>``)
is written the same way, after the file. The name binds the record to its file: a file
copied with its record over another entry's (whose names are keys) fails the check,
where it would otherwise be a sound file of the wrong graph.

Reads. A file is used only when its size and sha256 match its record. A file that does
not match (cut short by a crash or a full disk, emptied, overwritten, unreadable, or
without a record because its write never finished) is deleted with its record, logged
once and counted in ``metrics.cache_repairs``; the caller rebuilds it in the same
process. A mismatch is checked again under the folder's lock before anything is deleted,
since a writer may be between the file and its record. ``verify`` hashes a file once per
process; later calls compare (inode, size, mtime) with what was verified.

Unwritable cache. When a folder of the cache cannot be written (read-only, wrong
permissions, a plain file in the way, a full disk), the file goes to a twin folder under a
private temporary folder of this process instead (logged once): the graph still compiles,
and the next process tries the cache again.

Sweeping. A killed build leaves its temporary file behind. ``sweep_once`` (called on the
cold path, once per process) deletes temporary files older than ``STALE_SECONDS`` whose
folder's lock is free: writers and builders hold the lock, so nothing still being
written is touched.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time

from . import metrics

log = logging.getLogger("tritonfuse")

RECORD_SUFFIX = ".sum"
TEMP_PREFIX = ".tmp_"
LOCK_NAME = ".lock"
STALE_SECONDS = 15 * 60
_RECORD_TAG = "tritonfuse-sum 2"
# Temporary-file prefixes of earlier versions, swept too.
TEMP_PREFIXES = (TEMP_PREFIX, ".tmp-")
# The sub-folders of a cache root that hold tritonfuse's files (the sweep stays inside them).
_SWEPT_FOLDERS = ("graphs", "cpp", "kernels", "aot")

ABSENT = "absent"

_state = threading.Lock()
_verified: dict[str, tuple] = {}          # path -> stat signature it was verified with
_reported: set[str] = set()               # paths whose damage was logged
_swept: set[str] = set()                  # roots swept by this process
_private_root: str | None = None
_unwritable_reported = False


# --- records --------------------------------------------------------------------------------

def _record_line(path: str, data: bytes) -> bytes:
    name = os.path.basename(path)
    return f"{_RECORD_TAG} {len(data)} {hashlib.sha256(data).hexdigest()} {name}\n".encode()


def check(path: str) -> tuple[bytes | None, str | None]:
    """(data, None) when `path` matches its record; (None, why) when it does not; why is
    ABSENT when there is no file. Deletes nothing."""
    data, why = _read_regular(path)
    if data is None:
        return None, why
    record, why = _read_regular(path + RECORD_SUFFIX)
    if record is None:
        if why is ABSENT:
            return None, "it has no size/hash record (its write never finished?)"
        return None, f"its size/hash record is {why}"
    if record != _record_line(path, data):
        return None, _mismatch(path, data, record)
    return data, None


def _read_regular(path: str) -> tuple[bytes | None, str]:
    """(bytes, "") of a regular file, or (None, why): ABSENT, "unreadable (...)", "not a
    regular file" (a folder, a pipe or a device in its place would fail or never end)."""
    try:
        # O_NONBLOCK: opening a pipe with no writer would otherwise wait for one, forever
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None, ABSENT
    except OSError as e:
        return None, f"unreadable ({e.strerror or e})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "not a regular file"
        with open(fd, "rb", closefd=False) as f:
            return f.read(), ""
    except OSError as e:
        return None, f"unreadable ({e.strerror or e})"
    finally:
        os.close(fd)


def _mismatch(path: str, data: bytes, record: bytes) -> str:
    parts = record.decode("utf-8", "replace").rstrip("\n").split(" ", 4)
    if len(parts) != 5 or " ".join(parts[:2]) != _RECORD_TAG or not parts[2].isdigit():
        return "its size/hash record is damaged or of another version"
    if parts[4] != os.path.basename(path):
        return f"its size/hash record is the record of {parts[4]!r} (copied from another entry?)"
    if int(parts[2]) != len(data):
        return f"it holds {len(data)} bytes where {parts[2]} were written"
    return "its content differs from what was written"


def _signature(path: str):
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# --- reading --------------------------------------------------------------------------------

def read(path: str) -> bytes | None:
    """The bytes of `path` if they match its record; None if it is absent or damaged (a
    damaged entry is deleted, logged once and counted: the caller rebuilds it)."""
    data, why = check(path)
    if why is None or why is ABSENT:
        return data
    with lock(os.path.dirname(path)):
        data, why = check(path)          # a writer may have been between file and record
        if why is None or why is ABSENT:
            return data
        discard(path, why)
    return None


def verify(path: str) -> bool:
    """Whether `path` exists and matches its record (a damaged one is discarded, as by
    `read`). Hashes a file once per process."""
    try:
        signature = _signature(path)
    except FileNotFoundError:
        return False
    except OSError:
        signature = None
    if signature is not None and _verified.get(path) == signature:
        return True
    if read(path) is None:
        return False
    if signature is not None:
        _verified[path] = signature
    return True


def discard(path: str, why: str) -> None:
    """Delete an entry that is damaged or failed to load (file and record); logged once
    per path and counted in metrics.cache_repairs (nothing happens if there is no file)."""
    with lock(os.path.dirname(path)):
        if not os.path.lexists(path):
            _remove_quietly(path + RECORD_SUFFIX)
            return
        for name in (path, path + RECORD_SUFFIX):
            try:
                if os.path.isdir(name) and not os.path.islink(name):
                    shutil.rmtree(name)
                else:
                    os.unlink(name)
            except FileNotFoundError:
                pass
            except OSError as e:   # a read-only folder: the rebuilt file goes elsewhere
                log.debug("tritonfuse: cannot delete %s: %s", name, e)
    _verified.pop(path, None)
    metrics.add("cache_repairs")
    with _state:
        first = path not in _reported
        _reported.add(path)
    if first:
        log.warning("tritonfuse: cache file %s is damaged or failed to load (%s); deleted, "
                    "rebuilding it", path, why)


# --- writing --------------------------------------------------------------------------------

def write(path: str, data: bytes | str, *, record: bool = True, fallback: bool = True) -> str:
    """Write `data` to `path` atomically, with its record unless `record` is False (a file
    for the user, such as an export, which gets neither record nor lock file). Returns where
    it now lives: `path`, or its private twin if the cache cannot be written (unless
    `fallback` is False: then OSError)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        return _write_in(path, data, record)
    except OSError as error:
        if not fallback or _is_private(path):
            raise
        _report_unwritable(path, error)
        return _write_in(_private_twin(path), data, record)


def _write_in(path: str, data: bytes, record: bool) -> str:
    tmp = _durable_temp(os.path.dirname(path), data)
    try:
        if not record:
            _replace(tmp, path)
            return path
        with lock(os.path.dirname(path)):
            _replace(tmp, path)
            _write_record(path, data)
    except BaseException:
        _remove_quietly(tmp)
        raise
    _remember_verified(path)
    return path


def _write_record(path: str, data: bytes) -> None:
    tmp = _durable_temp(os.path.dirname(path), _record_line(path, data))
    try:
        _replace(tmp, path + RECORD_SUFFIX)
    except BaseException:
        _remove_quietly(tmp)
        raise


def _replace(tmp: str, target: str) -> None:
    """os.replace, also where a folder stands in the target's place (removed first)."""
    try:
        os.replace(tmp, target)
    except IsADirectoryError:
        if os.path.islink(target) or not os.path.isdir(target):
            raise
        log.warning("tritonfuse: a folder stands where the cache file %s goes; removed", target)
        shutil.rmtree(target)
        os.replace(tmp, target)


def _durable_temp(folder: str, data: bytes) -> str:
    """A temporary file in `folder` holding `data`, on disk (fsynced) before it is renamed."""
    tmp = _new_temp(folder, "")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _remove_quietly(tmp)
        raise
    return tmp


def _remember_verified(path: str) -> None:
    with contextlib.suppress(OSError):
        _verified[path] = _signature(path)


def temp_path(path: str, suffix: str = "") -> str:
    """A new empty temporary file for a tool to write, in `path`'s folder (so `publish` is
    a rename), or in its private twin's folder if that one cannot be written."""
    try:
        return _new_temp(os.path.dirname(path), suffix)
    except OSError as error:
        if _is_private(path):
            raise
        _report_unwritable(path, error)
        return _new_temp(os.path.dirname(_private_twin(path)), suffix)


def publish(tmp: str, path: str) -> str:
    """Move the finished temporary file `tmp` (from `temp_path`) to `path` with its record;
    returns where it lives (`path`'s private twin if `tmp` was made there)."""
    target = path if os.path.dirname(tmp) == os.path.dirname(path) else _private_twin(path)
    with open(tmp, "rb+") as f:
        data = f.read()
        os.fsync(f.fileno())
    with lock(os.path.dirname(target)):
        _replace(tmp, target)
        _write_record(target, data)
    _remember_verified(target)
    return target


def ensure(path: str, data: bytes | str) -> str:
    """`path` holding exactly `data` (a file whose content its user knows, such as a Triton
    kernel source that inspect reads back): verified against `data` itself, rewritten when
    it differs. Returns where the file lives."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    current, why = _read_regular(path)
    if current == data:
        return path
    if _private_root is not None and _read_regular(_private_twin(path))[0] == data:
        return _private_twin(path)                    # this process fell back earlier
    if why is not ABSENT:
        discard(path, why or "its content differs from its source")
    return write(path, data)


def _new_temp(folder: str, suffix: str) -> str:
    """A new empty file in `folder` named TEMP_PREFIX + random + suffix, with the mode the
    umask gives (unlike mkstemp's 0600: a cache may be shared like any folder)."""
    os.makedirs(folder, exist_ok=True)
    while True:
        tmp = os.path.join(folder, f"{TEMP_PREFIX}{secrets.token_hex(6)}{suffix}")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


# --- the private fallback -------------------------------------------------------------------

def _private_folder() -> str:
    global _private_root
    with _state:
        if _private_root is None:
            _private_root = tempfile.mkdtemp(prefix="tritonfuse-private-")
            atexit.register(shutil.rmtree, _private_root, True)
        return _private_root


def _is_private(path: str) -> bool:
    return _private_root is not None and path.startswith(_private_root + os.sep)


def _private_twin(path: str) -> str:
    """Where `path` goes when its own folder cannot be written."""
    if _is_private(path):
        return path
    return os.path.join(_private_folder(), os.path.abspath(path).lstrip(os.sep))


def _report_unwritable(path: str, error: OSError) -> None:
    global _unwritable_reported
    with _state:
        first, _unwritable_reported = not _unwritable_reported, True
    log.log(logging.WARNING if first else logging.DEBUG,
            "tritonfuse: cannot write the cache folder %s (%s); this process keeps what it "
            "builds under %s instead", os.path.dirname(path), error.strerror or error,
            _private_folder())


# --- locks ----------------------------------------------------------------------------------

class _FolderLock:
    def __init__(self):
        self.thread_lock = threading.RLock()
        self.depth = 0
        self.file = None


_folder_locks: dict[str, _FolderLock] = {}


@contextlib.contextmanager
def lock(folder: str):
    """Exclusive use of `folder` against other threads and processes (reentrant in one
    thread). In a folder that cannot be written, only threads are excluded."""
    folder = os.path.abspath(folder)
    with _state:
        entry = _folder_locks.setdefault(folder, _FolderLock())
    with entry.thread_lock:
        if entry.depth == 0:
            entry.file = _open_lock_file(folder)
            if entry.file is not None:
                fcntl.flock(entry.file, fcntl.LOCK_EX)
        entry.depth += 1
        try:
            yield
        finally:
            entry.depth -= 1
            if entry.depth == 0 and entry.file is not None:
                entry.file.close()   # releases the flock
                entry.file = None


def _open_lock_file(folder: str):
    try:
        os.makedirs(folder, exist_ok=True)
        return open(os.path.join(folder, LOCK_NAME), "a")
    except OSError:
        return None


# --- sweeping -------------------------------------------------------------------------------

def sweep_once(root: str, folders=_SWEPT_FOLDERS) -> int:
    """`sweep(root, folders)` the first time this process calls it for `root`; returns the
    number of files removed."""
    root = os.path.abspath(root)
    with _state:
        if root in _swept:
            return 0
        _swept.add(root)
    return sweep(root, folders)


def sweep(root: str, folders=_SWEPT_FOLDERS, max_age: float = STALE_SECONDS) -> int:
    """Delete temporary files older than `max_age` seconds in the trees root/<folders> (in
    root alone, not below it, when `folders` is empty), in folders whose lock no writer
    holds. Returns how many were removed."""
    if folders:
        places = [walked for name in folders for walked in os.walk(os.path.join(root, name))]
    else:
        try:
            places = [(root, None, os.listdir(root))]
        except OSError:   # absent or unusable: nothing to sweep
            places = []
    removed = 0
    for folder, _, files in places:
        temps = [name for name in files if name.startswith(TEMP_PREFIXES)]
        if temps:
            removed += _sweep_folder(folder, temps, time.time() - max_age)
    return removed


def _sweep_folder(folder: str, temps: list[str], cutoff: float) -> int:
    stale = []
    for name in temps:
        with contextlib.suppress(OSError):
            if os.lstat(os.path.join(folder, name)).st_mtime < cutoff:
                stale.append(name)
    if not stale:
        return 0
    try:
        handle = open(os.path.join(folder, LOCK_NAME), "a")
    except OSError:
        return 0
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return 0      # a writer is at work in this folder
            raise
        removed = 0
        for name in stale:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
                removed += 1
    if removed:
        log.info("tritonfuse: removed %d stale temporary file(s) from %s", removed, folder)
    return removed
