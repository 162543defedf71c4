"""Imported first by the entry scripts run as files (`python pipeline/train.py`): Python then puts
pipeline/ itself on sys.path, where evaluate.py would shadow the `evaluate` library. Replace it with
the repository root, so `pipeline.*` imports work and no sibling is taken for a library."""

import sys
from pathlib import Path

_here = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
sys.path.insert(0, str(_here.parent))
