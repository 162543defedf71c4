from pathlib import Path

import pytest

from pipeline.checks import load_config
from pipeline.config import Config, ConfigError, options_help

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_file_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)


def test_defaults_and_overrides_are_typed():
    cfg = load_config(None, ["dedup.threshold=0.8", "train.lr=3e-5", "train.batch_size=8", "label.names=[a, b]"])
    assert cfg.dedup.threshold == 0.8 and isinstance(cfg.dedup.threshold, float)
    assert cfg.train.lr == 3e-5 and cfg.train.batch_size == 8
    assert cfg.label.names == ["a", "b"]


def test_int_is_accepted_where_float_is_expected():
    assert load_config(None, ["dedup.threshold=1"]).dedup.threshold == 1.0


def test_unknown_key_names_it_and_the_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'dedup.treshold'; did you mean 'dedup.threshold'"):
        load_config(None, ["dedup.treshold=0.5"])


def test_unknown_key_in_yaml_names_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("source:\n  path: a.csv\ntrain:\n  epocs: 2\n")
    with pytest.raises(ConfigError, match=r"x.yaml: unknown config key 'train.epocs'; did you mean 'train.epochs'"):
        load_config(p)


def test_wrong_type_and_bad_choice():
    with pytest.raises(ConfigError, match=r"train.batch_size: expected int, got str 'big'"):
        load_config(None, ["train.batch_size=big"])
    with pytest.raises(ConfigError, match=r"train.batch_size: expected int, got bool"):
        load_config(None, ["train.batch_size=true"])
    with pytest.raises(ConfigError, match=r"dedup.method: 'fuzzy' is not one of"):
        load_config(None, ["dedup.method=fuzzy"])


def test_split_ratios_must_sum_to_one():
    with pytest.raises(ConfigError, match=r"must be 1.*0.8 \+ 0.3 \+ 0.1"):
        load_config(None, ["split.validation=0.3"])


def test_section_and_non_section_errors():
    with pytest.raises(ConfigError, match="is a section"):
        load_config(None, ["dedup=3"])
    with pytest.raises(ConfigError, match="not a section"):
        load_config(None, ["output_dir.x=3"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["dedup.threshold"])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_help_lists_every_option():
    text = "\n".join(options_help())
    for key in ("dedup.threshold", "train.lr", "split.leakage", "tokenize.max_length", "eval.checkpoint"):
        assert key in text
