"""Sweep hyperparameters: N trials of train.py over a search space, with Optuna (pipeline/sweeps/study.py).

    python pipeline/sweep.py --space configs/sweeps/lr.yaml [--config configs/tiny.yaml] [section.key=value ...]

Each trial is a normal run folder under <output_dir>/sweeps/<name>/trial-NNNN/ (evaluate it with
`python pipeline/evaluate.py --config <trial>/config.yaml`), its validation metric reported to Optuna as it
trains and pruned when it falls behind the median. Killed at any moment, the same command continues: finished
trials are kept, an interrupted one resumes from its last checkpoint, none runs twice. The prepared data must
exist (`python pipeline/prepare.py --config ...`). Exit codes: 0 done; 2 bad input; 75 stopped by a signal.
"""

if __name__ == "__main__":  # run as a file: put the repository root, not pipeline/, on sys.path
    import _entrypoint  # noqa: F401

from pathlib import Path  # noqa: E402

from pipeline.cli import quiet_libraries  # noqa: E402
from pipeline.config import make_parser  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("sweep.py", __doc__)
    parser.add_argument("--space", required=True, help="the sweep file: name, trials, seed, params (configs/sweeps/)")
    parser.add_argument("--trials", type=int, help="trials in all (the sweep file's `trials`); raise it to extend a sweep")
    parser.add_argument("--storage", default="", metavar="URL",
                        help="Optuna's RDB storage (default: sqlite in the sweep folder); a database server every "
                             "machine reaches (postgresql://...) lets sweeps on several machines share one study")
    parser.add_argument("--verbose", action="store_true", help="also the libraries' progress bars and load reports")
    args = parser.parse_args(argv)
    quiet_libraries(args.verbose)
    from pipeline import tasks
    from pipeline.data.prepared import load_prepared
    from pipeline.sweeps import study

    sweep = study.open_sweep(Path(args.space), Path(args.config), list(args.overrides), args.trials, args.storage)
    load_prepared(sweep.cfg, tasks.get(sweep.cfg.task), args.config)  # the trials' data: prepared before the first trial
    return study.run(sweep)


if __name__ == "__main__":
    from pipeline.cli import run_main

    run_main(main)
