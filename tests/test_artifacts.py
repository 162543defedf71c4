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


def _full_disk(*args, **kwargs):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")  # as pyarrow and open() say it: no path


def test_a_full_disk_inside_atomic_dir_names_the_folder_and_leaves_nothing(tmp_path):
    with pytest.raises(OSError, match=rf"^\[Errno 28\] no space left on the disk of {tmp_path}: report/ could not be "
                                      r"written, [0-9.]+ [KMG]iB free; free some space and run the same command again$"):
        with artifacts.atomic_dir(tmp_path / "report"):
            _full_disk()
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_in_write_json_atomic_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts.os, "fsync", _full_disk)
    with pytest.raises(OSError, match=rf"no space left on the disk of {tmp_path}: metrics.json could not be written"):
        artifacts.write_json_atomic(tmp_path / "metrics.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("words, is_full", [
    ("Error while serializing: I/O error: No space left on device (os error 28)", True),  # safetensors
    ("Error while serializing: I/O error: Permission denied (os error 13)", False),
])
def test_safetensors_words_for_a_full_disk_are_recognised(tmp_path, words, is_full):
    from safetensors import SafetensorError

    assert SafetensorError in artifacts.write_errors()
    err = artifacts.no_space_error(tmp_path, 1, "checkpoint step-0000020", SafetensorError(words))
    assert (err is not None) == is_full
    if is_full:
        assert str(err).startswith(f"[Errno 28] no space left on the disk of {tmp_path}: checkpoint step-0000020 "
                                   f"needs about 1 B, ")


def test_another_os_error_inside_atomic_dir_is_itself(tmp_path):
    with pytest.raises(PermissionError, match="denied"):
        with artifacts.atomic_dir(tmp_path / "report"):
            raise PermissionError(13, "denied", str(tmp_path / "report"))
    assert list(tmp_path.iterdir()) == []
