"""Train (or resume) the model of the config's task on the prepared data with Hugging Face Accelerate.

    accelerate launch pipeline/train.py [--config configs/default.yaml] [--resume auto|PATH] [section.key=value ...]
    python pipeline/train.py ...                      (the same, one process)

Exit codes: 0 finished (or nothing left to do); 2 bad config or input, nothing done;
65 halted on a non-finite loss/gradient (train.nan_policy); 75 stopped by SIGTERM/SIGINT after
saving a checkpoint: rerun with --resume auto to continue exactly where it stopped.
"""


if __name__ == "__main__":  # run as a file: put the repository root, not pipeline/, on sys.path
    import _entrypoint  # noqa: F401

from pipeline.checks import config_from_args  # noqa: E402
from pipeline.cli import quiet_libraries  # noqa: E402
from pipeline.config import make_parser  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("train.py", __doc__)
    once = parser.add_mutually_exclusive_group()
    once.add_argument(
        "--resume",
        metavar="auto|PATH",
        help="continue a run: 'auto' takes the newest intact checkpoint of the run (fresh start if none), "
        "PATH a given checkpoint folder",
    )
    once.add_argument(
        "--restart", action="store_true",
        help="start over in a run folder that holds a run, finished or not: its files are moved to "
        "<run>/set_aside/<time>/, never deleted",
    )
    parser.add_argument("--verbose", action="store_true", help="also the libraries' progress bars and load reports")
    args = parser.parse_args(argv)
    quiet_libraries(args.verbose)
    cfg = config_from_args(args)
    from pipeline.training.loop import train

    return train(cfg, args.config, args.resume, args.restart)


if __name__ == "__main__":
    from pipeline.cli import run_main

    run_main(main)
