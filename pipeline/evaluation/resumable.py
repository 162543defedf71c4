"""predict.py's output file, written part by part so that a killed prediction continues where it stopped.

The protocol: the rows of one part are appended to the output and fsync'd, then `<output>.progress.json` is
replaced atomically (artifacts.write_json_atomic) with the parts done, the output's size in bytes after them and
the records read. A rerun truncates the output to that size (rows of a part whose record was not written are
cut off, whatever of them reached the disk) and goes on with the next part, so every row is written exactly once.
The record names what it is a prediction of (`key`: the input's identity, the model, the settings); a rerun with
another key is refused rather than mixed into the file. The record is removed at the end: an output without one
is complete.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from pipeline import artifacts


def progress_path(output: Path) -> Path:
    return output.with_name(output.name + ".progress.json")


def flat(row: dict) -> dict:
    """A row for CSV: a nested dict's keys joined with a dot (probabilities.positive), a list joined with '|'."""
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update({f"{k}.{name}": x for name, x in v.items()})
        else:
            out[k] = "|".join(map(str, v)) if isinstance(v, list) else v
    return out


class Output:
    """JSONL (or CSV, for an output path ending in .csv) rows appended part by part, resumable (module docstring)."""

    def __init__(self, path: Path, key: str):
        self.path, self.key, self.progress = Path(path), key, progress_path(Path(path))
        self._lock = _lock(self.path)  # one writer: two runs appending to one output would repeat rows
        self.csv = self.path.suffix.lower() == ".csv"
        self.parts, self.records, self.columns, self.resumed = 0, 0, None, False
        try:
            self._open()
        except BaseException:
            self.release()
            raise

    def _open(self) -> None:
        """Resume from the progress record, refuse another prediction's or a finished output, or start the file."""
        key = self.key
        rec = artifacts.read_json(self.progress) if self.progress.is_file() else None
        if rec is not None and rec.get("key") != key and not rec.get("parts"):
            rec = None  # nothing was written under the other settings: this prediction starts the file afresh
            self.path.unlink(missing_ok=True)
        if rec is not None:
            if rec.get("key") != key:
                raise ValueError(f"{self.path} is a prediction of another input, model or settings ({self.progress} "
                                 f"says so); delete both files to start again, or pick another --output")
            if not self.path.is_file() or self.path.stat().st_size < rec["bytes"]:
                raise ValueError(f"{self.path} is shorter than {self.progress} records ({rec['bytes']} bytes): it was "
                                 f"changed since; delete both files to start again")
            self.parts, self.records, self.columns = rec["parts"], rec["records"], rec.get("columns")
            self.resumed = self.parts > 0
            with open(self.path, "r+b") as f:  # what the killed run wrote after its last record: cut off
                f.truncate(rec["bytes"])
                os.fsync(f.fileno())
        elif self.path.exists():
            raise ValueError(f"{self.path} exists (a finished prediction); delete it or pick another --output")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(b"")
            self._record(0)

    def _record(self, size: int) -> None:
        artifacts.write_json_atomic(self.progress, {"key": self.key, "parts": self.parts, "records": self.records,
                                                    "bytes": size, "columns": self.columns})

    def _encode(self, rows: list[dict]) -> bytes:
        if not self.csv:
            return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        flats = [flat(r) for r in rows]
        buf, header = io.StringIO(), self.columns is None
        if header:  # the first part's columns, and skipped last: a later row fills the ones it has
            keys = list(dict.fromkeys(k for r in flats for k in r if k != "skipped"))
            self.columns = keys + ["skipped"]
        writer = csv.DictWriter(buf, self.columns, restval="", extrasaction="ignore", lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(flats)
        return buf.getvalue().encode("utf-8")

    def commit(self, rows: list[dict], records: int) -> None:
        """One part's rows appended and made durable, then the record of it (module docstring)."""
        with open(self.path, "ab") as f:
            f.write(self._encode(rows))
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        self.parts, self.records = self.parts + 1, self.records + records
        self._record(size)

    def discard_if_empty(self) -> None:
        """A prediction that failed before its first part was written leaves no file behind."""
        if self.parts == 0:
            self.path.unlink(missing_ok=True)
            self.progress.unlink(missing_ok=True)
        self.release()

    def finish(self) -> None:
        """The output complete: its progress record removed."""
        self.progress.unlink(missing_ok=True)
        artifacts.fsync_path(self.path.parent)
        self.release()

    def release(self) -> None:
        lock_path(self.path).unlink(missing_ok=True)
        self._lock.close()


def lock_path(output: Path) -> Path:
    return output.with_name(output.name + ".lock")


def _lock(output: Path):
    """An exclusive flock on `<output>.lock`, held while this process writes; the kernel drops it when the process
    ends, however it ends (a SIGKILLed run's lock does not stop its resume). Another live run: one line."""
    import fcntl

    output.parent.mkdir(parents=True, exist_ok=True)
    f = open(lock_path(output), "a+")  # noqa: SIM115 - held open for the run
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ValueError(f"{output} is being written by another predict.py run (it holds {lock_path(output)}); "
                         f"wait for it or stop it, then run this command again to continue") from None
    return f
