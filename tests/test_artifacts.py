import pytest

from pipeline import artifacts


def test_fingerprint_is_stable_and_order_free():
    assert artifacts.fingerprint({"a": 1, "b": 2}) == artifacts.fingerprint({"b": 2, "a": 1})
    assert artifacts.fingerprint({"a": 1}) != artifacts.fingerprint({"a": 2})


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "stage"
    with pytest.raises(RuntimeError):
        with artifacts.atomic_dir(final) as tmp:
            (tmp / "part").write_text("half")
            raise RuntimeError("killed")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replace(tmp_path):
    final = tmp_path / "stage"
    with artifacts.atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(FileExistsError):
        with artifacts.atomic_dir(final) as tmp:
            pass
    with artifacts.atomic_dir(final, replace=True) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["b"]
    assert [p.name for p in tmp_path.iterdir()] == ["stage"]


def test_tree_fingerprint_sees_content(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("one")
    before = artifacts.tree_fingerprint(tmp_path / "d")
    (tmp_path / "d" / "x.txt").write_text("two")
    assert artifacts.tree_fingerprint(tmp_path / "d") != before


def test_read_json_errors_name_the_file(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text("{oops")
    with pytest.raises(ValueError, match="m.json: not valid JSON"):
        artifacts.read_json(bad)
    with pytest.raises(FileNotFoundError, match="missing file: .*none.json"):
        artifacts.read_json(tmp_path / "none.json")
