"""The language model's training loss with the output layer and the cross-entropy fused, a chunk of positions at a
time: the (batch x block x vocabulary) logits are never held whole.

The model's own loss (transformers' ForCausalLMLoss) computes every position's logits, keeps them for backward,
upcasts them to fp32 and takes log_softmax over the vocabulary: at configs/shakespeare.yaml's 16 x 256 x 8,000 that
is 131 MB of fp32 logits, the same again for their log-probabilities and their gradient, and (a torch.profiler of
that step, fp32) ~10% of a CPU step in log_softmax, its backward and the fill of the gradient. Here the model runs to its last hidden state (its forward
asked for one position's logits only: `logits_to_keep=1`, and the hidden states), and for each chunk of positions
the forward computes the logits, their log-sum-exp, the loss and, at once, the gradients of the hidden states and of
the output weight (softmax - target, the classic closed form), so backward only scales the saved gradients. The same
matmuls run (one forward, two backward), in the same precision as autocast would run them; the loss and the
gradients are the model's own to float rounding (tests: 1e-5), label smoothing included.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from pipeline.tasks.causal_lm.collate import IGNORE

CHUNK_ELEMENTS = 1 << 23  # logits of one chunk: 8 M fp32 values, 32 MB (1,048 positions of an 8,000 vocabulary)


@functools.cache  # the class is built once, torch imported only when a loss is computed
def _fused():
    import torch

    class FusedLinearCrossEntropy(torch.autograd.Function):
        """mean over kept targets of cross_entropy(h @ w.T, targets, label_smoothing); gradients computed in forward."""

        @staticmethod
        def forward(ctx, h, w, targets, smoothing: float, dtype):
            n, vocab = h.shape[0], w.shape[0]
            keep = targets != IGNORE
            count = keep.sum().clamp(min=1).to(torch.float32)
            safe = targets.clamp(min=0)[:, None]
            grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device) if h.requires_grad else None
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if w.requires_grad else None
            wc, total = w.to(dtype), torch.zeros((), dtype=torch.float64, device=h.device)
            step = max(1, CHUNK_ELEMENTS // vocab)
            with torch.autocast(h.device.type, enabled=False):  # each matmul in `dtype`, autocast's or the model's
                for s in range(0, n, step):
                    hc = h[s:s + step].to(dtype)
                    z = (hc @ wc.t()).float()  # (chunk, vocab) logits, upcast as the model's own loss does
                    lse = torch.logsumexp(z, -1)
                    nll = lse - z.gather(1, safe[s:s + step]).squeeze(1)
                    if smoothing:  # (1 - e) * nll + e * the mean over the vocabulary of -log p
                        nll = (1 - smoothing) * nll + smoothing * (lse - z.mean(-1))
                    kc = keep[s:s + step]
                    total += (nll * kc).sum(dtype=torch.float64)
                    g = z.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                    g.scatter_add_(1, safe[s:s + step], torch.full((len(kc), 1), smoothing - 1.0, device=h.device))
                    if smoothing:
                        g.sub_(smoothing / vocab)
                    g = g.mul_((kc / count)[:, None]).to(dtype)  # d loss / d logits
                    if grad_h is not None:
                        grad_h[s:s + step] = g @ wc
                    if grad_w is not None:
                        grad_w += g.t() @ hc
            ctx.save_for_backward(grad_h, grad_w)
            ctx.dtypes = (h.dtype, w.dtype)
            return (total / count).to(torch.float32)

        @staticmethod
        def backward(ctx, grad):
            grad_h, grad_w = ctx.saved_tensors
            dh = None if grad_h is None else (grad_h * grad).to(ctx.dtypes[0])
            dw = None if grad_w is None else (grad_w * grad).to(ctx.dtypes[1])
            return dh, dw, None, None, None

    return FusedLinearCrossEntropy


def fused_loss(hidden, weight, labels, smoothing: float = 0.0):
    """The next-token loss of (batch, block, hidden) states under an output weight (vocab, hidden): labels shifted by
    one (the model's own convention), IGNORE left out, the mean over the targets."""
    import torch

    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE)], 1).reshape(-1)
    h = hidden.reshape(-1, hidden.shape[-1])
    on = torch.is_autocast_enabled(h.device.type)
    dtype = torch.get_autocast_dtype(h.device.type) if on else h.dtype
    return _fused().apply(h, weight, targets, float(smoothing), dtype)


def _output_layer(model) -> Any:
    """The model's output nn.Linear when the fused loss computes exactly its loss: no bias, no scaling or capping of
    the logits after it (Gemma's softcap, Cohere's logit_scale), a forward taking logits_to_keep; else None."""
    import inspect

    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: the model it adapts
    head = model.get_output_embeddings()
    conf = base.config
    if (type(head) is not torch.nn.Linear or head.bias is not None
            or "logits_to_keep" not in inspect.signature(base.forward).parameters
            or any(getattr(conf, a, None) not in (None, 1, 1.0) for a in ("final_logit_softcapping", "logit_scale",
                                                                          "logits_scaling"))):
        return None
    return head


def training_loss(model) -> Callable | None:
    """For a built model: the function (prepared model, batch, smoothing) -> the micro-batch's mean loss that the
    loop calls, or None where the model's own must run. Called on the model as it trains (LoRA's adapter on). Checked once on 2 x 16 fixed ids in eval mode (no random
    draw: the run's RNG stream is untouched) against the model's own loss, so an architecture that transforms its
    logits in a way _output_layer does not know keeps its own loss."""
    import torch

    head = _output_layer(model)
    if head is None:
        return None
    vocab, conf = head.weight.shape[0], model.config
    width = min(16, getattr(conf, "max_position_embeddings", None) or 16)
    ids = (torch.arange(2 * width, device=head.weight.device).view(2, width) * 7919) % vocab
    was = model.training
    model.eval()
    with torch.no_grad():
        own = model(input_ids=ids, labels=ids).loss
        out = model(input_ids=ids, logits_to_keep=1, output_hidden_states=True)
        fused = fused_loss(out.hidden_states[-1], head.weight, ids)
    model.train(was)
    if not torch.allclose(own.float(), fused, rtol=1e-4, atol=1e-5):
        return None

    def loss(prepared, batch: dict, smoothing: float = 0.0):
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        out = prepared(**inputs, logits_to_keep=1, output_hidden_states=True)
        return fused_loss(out.hidden_states[-1], head.weight, batch["labels"], smoothing)

    return loss
