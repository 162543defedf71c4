"""The model card, final/README.md: the metadata the Hugging Face hub reads (base model, task, language and
license of the base where its own card says them, metrics as model-index results) and what the model saw: the
source and its fingerprint, what cleaning and dedup dropped, the leaks removed, the splits, the training
settings, and the evaluation figures with the test set's description.

It is a function of the run folder and the prepare manifests behind its data, written by train.py after the
final export and again by evaluate.py after it scores final/ (then with those figures). It is documentation:
no loader reads it, so final/manifest.json leaves it out (artifacts.UNLISTED) and rewriting it never makes
final/ fail its check.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from pipeline import artifacts, tasks
from pipeline.escape import markdown, markdown_code
from pipeline.training import audit, trackers
from pipeline.training.rundir import read_records

CARD = "README.md"
OPTIMIZER_NAMES = {"adamw": "AdamW", "adafactor": "Adafactor", "sgd": "SGD", "lion": "Lion"}
TOOL = "finetune-pipeline"


def write(cfg) -> Path | None:
    """final/README.md from the run folder; None when there is no final model (yet)."""
    run_dir = cfg.run_dir
    final = run_dir / "final"
    if not (final / "config.json").is_file() or not (final / "state.json").is_file():
        return None
    staged = run_dir / f".{CARD}.staged"  # written beside final/, not in it: a crash leaves no stray file inside
    artifacts.write_text_atomic(staged, render(cfg, run_dir))
    os.replace(staged, final / CARD)
    return final / CARD


def render(cfg, run_dir: Path) -> str:
    from huggingface_hub import EvalResult, ModelCardData

    task = tasks.get(cfg.task)
    state = artifacts.read_json(run_dir / "final" / "state.json")
    info = artifacts.read_json(run_dir / "run_info.json") if (run_dir / "run_info.json").is_file() else {}
    data = _data(cfg, state)
    evaluations = _evaluations(run_dir, state)
    base, base_meta = _base(cfg)
    dataset_type = cfg.source.path if cfg.source.format == "hub" else "local"
    dataset_name = _source_name(cfg)
    figures = {split: task.card_metrics(m) for split, m in evaluations.items()}
    results = [EvalResult(task_type=task.pipeline_tag, dataset_type=dataset_type, dataset_name=dataset_name,
                          dataset_split=split, dataset_config=cfg.source.hub_config or None,
                          metric_type=kind, metric_name=f"{name} ({split})", metric_value=float(value))
               for split, rows in figures.items() for kind, name, value in rows]
    adapter_only = cfg.peft.method != "none" and not cfg.peft.merge_final
    meta = ModelCardData(
        base_model=base if _is_hub_id(base) else None,
        library_name="peft" if adapter_only else "transformers",
        pipeline_tag=task.pipeline_tag,
        license=base_meta.get("license"),
        language=base_meta.get("language"),
        datasets=[cfg.source.path] if cfg.source.format == "hub" else None,
        metrics=sorted({kind for rows in figures.values() for kind, _, _ in rows}) or None,
        tags=[TOOL, cfg.task, *(["lora"] if cfg.peft.method == "lora" else [])],
        model_name=" ".join(filter(None, (trackers.experiment_name(cfg),
                                          Path(cfg.run_folder).name if cfg.run_folder else ""))),
        eval_results=results or None,
    )
    body = "\n".join([
        f"# {markdown(meta.model_name)}", "",
        f"{_describe_model(cfg, base, task)}; trained and evaluated with {TOOL}"
        f"{' at commit ' + info['git_commit'][:12] if info.get('git_commit') else ''}.", "",
        "## Data", "", *_data_lines(cfg, task, data), "",
        "## Training", "", *_training_lines(cfg, state, info), "",
        *_audit_lines(run_dir),
        "## Evaluation", "", *_evaluation_lines(state, evaluations, figures, run_dir), "",
        "## Use", "", *_use_lines(cfg, task, run_dir, adapter_only), "",
    ])
    return f"---\n{meta.to_yaml()}\n---\n\n{body}"


# ---------------------------------------------------------------- what went in


def _is_hub_id(name: str) -> bool:
    return bool(name) and name.count("/") == 1 and not name.startswith(("/", ".", "~", "package:")) \
        and not Path(name).exists()


def _base(cfg) -> tuple[str, dict]:
    """The base model's name and its own card's license and language (read from its folder where it has one)."""
    if cfg.model.from_scratch:
        return "", {}
    name = cfg.model.name_or_path
    try:
        from pipeline.models.pretrained import resolve_pretrained

        folder = Path(resolve_pretrained(name))
    except (OSError, ValueError):
        return name, {}
    card = folder / CARD
    if not card.is_file():
        return name, {}
    try:
        from huggingface_hub import ModelCard

        found = ModelCard.load(card).data.to_dict()
    except Exception:  # noqa: BLE001 - a base card the hub library cannot parse says nothing we can use
        return name, {}
    return name, {k: found[k] for k in ("license", "language") if found.get(k)}


def _describe_model(cfg, base: str, task) -> str:
    kind = task.model_kind
    what = f"A {'sentence-pair ' if cfg.source.text_pair_field else ''}{kind}"
    if cfg.model.from_scratch:
        m = cfg.model
        return f"{what}: a {m.from_scratch} of {m.num_layers} layers and hidden size {m.hidden_size}, from scratch"
    how = f" with LoRA (r {cfg.peft.r}, alpha {cfg.peft.alpha:g})" if cfg.peft.method == "lora" else ""
    return f"{what} fine-tuned from {markdown_code(base)}{how}"


def _source_name(cfg) -> str:
    s = cfg.source
    where = f"{s.package}:{s.path}" if s.package else s.path
    return f"{where}" + (f" ({s.hub_config})" if s.hub_config else "")


def _data(cfg, state: dict) -> dict:
    """The prepare manifests behind the run's data, when the prepared data is still the data it trained on."""
    from pipeline.data.runner import PREPARED, stage_manifests

    pointer = cfg.data_dir / PREPARED
    if not pointer.is_file():
        return {}
    prepared = artifacts.read_json(pointer)
    trained_on = state.get("fingerprints", {}).get("data")
    if trained_on not in (prepared.get("content_fingerprint"), prepared.get("fingerprint")):
        return {"changed": True}
    return {"prepared": prepared, "manifests": stage_manifests(Path(prepared["stage_dir"]))}


