"""Test-only launcher: run pipeline/train.py's real main, and SIGKILL this process at one point inside
its N-th checkpoint save. The product code path is untouched; only library calls it makes are
wrapped here to find the moment.

    python crash_in_save.py POINT N train.py-args...
POINT: weights        right after save_state wrote model.safetensors (optimizer, RNG, JSON files not yet)
       before_rename  manifest written into the temporary folder, not yet renamed into place
       rotation       new checkpoint complete, rotation about to delete an old one
"""

import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import accelerate.utils.other as accelerate_io  # noqa: E402  (save_state's writer of model.safetensors)

from pipeline.training import checkpoint  # noqa: E402

point, nth, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
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
    real_save_file(tensors, filename, *a, **k)
    if point == "weights" and armed() and str(filename).endswith("model.safetensors"):
        die()


def rename(src, dst, *a, **k):
    if point == "before_rename" and armed() and Path(src).name.endswith(".tmp") and "checkpoints" in str(dst):
        die()
    return real_rename(src, dst, *a, **k)


def rmtree(path, *a, **k):
    if point == "rotation" and armed() and not str(path).endswith(".tmp"):
        die()
    return real_rmtree(path, *a, **k)


checkpoint.save_checkpoint = counting_save
accelerate_io.safe_save_file = save_file
os.rename = rename
checkpoint.shutil.rmtree = rmtree

from pipeline.train import main  # noqa: E402

sys.exit(main(argv))
