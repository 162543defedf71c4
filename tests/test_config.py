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


def test_a_config_or_override_nested_past_the_recursion_limit_is_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("train:\n  lr: " + "[" * 20000 + "]" * 20000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{deep}: not valid YAML: nested too deeply to read \(past Python's "
                                          r"recursion limit\); a config is sections of keys$"):
        load_config(deep)
    with pytest.raises(ConfigError, match=r"^train.lr: expected float, got str '\[{59}\.\.\. \(40,002 characters\)$"):
        load_config(None, ["train.lr=" + "[" * 20000 + "]" * 20000])


def test_a_lone_surrogate_escape_in_a_yaml_file_is_one_line_naming_the_file_and_key(tmp_path):
    """`"\\ud83d"` in a quoted YAML string is half a character: a sweep file's name or a config's list item held one
    and failed later with no file named."""
    from pipeline.sweeps.space import read_spec

    half = "holds a lone surrogate escape (half of a UTF-16 pair), not text; write the character itself, or both " \
           "halves of its escape"
    spec = tmp_path / "space.yaml"
    spec.write_text('name: "a\\ud83d"\ntrials: 2\nparams: {train.lr: {low: 1.0e-4, high: 1.0e-3}}\n', encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        read_spec(spec)
    assert str(e.value) == f"{spec}: name: 'a\\ud83d' {half}"
    config = tmp_path / "config.yaml"
    config.write_text('task: causal_lm\nlm:\n  prompts: ["fine", "bad \\udc00"]\n', encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(config)
    assert str(e.value) == f"{config}: lm.prompts[1]: 'bad \\udc00' {half}"
    with pytest.raises(ConfigError) as e:  # from a command line whose bytes were not UTF-8
        load_config(None, ["task=causal_lm", "lm.prompts=[ok, x\udc80]"])
    assert str(e.value) == "lm.prompts: '[ok, x\\udc80]' is not valid UTF-8 text; use a UTF-8 name (rename the path)"
