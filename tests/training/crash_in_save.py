"""Test-only launcher: run pipeline/train.py's real main, and SIGKILL this process at one point inside
its N-th checkpoint save. The product code path is untouched; only library calls it makes are
wrapped here to find the moment.

    python crash_in_save.py POINT N train.py-args...
POINT: weights        right after save_state wrote model.safetensors (optimizer, RNG, JSON files not yet)
       before_rename  manifest written into the temporary folder, not yet renamed into place
       rotation       new checkpoint complete, rotation about to delete an old one (in the first save from
                      the N-th on whose rotation deletes one: a save may have nothing to delete)
       disk_full      save_state's model.safetensors write fails as torch fails on a full disk, 4 KiB
                      left (no kill: train.py's own error handling runs, as `python pipeline/train.py`)
"""

import os
import shutil
import signal
import sys
from collections import namedtuple
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import accelerate.utils.other as accelerate_io  # noqa: E402  (save_state's writer of model.safetensors)

from pipeline.training import checkpoint  # noqa: E402

point, nth, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
DiskUsage = namedtuple("DiskUsage", "total used free")
saves = {"n": 0}


def die() -> None:
    print(f"crash_in_save: SIGKILL at {point} of save #{saves['n']}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def armed() -> bool:
    return saves["n"] == nth


real_save_checkpoint = checkpoint.save_checkpoint
real_save_file = accelerate_io.safe_save_file
real_rename = os.rename
real_rmtree = checkpoint.shutil.rmtree


def counting_save(*a, **k):
    saves["n"] += 1
    return real_save_checkpoint(*a, **k)


def save_file(tensors, filename, *a, **k):
    if point == "disk_full" and armed() and str(filename).endswith("model.safetensors"):
        Path(filename).write_bytes(b"\0" * 1024)  # what it got to write
        shutil.disk_usage = lambda path: DiskUsage(10 * 2**30, 10 * 2**30 - 4096, 4096)
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4486080 vs 4485968")
    real_save_file(tensors, filename, *a, **k)
    if point == "weights" and armed() and str(filename).endswith("model.safetensors"):
        die()


def rename(src, dst, *a, **k):
    if point == "before_rename" and armed() and Path(src).name.endswith(".tmp") and "checkpoints" in str(dst):
        die()
    return real_rename(src, dst, *a, **k)


def rmtree(path, *a, **k):
    if point == "rotation" and saves["n"] >= nth and not str(path).endswith(".tmp"):
        die()
    return real_rmtree(path, *a, **k)


checkpoint.save_checkpoint = counting_save
accelerate_io.safe_save_file = save_file
os.rename = rename
checkpoint.shutil.rmtree = rmtree

from pipeline.train import main  # noqa: E402

if point == "disk_full":  # the entry script's own path: errors become one line
    from pipeline.cli import run_main  # noqa: E402

    sys.argv = [str(REPO / "pipeline" / "train.py"), *argv]
    run_main(main)
sys.exit(main(argv))
