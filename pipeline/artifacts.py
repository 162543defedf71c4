"""Fingerprints, atomic directory writes and manifests: the one place caching lives.

A stage directory is complete when its `manifest.json` exists. Everything is written into a
hidden temporary sibling first, flushed, and renamed into place in one `os.rename`, so a process
killed at any moment leaves either nothing or a complete directory, never a half-written one
that a later run could take for complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

MANIFEST = "manifest.json"
# a folder's own README.md (final/'s model card, pipeline/training/card.py) is documentation no loader reads: written after
# the manifest and rewritten when evaluation adds figures, it is not an unlisted file to check_files
UNLISTED = frozenset({"README.md"})


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable parts (dict keys sorted)."""
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def special_kind(path: str | Path) -> str | None:
    """What `path` is when it exists and is neither a regular file nor a folder (links followed): "a FIFO", "a
    socket", "a character device", "a block device", whose reader would block forever or never end; else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), None)


def tree_fingerprint(path: str | Path) -> str:
    """Content hash of a file, or of every file under a folder (names and bytes)."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(os.fsencode(p.relative_to(path)) + b"\0")  # the name's bytes, UTF-8 or not
        h.update(file_sha256(p).encode("ascii"))
    return h.hexdigest()


def is_complete(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def fsync_tree(path: Path) -> None:
    """Flush every file and directory entry under `path` to disk."""
    for p in [path, *path.rglob("*")]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


GRACE_S = 60  # a temporary this young whose pid runs may be between its mkdir and its lock


@contextlib.contextmanager
def atomic_dir(final: str | Path, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes `final` only if the block succeeds.

    With replace=True an existing `final` is moved aside first and deleted after the rename.
    The writer holds an flock on the temporary while it lives; the kernel releases it however the
    process ends, which is how `remove_stale_temporaries` tells an abandoned one from a live one.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    lock = os.open(tmp, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield tmp
        fsync_tree(tmp)
        old = None
        if final.exists():
            if not replace:
                raise FileExistsError(f"{final} already exists")
            old = tmp.with_name(tmp.name + ".old")  # a temporary's name: a half-deleted one is never read
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_path(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if says_no_space(e):  # a library's bare ENOSPC names no path: say which folder did not fit
            raise no_space_error(final.parent, None, f"{final.name}/", e) from None
        raise
    finally:
        os.close(lock)


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """An exclusive lock on the lock file `path` (created if missing) for the block, waiting for it; the kernel
    releases it however the process ends."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_stale_temporaries(parent: str | Path) -> list[Path]:
    """Delete the temporary files and directories that writers which died mid-write left here."""
    removed = []
    for p in Path(parent).glob(".*.tmp-*"):
        try:
            pid = int(p.name.rsplit(".tmp-", 1)[1].split("-")[0])
        except ValueError:
            continue
        if not _abandoned(p, pid):
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:  # write_json_atomic's temporary file
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _abandoned(p: Path, pid: int) -> bool:
    """No writer holds `p`'s lock, and its pid is gone, a zombie, or reused (the lock is older)."""
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError:
        return False  # already gone, or not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live writer holds it
    finally:
        os.close(fd)
    try:
        young = time.time() - p.stat().st_mtime < GRACE_S
    except OSError:
        return False
    return not (young and _running(pid))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process that its parent has not reaped yet (a zombie) still answers kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: trust kill


def link_tree(src: str | Path, dest: str | Path) -> bool:
    """Hard-link every file under `src` into a new `dest` (the same tree, no byte written): True; where
    the filesystem cannot (another device, no hard links) nothing is left at `dest`: False. For files
    never written again once complete, as a stage's are."""
    src, dest = Path(src), Path(dest)
    try:
        for p in sorted(src.rglob("*")):
            target = dest / p.relative_to(src)
            if p.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(p, target)
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)
        return False
    return dest.is_dir()


def fsync_path(path: Path) -> None:
    """Flush one file, or one directory's entries (so a rename in it survives a power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON to `path` through a temporary file and a rename."""
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def write_jsonl_atomic(path: str | Path, rows: list) -> None:
    """One JSON object per line (UTF-8, not escaped), through write_text_atomic."""
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if says_no_space(e):
            raise no_space_error(path.parent, None, path.name, e) from None
        raise


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"missing file: {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON (line {e.lineno}): {e.msg}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: byte {e.object[e.start:e.end]!r} at offset {e.start} is not "
                         f"UTF-8") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid JSON: nested too deeply to read (past Python's recursion limit)") from None


def library_versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour shapes the artifacts (only those installed)."""
    from importlib import metadata

    names = ["torch", "transformers", "accelerate", "datasets", "tokenizers", "evaluate", "datasketch", "ftfy", "numpy"]
    out = {"python": sys.version.split()[0]}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def git_commit(path: str | Path = ".") -> str:
    """The commit of the code being run, or '' outside a git checkout."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def manifest(**fields: Any) -> dict:
    return {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": library_versions(), **fields}


def write_files_manifest(folder: Path, **fields: Any) -> None:
    """Flush every file of `folder`, then write manifest.json (last: it marks the folder complete) with
    each file's size and sha256 read back from disk, so whoever uses the folder can check it first."""
    files = {}
    for p in sorted(q for q in Path(folder).rglob("*") if q.is_file() and q.name != MANIFEST):
        fsync_path(p)
        files[str(p.relative_to(folder))] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
    write_json_atomic(Path(folder) / MANIFEST, manifest(**fields, files=files))


def check_files(folder: Path, deep: bool = True) -> str | None:
    """None when every file of `folder` is the one its manifest lists (sizes, and sha256 when `deep`) and no
    other file is there; otherwise the reason, in words."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return "incomplete (no manifest.json)"
    try:
        files = read_json(folder / MANIFEST)["files"]
        extra = sorted(rel for rel in (str(p.relative_to(folder)) for p in folder.rglob("*")
                                       if p.is_file() and p.name != MANIFEST)
                       if rel not in files and rel not in UNLISTED)
        if extra:  # every file any loader could read is covered by the manifest
            return f"{extra[0]} is not in the manifest"
        for rel, info in files.items():
            p = folder / rel
            if not p.is_file():
                return f"{rel} is missing"
            if p.stat().st_size != info["bytes"]:
                return f"{rel} has {p.stat().st_size} bytes, manifest says {info['bytes']}"
            if deep and file_sha256(p) != info["sha256"]:
                return f"{rel} does not match its sha256 in the manifest"
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
        return f"unreadable ({e})"
    return None


def write_errors() -> tuple[type[BaseException], ...]:
    """The exception types a library reports a failed write (a full disk) with: OSError; torch's RuntimeError
    ("unexpected pos", "file write failed"); safetensors' SafetensorError ("I/O error: No space left on
    device (os error 28)"). Catch these around a write, and let `no_space_error` decide what it was."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return (OSError, RuntimeError)
    return (OSError, RuntimeError, SafetensorError)


def no_space_error(path: str | Path, needed: int | None, what: str, cause: BaseException,
                   then: str = "run the same command again") -> OSError | None:
    """The one-line error for `what` failing to write under `path` because its disk is full (the cause says
    ENOSPC, or less than `needed` bytes are free), or None when it is not that: libraries report a full disk
    as anything from ENOSPC to torch's "unexpected pos"."""
    import errno

    enospc = says_no_space(cause)
    try:
        free: int | None = shutil.disk_usage(path).free
    except OSError:
        free = None
    if not enospc and (free is None or needed is None or free >= needed):
        return None
    have = f"{size_text(free)} free" if free is not None else "free space unknown"
    needs = f"{what} needs about {size_text(needed)}, {have}" if needed else f"{what} could not be written, {have}"
    return OSError(errno.ENOSPC, f"no space left on the disk of {path}: {needs}; free some space and {then}")


def says_no_space(e: BaseException) -> bool:
    """The error itself says the disk is full (errno ENOSPC, or safetensors' "os error 28")."""
    import errno

    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "(os error 28)" in str(e)


def tree_bytes(folder: Path) -> int:
    """The bytes of the files under `folder` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) if Path(folder).is_dir() else 0


def size_text(n: int) -> str:
    """Bytes for people: 512 B, 3.4 KiB, 87.1 MiB, 2.0 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
