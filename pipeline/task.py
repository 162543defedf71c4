"""What a task supplies: the seam between what every run shares and what differs by what the model learns.

The stages up to split, tokenize, the training loop, checkpoints, batching order, the time budget, the
run folder and the inference backends know no task. A task is a folder under pipeline/tasks/ whose
`__init__.py` builds one `Task`, and one line in pipeline/tasks/__init__.py's registry names it
(docs/adding-a-task.md). A task's code imports downwards only (schema, data, inference, metrics),
never the config loader, training or evaluation, which ask the task through this contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Task:
    name: str
    # prepare: the stages after split, placing the shared tokenize stage among its own: (cfg, tokenize) -> [Stage]
    stages: Callable[[Any, Any], list]
    # prepared.json: what the task records about its data from the stage manifests (classification: label_names)
    data_info: Callable[[dict], dict]
    # config checks of the task's own sections, before any work: (cfg) -> None, raising ValueError
    validate: Callable[[Any], None]
    # columns the tokenized splits must hold for training and evaluation, besides input_ids and length
    columns: tuple[str, ...]
    # validation metrics that can rank checkpoints (train.metric_for_best), each: True if higher is better
    metrics: dict[str, bool]
    # training: (pad_id, pad multiple, max_length) -> a collate function from rows to model inputs
    collator: Callable[..., Any]
    # the model: (cfg, tokenizer, data info) -> a new model to train; and the transformers Auto class that
    # loads a trained one (from_pretrained or from_config)
    build_model: Callable[..., Any]
    model_class: Callable[[], Any]
    # predict-and-score: (model outputs of shape (n, ...), the split, data info) -> {metric: value, ...}
    score: Callable[..., dict]
    # evaluate.py: (model, data info, checkpoint) -> None, raising ValueError when the model cannot score this
    # data; (outputs, split, data info) -> the task's part of metrics.json; the report files written into a
    # folder beside metrics.json: (folder, metrics, outputs, split, eval section); the summary printed
    check_model: Callable[..., None]
    evaluate: Callable[..., dict]
    write_report: Callable[..., None]
    summary: Callable[[dict], str]
    # predict's per-row model outputs: (model, rows as dicts of the task's columns, pad id, pad multiple, device)
    # -> tensor (rows, k); None: the logits of a sequence classifier, (rows, num_labels)
    outputs: Callable[..., Any] | None = None
    # training: the count a micro-batch's mean loss is over (causal_lm: its target tokens), so that a step's
    # loss is the mean over all its micro-batches' and processes' targets; None: each micro-batch weighs the same
    loss_tokens: Callable[[dict], Any] | None = None
    # text generated from fixed prompts: (model, tokenizer, cfg, step) -> [{"prompt", "text", ...}], written at each
    # validation (run/samples/, TensorBoard text) and by evaluate.py (samples.jsonl); None: a task that generates none
    samples: Callable[..., list] | None = None
    # train.label_smoothing and train.class_weights: (logits, the batch's targets, per-class weights tensor or None,
    # smoothing) -> the micro-batch's mean loss (None: neither setting applies); and (a split's targets, the label
    # names) -> train rows per class (None: the task has no classes to weigh; causal_lm smooths but has none)
    weighted_loss: Callable[..., Any] | None = None
    class_counts: Callable[..., list] | None = None
    # training: (the model as it trains) -> the function (prepared model, batch, smoothing) -> the micro-batch's mean
    # loss that the loop calls instead of the model's own and weighted_loss, or None where the model needs its own
    # (causal_lm: the output layer and the cross-entropy fused a chunk of positions at a time, never all the logits:
    # tasks/causal_lm/loss.py); None: the model's own loss
    training_loss: Callable[[Any], Any] | None = None
    # the task's settings checked against the model and its tokenizer before train.py or evaluate.py writes any file:
    # (model, tokenizer, cfg) -> None, raising ValueError (causal_lm: each prompt fits the model's positions with
    # lm.sample_tokens); None: nothing to check
    check_settings: Callable[..., None] | None = None
    # peft.method=lora: peft's task type (SEQ_CLS, CAUSAL_LM), and the model's new layers that train in full and
    # are saved with the adapter ((model) -> module names; a classifier's head); None: the model has none
    peft_task_type: str = ""
    head: Callable[[Any], list] | None = None
    # the end of training: (the final model's validation outputs, the validation split, data info, cfg) -> attributes
    # set on the exported model's config.json before final/ is written (multilabel: each label's tuned threshold);
    # None: nothing
    final_config: Callable[..., dict] | None = None
    # split.stratify: (cfg, the loaded rows, engine) -> a picklable function from a row's raw label to its stratum, the
    # class a stratified split keeps in proportion (multilabel: the row's rarest label; regression: the target's
    # quantile bin); it reads what it needs of the rows through engine.reduce. None: the raw label is the stratum
    strata: Callable[..., Any] | None = None
    # the model card (pipeline/training/card.py): the hub's pipeline tag, what the model is ("text classifier"), the
    # lines that describe the data the task's stages made ((stage manifests by name) -> [markdown line]), and the
    # headline figures of evaluate.py's metrics.json as [(hub metric type, name, value)]
    pipeline_tag: str = ""
    model_kind: str = "model"
    card_data: Callable[[dict], list] = lambda manifests: []
    card_metrics: Callable[[dict], list] = lambda metrics: []
    # the config sections besides the shared ones (source ... tokenize, model) that shape the task's prepared data
    # (classification: label; causal_lm: lm): in the split's fingerprint with the task's strata, and repeated by the
    # prepare command an error suggests
    sections: tuple[str, ...] = ()
    # predict.py: (outputs of shape (rows, k) as predict_logits gives them, each row's document index, ascending, data
    # info after check_model) -> one dict per document in that order: what the model says of it (classification: label
    # and class probabilities from the mean of its chunks' logits, as evaluate's documents.jsonl); None: the task
    # predicts by generating (causal_lm, instruct: predict.py's generation)
    predictions: Callable[..., list] | None = None
    # the task reads sentence pairs (source.text_pair_field: a row's text is two texts, pipeline/data/io/pair.py)
    pairs: bool = False
    # the most tokens one example of the prepared data holds, what a model's positions must cover: (cfg, data info)
    # -> int; None: tokenize.max_length (causal_lm: its blocks' lm.block_size, recorded in the data info)
    max_tokens: Callable[[Any, dict], int] | None = None
    # the setting that bounds max_tokens, which an error about it names (causal_lm: lm.block_size)
    max_tokens_setting: str = "tokenize.max_length"
    # train.label_audit: (a micro-batch's logits (rows, k), its targets) -> (rows,) float32, each row's margin, its
    # given label's logit minus the largest other (Pleiss et al. 2020; negative: the model prefers another class);
    # None: the task has no single given label to audit (multilabel, regression, causal_lm)
    margins: Callable[..., Any] | None = None
    # k, the width of `outputs`' (rows, k), which a process with no rows to predict still needs for the gather;
    # 0: a sequence classifier's model.config.num_labels
    output_width: int = 0
    # train.attention=auto in bf16 on a CPU: the attention implementation the task's models train faster with there
    # (classification: eager, measured 1.2-1.4x SDPA's bf16 CPU kernels); "": the model's own
    cpu_bf16_attention: str = ""

