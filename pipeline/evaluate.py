"""Evaluate a trained model on a prepared split: metrics, predictions, confusion matrix.

    python pipeline/evaluate.py --split test [--checkpoint final|best|last|NAME|PATH] [--config ...] [section.key=value ...]
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml pipeline/evaluate.py --split test
    ACCELERATE_USE_CPU=true accelerate launch --config_file configs/accelerate/cpu_multiprocess.yaml pipeline/evaluate.py

Writes <output_dir>/run/eval/<split>-<checkpoint>/ and prints a summary table. Inference runs in
eval.precision (--precision auto|fp32|bf16|int8; default auto: bf16 where the device computes bf16
natively, fp32 elsewhere; metrics.json records what ran and why); accelerate's mixed_precision setting
does not change it. int8 (dynamic quantization, CPU) is 1.06-1.27x fp32 on a 2-core CPU at max_length 128-512
(bench/results/inference.md). eval.runtime
(--runtime torch|onnxruntime) picks the engine: onnxruntime runs a fused ONNX export (CPU), cached beside
the checkpoint.
"""

import dataclasses
import sys

if __name__ == "__main__":  # run as a file: put the repository root, not pipeline/, on sys.path
    import _entrypoint  # noqa: F401

from pipeline.checks import config_from_args  # noqa: E402
from pipeline.cli import quiet_libraries  # noqa: E402
from pipeline.config import make_parser  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from pipeline import tasks
    from pipeline.evaluation import run
    from pipeline.inference import backends

    parser = make_parser("evaluate.py", __doc__)
    parser.add_argument("--split", help="prepared split to evaluate (eval.split)")
    parser.add_argument("--checkpoint", help="final, best, last, a checkpoint name, or a directory (eval.checkpoint)")
    parser.add_argument("--batch-size", type=int, help="examples per forward pass (eval.batch_size)")
    parser.add_argument("--precision", choices=("auto", *backends.PRECISIONS),
                        help="inference precision (eval.precision)")
    parser.add_argument("--runtime", choices=backends.RUNTIMES, help="inference runtime (eval.runtime)")
    parser.add_argument("--bf16", action="store_true", default=None,
                        help="deprecated: --precision bf16 (slow on CPUs without native bf16)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--push-to-hub", metavar="REPO",
                        help="after evaluating final/, upload it with its model card to the hub model repo REPO "
                             "(created private if missing; needs a token: `hf auth login` or HF_TOKEN)")
    parser.add_argument("--verbose", action="store_true", help="also the libraries' progress bars and load reports")
    args = parser.parse_args(argv)
    quiet_libraries(args.verbose)
    if args.bf16:
        if args.precision not in (None, "bf16"):
            parser.error(f"--bf16 (deprecated spelling of --precision bf16) conflicts with --precision {args.precision}")
        print("note: --bf16 is deprecated; it means --precision bf16 (write that instead)", file=sys.stderr)
        args.precision = "bf16"
    cfg = config_from_args(args, {"eval.batch_size": args.batch_size, "eval.precision": args.precision,
                                     "eval.runtime": args.runtime})
    # split and checkpoint names go in as given (a YAML parse would turn "100" into a number)
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(
        cfg.eval, split=args.split or cfg.eval.split, checkpoint=args.checkpoint or cfg.eval.checkpoint))
    if args.push_to_hub and cfg.eval.checkpoint != "final":
        parser.error(f"--push-to-hub uploads final/; it cannot go with --checkpoint {cfg.eval.checkpoint}")
    metrics = run.evaluate_checkpoint(cfg, args.config, progress=not args.quiet)
    if metrics is not None:  # the main process reports; the others only helped predict
        print(tasks.get(cfg.task).summary(metrics))
        if args.push_to_hub:
            from pipeline.training import card

            print(f"uploaded {cfg.run_dir / 'final'} to {card.push(cfg.run_dir / 'final', args.push_to_hub)}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_main

    run_main(main)
