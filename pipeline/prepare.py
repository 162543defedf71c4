"""Prepare the data: load → clean → dedup → split → label → tokenize, each stage cached on disk.

    python pipeline/prepare.py --dedup minhash [--config configs/default.yaml] [section.key=value ...]
    python pipeline/prepare.py --engine ray [ray.address=auto]     # the same stages on Ray Data

Exit codes: 0 prepared; 2 one `error:` line (bad config or input, a Ray worker or Ray itself lost), and no
stage that did not finish is marked complete, so a rerun continues; 130 Ctrl-C.
"""

if __name__ == "__main__":  # run as a file: put the repository root, not pipeline/, on sys.path
    import _entrypoint  # noqa: F401

import sys  # noqa: E402

from pipeline.checks import config_from_args  # noqa: E402
from pipeline.cli import EXIT_USAGE, quiet_libraries  # noqa: E402
from pipeline.config import make_parser  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from pipeline import tasks
    from pipeline.data import runner
    from pipeline.data.engines.ray import driver

    parser = make_parser("prepare.py", __doc__)
    parser.add_argument("--dedup", choices=("none", "exact", "minhash"), help="shorthand for dedup.method=...")
    parser.add_argument("--force", action="store_true", help="redo every stage, cached or not")
    parser.add_argument("--from", dest="from_stage", metavar="STAGE", help="redo this stage and the ones after it (load, clean, dedup, split, then the task's: label, tokenize for classification)")
    parser.add_argument("--num-proc", type=int, help="shorthand for prepare.num_proc=N: local processes for clean "
                        "and for the MinHash signatures of dedup and the leakage check")
    parser.add_argument("--engine", choices=("local", "ray"), help="shorthand for prepare.engine=...: run the "
                        "stages in this process, or on Ray Data (ray.address: a cluster, or a local Ray)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--verbose", action="store_true", help="also the libraries' progress bars and load reports")
    args = parser.parse_args(argv)
    quiet_libraries(args.verbose)
    cfg = config_from_args(
        args, {"dedup.method": args.dedup, "prepare.num_proc": args.num_proc, "prepare.engine": args.engine}
    )
    try:
        if cfg.prepare.engine == "ray" and not driver.is_driver():  # Ray may end its driver process: watch it
            return driver.supervise(sys.argv[1:] if argv is None else argv)
        rows = runner.run(cfg, tasks.get(cfg.task), force=args.force, from_stage=args.from_stage, progress=not args.quiet)
    except runner.StageFailed as e:  # a worker lost for good, Ray gone: one line, and no stage marked complete
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(runner.format_report(rows))
    print(f"prepared data: {cfg.data_dir}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_main

    run_main(main)
