"""Use a trained model: predictions for a new file or folder, generation from prompts, or a chat.

    python pipeline/predict.py --run outputs/tiny/run --input tickets.csv [--output predictions.jsonl]
    python pipeline/predict.py --run outputs/lm/run --prompt "Once upon a time" --max-new-tokens 40 --temperature 0.8
    python pipeline/predict.py --run outputs/chat/run --chat

The input is read, cleaned, chunked and tokenized as the run's data was (its recorded config.yaml and prepared
data), and predicted in evaluate.py's precision and runtime (--precision, --runtime). One output row per input
document, in input order, with its id (the source's id column, else the record's number from 0): a label and class
probabilities, the labels over their tuned thresholds, or a number; a row that clean would drop says why
("skipped"). The output is JSONL, or CSV for a path ending in .csv; it is written part by part (--part-mb of input
each) and a killed run, started again with the same command, continues where it stopped. source.* overrides say
how to read the input (source.text_field=body, source.encoding=latin-1); every other setting is the run's.
"""

import json
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: put the repository root, not pipeline/, on sys.path
    import _entrypoint  # noqa: F401

from pipeline.checks import load_config  # noqa: E402
from pipeline.cli import clear_interrupt, quiet_libraries  # noqa: E402
from pipeline.config import arg_overrides, make_parser  # noqa: E402

READING = ("source",)  # the sections a command line may change: how the new input is read


def make_predict_parser():
    from pipeline.inference import backends

    parser = make_parser("predict.py", __doc__)
    parser.add_argument("--run", help="the training run's folder (default: the --config's <output_dir>/run)")
    parser.add_argument("--input", help="file or folder of new rows (CSV, TSV, JSONL, Parquet, label folders, YAML "
                                        "conversations; the format from the suffix unless source.format is given)")
    parser.add_argument("--output", help="where the rows go (default: <input>.predictions.jsonl; .csv: CSV)")
    parser.add_argument("--checkpoint", default="final", help="final, best, last, a checkpoint name, or a directory")
    parser.add_argument("--batch-size", type=int, help="examples per forward pass (eval.batch_size)")
    parser.add_argument("--precision", choices=("auto", *backends.PRECISIONS), help="inference precision (eval.precision)")
    parser.add_argument("--runtime", choices=backends.RUNTIMES, help="inference runtime (eval.runtime)")
    parser.add_argument("--bad-lines", choices=("error", "skip"), help="unreadable rows: fail naming them, or skip "
                                                                         "and count (source.bad_lines)")
    parser.add_argument("--part-mb", type=float, default=16.0, help="input read and written per part (MB; resume "
                                                                     "continues after the last part written)")
    parser.add_argument("--prompt", action="append", help="causal_lm/instruct: a prompt to continue or answer (repeatable)")
    parser.add_argument("--prompts", help="causal_lm/instruct: a text file of prompts, one a line")
    parser.add_argument("--chat", action="store_true", help="causal_lm/instruct: an interactive chat (Ctrl-D ends it)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt or turn")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (0: all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's probability mass")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed")
    parser.add_argument("--perplexity", action="store_true", help="causal_lm/instruct with --input: each document's "
                                                                   "perplexity too")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", action="store_true", help="also the libraries' progress bars and load reports")
    return parser


def config_from_args(args):
    """The run's recorded config, with the command line's eval settings; the source.* overrides apart (they say how
    to read the input, not how the data was prepared). Any other section overridden is an error."""
    import dataclasses

    from pipeline.evaluation.predictions import recorded_config_path

    run_dir = Path(args.run) if args.run else load_config(args.config).run_dir
    recorded = recorded_config_path(run_dir)
    base = [f"run_folder={run_dir}"]
    evals = {"eval.batch_size": args.batch_size, "eval.precision": args.precision, "eval.runtime": args.runtime,
             "source.bad_lines": args.bad_lines}
    cfg = load_config(recorded, base + arg_overrides(args, evals))
    run_cfg = load_config(recorded, base + [o for o in arg_overrides(args, evals) if o.startswith("eval.")])
    for name in cfg.to_dict():
        if name not in (*READING, "eval") and getattr(cfg, name) != getattr(run_cfg, name):
            raise ValueError(f"{name}.*: predict.py uses the run's recorded {name} settings ({recorded}); only source.* "
                             f"(how the input is read) and the eval flags may be given")
    overrides = {f.name: getattr(cfg.source, f.name) for f in dataclasses.fields(cfg.source)
                 if getattr(cfg.source, f.name) != getattr(run_cfg.source, f.name)}
    return dataclasses.replace(run_cfg, eval=dataclasses.replace(run_cfg.eval, checkpoint=args.checkpoint)), overrides


def main(argv: list[str] | None = None) -> int:
    from pipeline.evaluation import generate, inputs, predictions

    parser = make_predict_parser()
    args = parser.parse_args(argv)
    quiet_libraries(args.verbose)
    asks = [bool(args.input), bool(args.prompt or args.prompts), args.chat]
    if sum(asks) != 1:
        parser.error("give one of --input FILE_OR_FOLDER, --prompt/--prompts FILE, or --chat")
    cfg, overrides = config_from_args(args)
    run = predictions.load(cfg)
    lm = None
    if run.task.predictions is None:  # the language-model tasks predict text
        from pipeline.training import build

        tok = build.load_tokenizer(run.prepared.tokenizer_dir, cfg.model.from_scratch)
        sampling = generate.Sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed)
        sampling.check()
        lm = predictions.Generation(tok, sampling, args.perplexity)
    elif not args.input:
        parser.error(f"task={run.task.name} scores rows: give --input FILE_OR_FOLDER")
    elif args.perplexity:
        parser.error(f"--perplexity: task={run.task.name} is not a language model")
    if args.input:
        path = Path(args.input)
        source = inputs.source_for(cfg.source, path, overrides)
        output = Path(args.output) if args.output else path.with_name(path.name + ".predictions.jsonl")
        counts = predictions.predict_file(run, path, output, source, int(args.part_mb * 2**20), not args.quiet, lm)
        print(json.dumps(counts))
        return 0
    with predictions.generation_precision(run):
        if args.chat:
            code = generate.chat(run.model.eval(), lm.tok, run.prepared.info, lm.sampling)
            clear_interrupt()  # Ctrl-C ends a chat as Ctrl-D does: not an interrupted command
            return code
        prompts = list(args.prompt or [])
        if args.prompts:
            prompts += [line for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
        rows = generate.answers(run.model.eval(), lm.tok, run.prepared.info, prompts, lm.sampling)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if args.output:
        from pipeline import artifacts

        artifacts.write_text_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0

if __name__ == "__main__":
    from pipeline.cli import run_main

    run_main(main)
