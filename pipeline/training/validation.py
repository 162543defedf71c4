"""Validation during training: the same predict-and-score code as `evaluate.py`.

`predict_logits` plans, shards, pads and gathers exactly as the evaluate command does, and
`logit_metrics` scores them, so training's last validation numbers and
`evaluate.py --split validation` agree by construction, and a metric added there shows up here.
"""

from __future__ import annotations

from pipeline.inference.predict import predict_logits
from pipeline.models import lora


def outputs(acc, model, ds, batch_size: int, task, precision: str = "fp32", runtime: str = "torch", scratch=None):
    """The model's outputs on `ds` as it is now (classification: logits, (n, labels)), in dataset order on every
    process, as `evaluate` scores them."""
    was_training = model.training
    # unwrap_model keeps accelerate's autocast wrapper: fp32 validation runs in the precision training does
    scored = acc.unwrap_model(model)
    if lora.is_adapted(scored) and (precision == "int8" or runtime == "onnxruntime"):
        scored = lora.merged_copy(scored)  # quantization and export take a plain model, as evaluate.py's
    logits = predict_logits(scored, ds, batch_size, acc, precision, progress=False,
                            runtime=runtime, scratch=scratch, outputs=task.outputs, columns=task.columns,
                            width=task.output_width)
    model.train(was_training)
    return logits


def validate(acc, model, ds, batch_size: int, task, info: dict, precision: str = "fp32",
             runtime: str = "torch", scratch=None) -> dict:
    """Every scalar validation metric of the model as it is now, as the task scores its outputs
    (`task.score`; classification: loss, accuracy, macro/micro F1, examples); `info` is the data's
    (prepared.json's data_info).

    `precision` is eval.precision (backends.precision_of): int8 scores a quantized copy, as
    evaluate.py would, and leaves the training model untouched. `runtime` is eval.runtime:
    onnxruntime puts these weights into the run's exported graph (exported once per run, kept under
    `scratch`, the run directory: inference/onnx_template.py) in a temporary folder there, removed once
    loaded; the scores are those of a full export of these weights."""
    return task.score(outputs(acc, model, ds, batch_size, task, precision, runtime, scratch), ds, info)
