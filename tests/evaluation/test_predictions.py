"""predict.py on a classifier's run: the same document predictions as evaluate.py --split test and as transformers'
pipeline() on final/, every input row once and in order, CSV output, a SIGKILL mid-run resumed with every row
exactly once, and bad input as one line naming the file and row."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.evaluation.predictkit import TINY, classifier_run, main, many_rows


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    run_dir, args = classifier_run(root)
    test_raw = root / "test_raw.jsonl"
    lines = (root / "source.jsonl").read_text(encoding="utf-8").splitlines()
    test_raw.write_text("".join(line + "\n" for line in lines if json.loads(line)["split"] == "test"), encoding="utf-8")
    return run_dir, args, test_raw


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_same_as_evaluate_and_pipeline(run, tmp_path):
    run_dir, args, test_raw = run
    out = tmp_path / "p.jsonl"
    assert main("predict", ["--run", str(run_dir), "--input", str(test_raw), "--output", str(out), "--quiet",
                            "--precision", "fp32"]) == 0
    rows = _jsonl(out)
    raw = _jsonl(test_raw)
    assert [r["id"] for r in rows] == [r["id"] for r in raw]  # every input row, in input order
    assert main("evaluate", ["--config", str(TINY), "--split", "test", "--quiet", "--precision", "fp32", *args]) == 0
    docs = _jsonl(run_dir / "eval" / "test-final" / "documents.jsonl")
    assert len(docs) >= 10 and any(d["chunks"] > 1 for d in docs)  # chunked documents, aggregated
    ours = {r["id"]: r for r in rows}
    spread = [r["probabilities"]["negative"] for r in rows]
    assert max(spread) - min(spread) > 0.01  # the scaled head's probabilities differ from document to document
    for d in docs:
        assert ours[d["id"]]["label"] == d["prediction"], d["id"]
        for name, p in d["probabilities"].items():  # documents.jsonl rounds to 6 decimals
            assert ours[d["id"]]["probabilities"][name] == pytest.approx(p, abs=1e-6), (d["id"], name)
    from transformers import pipeline

    clf = pipeline("text-classification", model=str(run_dir / "final"), top_k=None, device="cpu")
    short = [r for r in raw if len(r["text"].split()) <= 12]  # one chunk: pipeline() reads a text whole
    short += [{"id": "x", "text": "good bad fine"}] if not short else []
    for r, scores in zip(short, clf([r["text"] for r in short])):
        if r["id"] not in ours:
            continue
        for s in scores:
            assert ours[r["id"]]["probabilities"][s["label"]] == pytest.approx(s["score"], abs=1e-5)


def test_pipeline_agrees_on_unchunked_rows(run, tmp_path):
    """Rows under split.chunk_size words are one chunk: pipeline() on final/ gives the same probabilities."""
    run_dir, _, _ = run
    from transformers import pipeline

    src = tmp_path / "new.csv"
    texts = ["good good love it", "awful, terrible and bad", "meh okay average fine", "Great!! happy happy"]
    src.write_text("text\n" + "".join(f'"{t}"\n' for t in texts), encoding="utf-8")
    out = tmp_path / "new.csv.out.jsonl"
    assert main("predict", ["--run", str(run_dir), "--input", str(src), "--output", str(out), "--quiet",
                            "--precision", "fp32", "source.id_field="]) == 0
    rows = _jsonl(out)
    assert [r["id"] for r in rows] == [0, 1, 2, 3]
    clf = pipeline("text-classification", model=str(run_dir / "final"), top_k=None, device="cpu")
    for row, scores in zip(rows, clf(texts)):
        assert row["label"] == max(scores, key=lambda s: s["score"])["label"]
        for s in scores:
            assert row["probabilities"][s["label"]] == pytest.approx(s["score"], abs=1e-5)


def test_csv_output_and_bf16(run, tmp_path):
    run_dir, _, test_raw = run
    out = tmp_path / "p.csv"
    assert main("predict", ["--run", str(run_dir), "--input", str(test_raw), "--output", str(out), "--quiet",
                            "--precision", "bf16"]) == 0
    import csv

    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert [r["id"] for r in rows] == [r["id"] for r in _jsonl(test_raw)]
    assert {"label", "probabilities.negative", "probabilities.neutral", "probabilities.positive"} <= set(rows[0])
    assert all(abs(sum(float(r[f"probabilities.{n}"]) for n in ("negative", "neutral", "positive")) - 1) < 1e-5
               for r in rows)


def test_resume_after_sigkill_writes_every_row_once(run, tmp_path):
    from tests.zygote import child_env, zygote

    run_dir, _, _ = run
    src = tmp_path / "many.jsonl"
    many_rows(src, 1500)
    common = ["--run", str(run_dir), "--input", str(src), "--quiet", "--precision", "fp32", "--part-mb", "0.002"]
    whole = tmp_path / "whole.jsonl"
    assert main("predict", [*common, "--output", str(whole)]) == 0
    out = tmp_path / "killed.jsonl"
    progress = tmp_path / "killed.jsonl.progress.json"
    child = zygote().start([str(Path(__file__).parents[2] / "pipeline" / "predict.py"), *common, "--output", str(out)],
                           tmp_path / "child.out", tmp_path / "child.err", child_env())
    deadline = time.time() + 120
    while time.time() < deadline and child.poll() is None:
        if progress.is_file() and json.loads(progress.read_text() or "{}").get("parts", 0) >= 3:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    child.wait(60)
    assert child.returncode == -signal.SIGKILL, (tmp_path / "child.err").read_text()
    assert json.loads(progress.read_text())["parts"] >= 3
    assert out.stat().st_size < whole.stat().st_size  # killed mid-run
    assert main("predict", [*common, "--output", str(out)]) == 0
    assert not progress.exists()
    assert out.read_bytes() == whole.read_bytes()  # every row exactly once, as the uninterrupted run wrote them
    assert [r["id"] for r in _jsonl(out)] == [f"n{i}" for i in range(1500)]


def test_resume_refuses_other_settings_and_finished_outputs(run, tmp_path):
    run_dir, _, test_raw = run
    out = tmp_path / "p.jsonl"
    out.write_text("")
    (tmp_path / "p.jsonl.progress.json").write_text(json.dumps({"key": "other", "parts": 1, "records": 2, "bytes": 0}))
    with pytest.raises(ValueError, match="prediction of another input, model or settings"):
        main("predict", ["--run", str(run_dir), "--input", str(test_raw), "--output", str(out), "--quiet"])
    (tmp_path / "p.jsonl.progress.json").unlink()
    with pytest.raises(ValueError, match="exists .a finished prediction."):
        main("predict", ["--run", str(run_dir), "--input", str(test_raw), "--output", str(out), "--quiet"])


def _predict(run_dir: Path, src: Path, *extra: str) -> int:
    return main("predict", ["--run", str(run_dir), "--input", str(src), "--output", str(src) + ".out.jsonl",
                            "--quiet", *extra])


def test_bad_input_is_one_line_naming_file_and_row(run, tmp_path):
    run_dir, _, _ = run
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"id": "a", "text": "good"}\n{"id": "b", "body": "bad"}\n{"id": "c", "text": "fine"}\n')
    with pytest.raises(ValueError, match=rf"{missing}: record 2 has no 'text' field .*--bad-lines skip"):
        _predict(run_dir, missing)
    assert _predict(run_dir, missing, "--bad-lines", "skip") == 0
    assert [r["id"] for r in _jsonl(Path(str(missing) + ".out.jsonl"))] == ["a", "c"]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "text": "good"}\n{"id": "b", "text": \n{"id": "c", "text": "fine"}\n')
    with pytest.raises(ValueError, match=rf"{broken}:2: .*source.bad_lines=skip"):
        _predict(run_dir, broken)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"id": "a", "text": "good"}\n{"id": "b", "text": "café"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{latin}.*not valid utf-8.*source.encoding"):
        _predict(run_dir, latin)
    assert _predict(run_dir, latin, "source.encoding=latin-1") == 0
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match=rf"{empty}"):
        _predict(run_dir, empty)


def test_not_a_finished_run(run, tmp_path):
    run_dir, _, test_raw = run
    with pytest.raises(ValueError, match=rf"{tmp_path} is not a training run \(no config.yaml"):
        main("predict", ["--run", str(tmp_path), "--input", str(test_raw)])
    (tmp_path / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    with pytest.raises(ValueError, match=rf"{tmp_path} is not a finished run for --checkpoint final"):
        main("predict", ["--run", str(tmp_path), "--input", str(test_raw)])
    with pytest.raises(ValueError, match=r"clean\.\*: predict.py uses the run's recorded clean settings"):
        main("predict", ["--run", str(run_dir), "--input", str(test_raw), "clean.lowercase=true"])


def test_model_card_shows_a_predict_command_that_runs(run, tmp_path):
    import shlex

    from pipeline.checks import load_config
    from pipeline.training import card

    run_dir, _, test_raw = run
    body = card.render(load_config(run_dir / "config.yaml"), run_dir)
    assert f'pipe = pipeline("text-classification", model="{run_dir / "final"}")' in body
    (line,) = [s for s in body.splitlines() if s.startswith("python pipeline/predict.py")]
    argv = shlex.split(line)[2:]
    argv[argv.index("new.csv")] = str(test_raw)
    argv[argv.index("predictions.jsonl")] = str(tmp_path / "card.jsonl")
    assert main("predict", [*argv, "--quiet"]) == 0
    assert len(_jsonl(tmp_path / "card.jsonl")) == len(_jsonl(test_raw))


def test_every_row_has_an_output_row_in_input_order(run, tmp_path):
    """An empty text and a row clean drops keep their place, saying why; ids without an id column: record numbers."""
    run_dir, _, _ = run
    src = tmp_path / "gaps.tsv"
    src.write_text("text\ngood love\n   \nbad awful\nRT @someone: \nfine\n", encoding="utf-8")
    out = tmp_path / "gaps.jsonl"
    assert main("predict", ["--run", str(run_dir), "--input", str(src), "--output", str(out), "--quiet",
                            "source.id_field="]) == 0
    rows = _jsonl(out)
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[1] == {"id": 1, "skipped": "empty"}
    assert rows[3] == {"id": 3, "skipped": "empty_after_clean"}  # a retweet marker and a mention: nothing left
    assert all("label" in rows[k] for k in (0, 2, 4))


def test_a_csv_in_many_parts_keeps_quoted_line_breaks_and_order(run, tmp_path):
    """CSV parts are moved to record starts by their quote counts (the Ray engine's rule): a quoted value holding a
    line break or a comma is one record, whichever part it straddles; a quote the rule cannot follow is one line."""
    import csv

    run_dir, _, _ = run
    src = tmp_path / "many.csv"
    with open(src, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        for i in range(300):
            writer.writerow([f"c{i}", f"good, bad\nline {i}" if i % 7 == 0 else f"fine okay {i}"])
    out = tmp_path / "many.out.jsonl"
    assert main("predict", ["--run", str(run_dir), "--input", str(src), "--output", str(out), "--quiet",
                            "--part-mb", "0.001"]) == 0
    assert [r["id"] for r in _jsonl(out)] == [f"c{i}" for i in range(300)]
    odd = tmp_path / "odd.csv"
    odd.write_text("id,text\n" + "".join(f'c{i},say x"y {i}\n' for i in range(300)), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{odd}: a quote that the CSV's part planner cannot follow.*--part-mb"):
        main("predict", ["--run", str(run_dir), "--input", str(odd), "--output", str(tmp_path / "odd.jsonl"),
                         "--quiet", "--part-mb", "0.001"])
    assert not (tmp_path / "odd.jsonl").exists()  # nothing written, nothing left


def test_a_second_run_on_the_same_output_is_refused_while_the_first_writes(run, tmp_path):
    """Two runs appending to one output would write rows twice: the second is one line, and the first's lock goes
    with its process (a lock file left by a killed run does not stop the resume)."""
    import fcntl

    run_dir, _, test_raw = run
    out = tmp_path / "p.jsonl"
    lock = tmp_path / "p.jsonl.lock"
    with open(lock, "a+") as held:  # a live run's lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match=rf"{out} is being written by another predict.py run"):
            main("predict", ["--run", str(run_dir), "--input", str(test_raw), "--output", str(out), "--quiet"])
    assert not out.exists()
    assert lock.exists()  # as a killed run leaves it: not locked, so it does not stop the next run
    assert main("predict", ["--run", str(run_dir), "--input", str(test_raw), "--output", str(out), "--quiet"]) == 0
    assert len(_jsonl(out)) == len(_jsonl(test_raw)) and not lock.exists()
