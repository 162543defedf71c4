"""Which train settings a resume may change: the checks of setup.check_resumable on their own."""

from types import SimpleNamespace

import pytest

from pipeline.checks import load_config
from pipeline.training.setup import _fingerprints, check_resumable


def fingerprints(cfg, data_fp):
    return _fingerprints(cfg, data_fp, "no")


def _state(cfg, drop: str = ""):
    fps = fingerprints(cfg, "data")
    train = {k: v for k, v in fps["train"].items() if k != drop}
    return SimpleNamespace(fingerprints={**fps, "train": train}, num_processes=1), fps


def test_a_setting_newer_than_the_checkpoint_counts_as_its_default():
    """A checkpoint of a version without a train key resumes while the key keeps its default (adding
    train.init_from made every earlier checkpoint 'differ': None -> '')."""
    cfg = load_config(None)
    key = next(k for k, v in fingerprints(cfg, "data")["train"].items() if v == 0.0 or v is False)
    state, fps = _state(cfg, drop=key)
    check_resumable(state, fps, 1, "ckpt")
    changed = load_config(None, [f"train.{key}={'true' if fps['train'][key] is False else '0.5'}"])
    with pytest.raises(ValueError, match=rf"ckpt: these settings differ .*train.{key}: "):
        check_resumable(state, fingerprints(changed, "data"), 1, "ckpt")


def test_init_from_is_free_on_resume():
    state, _ = _state(load_config(None))
    check_resumable(state, fingerprints(load_config(None, ["train.init_from=/elsewhere/final"]), "data"), 1, "ckpt")


def test_label_audit_is_free_on_resume():
    """train.label_audit reads the logits and changes no update: a resume may turn it off (no report) or on (then the
    checkpoint must hold its record, audit.LabelAudit.load, tested in test_audit.py)."""
    state, _ = _state(load_config(None))
    check_resumable(state, fingerprints(load_config(None, ["train.label_audit=true"]), "data"), 1, "ckpt")