def _count(d: dict) -> str:
    return ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in d.items() if v) or "none"


def _data_lines(cfg, task, data: dict) -> list[str]:
    if data.get("changed"):
        return [f"The prepared data in {markdown_code(cfg.data_dir)} has changed since this model was trained; its "
                f"manifests no "
                f"longer describe what the model saw."]
    man = data.get("manifests") or {}
    if not man:
        return [f"No prepare manifests were found next to {markdown_code(cfg.data_dir)}."]
    lines = []
    load = man.get("load", {})
    if load:
        lines.append(f"- **Source**: {cfg.source.format} {markdown_code(_source_name(cfg))}, sha256 "
                     f"`{load.get('input_fingerprint', '?')}`; {load.get('rows_in', 0):,} rows read, "
                     f"{load.get('rows_out', 0):,} kept (dropped: {_count(load.get('dropped', {}))}).")
    clean = man.get("clean", {})
    if clean:
        stats = clean.get("stats", {})
        repaired = f"; mojibake repaired in {stats['mojibake_repaired']:,}" if stats.get("mojibake_repaired") else ""
        lines.append(f"- **Cleaning** dropped: {_count(clean.get('dropped', {}))}{repaired}.")
    dedup = man.get("dedup", {})
    if dedup:
        c = (dedup.get("config") or [{}])[0]
        how = f"MinHash, Jaccard >= {c.get('threshold')} on word {c.get('ngram')}-grams" \
            if c.get("method") == "minhash" else c.get("method", "?")
        lines.append(f"- **Deduplication** ({how}) dropped: {_count(dedup.get('dropped', {}))}.")
    split = man.get("split", {})
    if split:
        st = split.get("stats", {})
        docs = st.get("documents", {})
        c = (split.get("config") or [{}])[0]
        leaks = st.get("leaks_found", {})
        leak = (f"; documents with a near-duplicate in train (split.leakage `{c.get('leakage')}`): {_count(leaks)}"
                if leaks else "")
        cont = st.get("contamination") or {}
        if cont.get("checks"):
            found = ", ".join(f"{markdown(x['split'])} against {markdown(x['against'].replace('_', ' '))} "
                              f"{x['contaminated']:,}"
                              for x in cont["checks"])
            leak += (f"; documents sharing a {cont['ngram']}-word n-gram (split.contamination `{cont['policy']}`): "
                     f"{found}")
        if st.get("pair_sides"):
            both = ", ".join(f"{markdown(k)} {v['both_sides']:,}" for k, v in st["pair_sides"].items())
            leak += f"; sentence pairs whose two sides both occur in train, reported: {both}"
        kept = "the source's own splits kept" if st.get("source_split_kept") else "split by ratio"
        sizes = ", ".join(f"{markdown(k)} {v:,} documents" for k, v in docs.items())
        lines.append(f"- **Splits** ({kept}): {sizes}{leak}.")
    lines += task.card_data(man)  # the task's stages after split: labels or targets, tokens
    prepared = data.get("prepared", {})
    fingerprint = prepared.get("content_fingerprint") or prepared.get("fingerprint")
    lines.append(f"- **Prepared data fingerprint**: `{fingerprint}`.")
    return lines


