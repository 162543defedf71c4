"""What the equal-output tests (two processes, two engines) share: a manifest less its per-run values."""


def stable(obj, volatile: set):
    """`obj` (a manifest, or part of one) without the keys in `volatile`, at any depth."""
    if isinstance(obj, dict):
        return {k: stable(v, volatile) for k, v in obj.items() if k not in volatile}
    if isinstance(obj, list):
        return [stable(v, volatile) for v in obj]
    return obj
