"""Test-only driver: accelerate's real FSDP2 path on CPU processes over gloo, driving the project's
checkpoint functions (save_checkpoint / load_checkpoint / load_weights / verify).

accelerate keeps DistributedType.MULTI_CPU on a machine without GPUs even with an FSDP plugin, so
this script (never product code) sets the state's distributed_type to FSDP around `prepare` and
after it; from there accelerate runs its own FSDP2 code: `fully_shard` per BertLayer in prepare,
save_fsdp_model / save_fsdp_optimizer (torch.distributed.checkpoint, SHARDED_STATE_DICT, one shard
file per rank) in save_state, the DCP loads in load_state, and the full-state gather of get_state_dict.

    torchrun --nproc_per_node N fsdp_on_cpu.py MODE OUT_DIR   (or its ranks forked: trainkit.fork_ranks)
MODE: chain   (2 processes) an uninterrupted 6-step run, then 3 steps + save + a fresh model that loads
              the checkpoint + 3 steps; writes results.json
      resume1 (1 process) loads the 2-process step-3 checkpoint of OUT_DIR (re-sharded by DCP) and
              trains steps 4-6; writes resume1.json
      chain-lora  chain with LoRA adapters on the model (the frozen base and the trained adapters and head
              sharded together: peft #484's mixed requires_grad), exported as training exports it
      chains  (2 processes) chain, then chain-lora in OUT_DIR/lora: both in one pair of processes
"""

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from accelerate import Accelerator  # noqa: E402
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin  # noqa: E402

from pipeline.training import checkpoint  # noqa: E402

GLOBAL_BATCH, SEQ, STEPS, SAVE_AT = 8, 12, 6, 3


LORA = False  # MODE chain-lora: the model gets LoRA adapters (pipeline.models.lora), as peft.method=lora does


def make_model():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(cfg)
    if not LORA:
        return model
    from pipeline.models import lora
    from pipeline.schema import PeftConfig

    conf = lora.lora_config(PeftConfig(method="lora", r=4, dropout=0.0), "SEQ_CLS", ["classifier"], None)
    return lora.wrap(model, conf)


def batch(step: int, rank: int, world: int) -> dict:
    """Rank r's slice of the step's global batch: the same rows for any process count."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(1, 64, (GLOBAL_BATCH, SEQ), generator=g)
    labels = torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)
    per = GLOBAL_BATCH // world
    return {"input_ids": ids[rank * per:(rank + 1) * per], "labels": labels[rank * per:(rank + 1) * per]}


def prepared(acc):
    model = make_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))  # a plain function: JSON state
    acc.state.distributed_type = DistributedType.FSDP
    model, opt = acc.prepare(model, opt)
    acc.state.distributed_type = DistributedType.FSDP  # prepare leaves MULTI_CPU behind on a CPU
    return model, opt, sched


def steps(acc, model, opt, sched, first: int, last: int) -> list[float]:
    losses = []
    for step in range(first, last + 1):
        loss = model(**batch(step, acc.process_index, acc.num_processes)).loss
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(acc.reduce(loss.detach(), "mean").item())  # mean of the ranks' slice means
    return losses


def full(acc, model) -> dict:
    return {k: v.clone() for k, v in acc.get_state_dict(model).items()}  # a collective: every rank calls it


def chain(acc, out: Path) -> dict:
    model, opt, sched = prepared(acc)
    ref = steps(acc, model, opt, sched, 1, STEPS)
    ref_weights = full(acc, model)
    acc.free_memory()
    model, opt, sched = prepared(acc)
    first = steps(acc, model, opt, sched, 1, SAVE_AT)
    state = {"step": SAVE_AT, "num_processes": acc.num_processes}
    path = checkpoint.save_checkpoint(acc, out / "checkpoints", f"step-{SAVE_AT}", model, opt, sched, state)
    at_save = full(acc, model)
    acc.free_memory()
    torch.manual_seed(123)  # the fresh model and the RNG differ until the checkpoint is loaded
    model, opt, sched = prepared(acc)
    checkpoint.load_checkpoint(acc, path, model, opt, sched)
    loaded = full(acc, model)
    rest = steps(acc, model, opt, sched, SAVE_AT + 1, STEPS)
    end = full(acc, model)
    result = {"ref": ref, "resumed": first + rest, "lr": sched.get_last_lr()[0]}
    if acc.is_main_process:
        result["final_equal"] = final_export_equal(acc, model, end, out / "final")
        plain = make_model()
        checkpoint.load_weights(path, plain)  # evaluation's path: DCP shards of both ranks, no process group
        result.update(
            files=sorted(checkpoint.read_json(path / "manifest.json")["files"]), verify=checkpoint.verify(path),
            loaded_equal=all(torch.equal(loaded[k], at_save[k]) for k in at_save),
            end_equal=all(torch.equal(end[k], ref_weights[k]) for k in ref_weights),
            eval_equal=all(torch.equal(v, at_save[k]) for k, v in plain.state_dict().items()),
            eval_keys_equal=set(plain.state_dict()) == set(at_save))
    return result


class _NoTokenizer:
    def save_pretrained(self, directory: str) -> None:  # this toy model has no tokenizer to export
        pass


def final_export_equal(acc, model, want: dict, out: Path) -> bool:
    """final/ as training exports it (save_pretrained of the gathered full state dict), read back by
    transformers: the trained weights, not the shards."""
    from transformers import AutoModelForSequenceClassification

    from pipeline.training import rundir

    if LORA:  # as training exports an adapted model: a fresh copy given the trained tensors, merged
        from pipeline.models import lora

        fresh = make_model()
        lora.load_trained(out, fresh, dict(want))
        want = lora.merged_copy(fresh).state_dict()
        rundir.export_final(fresh, _NoTokenizer(), out, {"step": STEPS})
    else:
        rundir.export_final(acc.unwrap_model(model), _NoTokenizer(), out, {"step": STEPS}, dict(want))  # it pops keys
    back = AutoModelForSequenceClassification.from_pretrained(out).state_dict()
    return set(back) == set(want) and all(torch.equal(back[k], want[k]) for k in want)


def resume1(acc, out: Path) -> dict:
    model, opt, sched = prepared(acc)
    checkpoint.load_checkpoint(acc, out / "checkpoints" / f"step-{SAVE_AT}", model, opt, sched)
    return {"resumed": steps(acc, model, opt, sched, SAVE_AT + 1, STEPS), "lr": sched.get_last_lr()[0]}


def main() -> None:
    global LORA
    mode, out = sys.argv[1], Path(sys.argv[2])
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT",
                                            auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["BertLayer"], reshard_after_forward=True)
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    acc.state.fsdp_plugin = plugin  # not kept on MULTI_CPU
    if mode == "resume1":
        result = resume1(acc, out)
        if acc.is_main_process:
            (out / "resume1.json").write_text(json.dumps(result))
    for lora, where in {"chain": [(False, out)], "chain-lora": [(True, out)],
                        "chains": [(False, out), (True, out / "lora")]}.get(mode, []):
        LORA = lora
        where.mkdir(parents=True, exist_ok=True)
        result = chain(acc, where)
        acc.free_memory()
        if acc.is_main_process:
            (where / "results.json").write_text(json.dumps(result))
    acc.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