def _training_lines(cfg, state: dict, info: dict) -> list[str]:
    t = cfg.train
    launches = info.get("launches", [])
    first = launches[0] if launches else {}
    procs = first.get("num_processes", 1)
    rows = [
        ("steps", f"{state.get('step')} (epoch {state.get('epoch')})"),
        ("batch", f"{t.batch_size} x {procs} process(es) x {t.grad_accum} accumulation = "
                  f"{t.batch_size * procs * t.grad_accum} examples per step"),
        ("optimizer", f"{OPTIMIZER_NAMES[t.optimizer]}{f' (momentum {t.momentum:g})' if t.optimizer == 'sgd' else ''}, "
                      f"lr {t.lr:g}, weight decay {t.weight_decay:g}, gradient clipping {t.max_grad_norm:g}"),
        ("schedule", _schedule(t)),
        ("precision", {"no": "fp32", "": "fp32", None: "fp32"}.get(first.get("mixed_precision"),
                                                                  first.get("mixed_precision"))),
        ("seed", str(t.seed)),
        ("launches", f"{len(launches)} (resumed {max(len(launches) - 1, 0)} time(s))"),
    ]
    if t.label_smoothing or t.class_weights:
        rows.append(("loss", f"label smoothing {t.label_smoothing:g}; class weights "
                             f"{markdown(', '.join(map(str, t.class_weights))) or 'equal'}"))
    if t.early_stopping_patience:
        stop = state.get("early_stopped")
        how = f"patience {t.early_stopping_patience} validations, delta {t.early_stopping_delta:g}"
        rows.append(("early stopping", f"{how}: stopped at step {stop['stopped_at']}; this is step "
                                       f"{stop['best_step']}'s model" if stop else f"{how}: did not stop"))
    if cfg.peft.method == "lora":
        p = cfg.peft
        rows.append(("LoRA", f"r {p.r}, alpha {p.alpha:g}, dropout {p.dropout:g}, targets "
                             f"{markdown(', '.join(p.target_modules)) or 'peft default'}"))
    return ["| setting | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def _audit_lines(run_dir: Path) -> list[str]:
    """train.label_audit's section: the train documents flagged as likely mislabeled, in all and per class."""
    found = audit.read_summary(run_dir)
    if found is None:
        return []
    per = ", ".join(f"{markdown(n)} {c['flagged']:,} of {c['documents']:,}" for n, c in found["per_class"].items())
    return ["## Label audit", "",
            f"Area under the margin over training (Pleiss et al. 2020; train.label_audit, docs/label-audit.md): "
            f"{found['flagged']:,} of {found['documents']:,} train documents flagged as likely mislabeled (of each "
            f"given class, the confident-joint count of issues (Northcutt et al. 2021), lowest AUM first); per given "
            f"class: {per}. The ranked list is the run's "
            f"`{audit.REPORT}`; the training was not changed by it.", ""]


def _schedule(t) -> str:
    after = {"cosine": f"cosine decay to {t.min_lr_ratio:g} x lr", "linear": f"linear decay to {t.min_lr_ratio:g} x lr",
             "constant": "constant",
             "wsd": f"constant, then linear decay to {t.min_lr_ratio:g} x lr over the last {t.decay_ratio:.0%} of steps "
                    f"(warmup-stable-decay)"}[t.lr_schedule]
    return f"linear warmup over {t.warmup_ratio:.0%} of steps, {after}"


def _evaluations(run_dir: Path, state: dict) -> dict[str, dict]:
    """evaluate.py's metrics.json of final/ per split, where it scored this final model (its step)."""
    out = {}
    for path in sorted((run_dir / "eval").glob("*-final/metrics.json")):
        try:
            m = artifacts.read_json(path)
        except ValueError:
            continue
        if m.get("checkpoint") == "final" and m.get("step") == state.get("step"):
            out[m["split"]] = m
    return out


def _last_validation(run_dir: Path) -> dict | None:
    return next((r for r in reversed(read_records(run_dir / "metrics.jsonl")) if isinstance(r.get("eval"), dict)), None)


def _evaluation_lines(state: dict, evaluations: dict, figures: dict, run_dir: Path) -> list[str]:
    lines = []
    best = state.get("best") or {}
    val = _last_validation(run_dir)
    if val:
        shown = ", ".join(f"{markdown(k)} {v:.4f}" for k, v in val["eval"].items() if isinstance(v, float))
        lines.append(f"- **Validation** at step {val['step']}: {shown}.")
    if best.get("value") is not None:
        lines.append(f"- **Best validation {markdown(best['metric'])}**: {best['value']:.4f} at step {best['step']}.")
    for split, m in evaluations.items():
        shown = ", ".join(f"{name} {value:.4f}" for _, name, value in figures[split])
        lines.append(f"- **{markdown(split)}** ({m.get('precision', 'fp32')}, {m.get('runtime', 'torch')}): {shown}.")
        if m.get("test_set"):
            lines.append(f"  Test set: {markdown(m['test_set'])}.")
    if not evaluations:
        lines.append("- No evaluate.py figures yet: `python pipeline/evaluate.py --split test` adds them here.")
    return lines


def _use_lines(cfg, task, run_dir: Path, adapter_only: bool) -> list[str]:
    final = run_dir / "final"
    if adapter_only:
        cls = "AutoPeft" + task.model_class().__name__.removeprefix("Auto")  # AutoPeftModelForSequenceClassification
        snippet = ["```python", f"from peft import {cls}", f"model = {cls}.from_pretrained({_py(final / 'adapter')})",
                   "```"]
    else:
        snippet = ["```python", "from transformers import pipeline",
                   f"pipe = pipeline({_py(task.pipeline_tag)}, model={_py(final)})", "```"]
    return snippet + ["", *_predict_lines(task, run_dir)]


def _predict_lines(task, run_dir: Path) -> list[str]:
    """The predict.py commands for this run: new files cleaned and chunked as the model was trained, resumable; the
    language models' prompts and chat."""
    run = shlex.quote(str(run_dir))
    if task.predictions is None:
        return ["With this project (`python pipeline/predict.py`, [docs/predict.md](docs/predict.md)): a prompt, a "
                "chat, or a file's rows:", "", "```bash",
                f"python pipeline/predict.py --run {run} --prompt \"Hello\" --max-new-tokens 40",
                f"python pipeline/predict.py --run {run} --chat",
                f"python pipeline/predict.py --run {run} --input prompts.jsonl --perplexity", "```"]
    return ["With this project, on a new file cleaned and chunked as the training data was (`python pipeline/predict.py`"
            ", [docs/predict.md](docs/predict.md)):", "", "```bash",
            f"python pipeline/predict.py --run {run} --input new.csv --output predictions.jsonl", "```"]


def _py(value) -> str:
    """A Python string literal of `value` for the card's snippet, whatever its path holds (quotes, newlines)."""
    return json.dumps(str(value), ensure_ascii=False)


def push(final: Path, repo: str) -> str:
    """Upload final/ (weights, tokenizer, card; not its manifest) to the hub model repo `repo`, created private
    if missing. Returns the commit's URL. Online only; a failure is one line naming the repo."""
    from huggingface_hub import HfApi

    problem = artifacts.check_files(final)
    if problem is not None:
        raise ValueError(f"{final}: {problem}; not uploading a final model that fails its check")
    api = HfApi()
    try:
        api.create_repo(repo, repo_type="model", private=True, exist_ok=True)
        info = api.upload_folder(folder_path=str(final), repo_id=repo, repo_type="model",
                                 ignore_patterns=[artifacts.MANIFEST], commit_message="Upload from finetune-pipeline")
    except Exception as e:  # noqa: BLE001 - offline, no token, no rights: one line, not a traceback
        raise ValueError(f"--push-to-hub {repo}: {type(e).__name__}: {' '.join(str(e).split())[:300]}") from None
    return str(getattr(info, "commit_url", info))
