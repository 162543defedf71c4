"""A conversation as the tokens a language model reads, and which of them it learns: the tokenizer's chat
template (or the plain one), with the assistant's tokens as the targets (litgpt's mask_prompt, TRL's
assistant_only_loss) and every system and user token, and the template's own, masked out.

The assistant turn k spans the characters between the conversation rendered up to k with a generation prompt
(`<|im_start|>assistant\\n`) and rendered through k (its content, the end-of-turn token; trailing whitespace
left out). The whole conversation is rendered once and tokenized once with character offsets; a token is a
target when its characters overlap such a span. A template that does not render each conversation as the
prefix of its continuation cannot be masked this way and is one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# task=instruct's template where the tokenizer has none (lm.template=plain, or a BPE trained here)
PLAIN = ("{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}"
         "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
         "{% if add_generation_prompt %}Assistant:{% endif %}")
TEMPLATE_FILE = "chat_template.jinja"


def set_template(folder: Path, kind: str) -> str:
    """The tokenizer folder's chat template: its own (kind=auto, where it has one) or PLAIN, written to
    chat_template.jinja so that training, generation and the exported model render alike; 'chat' or 'plain'."""
    import json

    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    own = (folder / TEMPLATE_FILE).is_file() or bool(config.get("chat_template"))
    if kind == "auto" and own:
        return "chat"
    if "chat_template" in config:  # the jinja file is the one template the folder holds
        del config["chat_template"]
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / TEMPLATE_FILE).write_text(PLAIN, encoding="utf-8")
    return "plain"


@dataclass
class Example:
    ids: list[int]
    targets: list[int]  # 1 where the token is learned (an assistant token), else 0
    target_bytes: int  # UTF-8 bytes of the assistant contents whose tokens are kept
    truncated: bool


class Renderer:
    """Renders and tokenizes conversations with the tokenizer folder's template."""

    def __init__(self, folder: Path, tok: Any):
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(str(folder))
        self.tok = tok  # the tokenizers.Tokenizer, untruncated: offsets in one Rust call per batch
        self.folder = folder

    def render(self, messages: list[dict], prompt: bool) -> str:
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)

    def spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
        """(the rendered conversation, each assistant turn's target span, each turn's content span)."""
        full = self.render(messages, False)
        targets, contents = [], []
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before, upto = self.render(messages[:k], True), self.render(messages[: k + 1], False)
            if not (upto.startswith(before) and full.startswith(upto)):
                raise ValueError(f"the chat template of {self.folder} does not render a conversation as the prefix of "
                                 f"its continuation, so its assistant tokens cannot be found; set lm.template=plain")
            at = upto.find(m["content"], len(before))
            targets.append((len(before), len(upto.rstrip())))
            contents.append((at, at + len(m["content"])) if at >= 0 else (len(before), len(before)))
        return full, targets, contents

    def examples(self, conversations: list[list[dict]], block: int) -> list[Example]:
        rendered = [self.spans(c) for c in conversations]
        encodings = self.tok.encode_batch([r[0] for r in rendered], add_special_tokens=False) if rendered else []
        return [_example(e, full, targets, contents, block) for e, (full, targets, contents) in zip(encodings, rendered)]


def _example(enc: Any, full: str, targets: list, contents: list, block: int) -> Example:
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(len(offsets), dtype=bool)
    for s, e in targets:
        mask |= (offsets[:, 0] < e) & (offsets[:, 1] > s)
    truncated = len(offsets) > block
    kept_to = int(offsets[block - 1, 1]) if truncated else len(full)
    n_bytes = sum(len(full[s:min(e, kept_to)].encode("utf-8")) for s, e in contents if s < kept_to)
    return Example(list(enc.ids[:block]), mask[:block].astype(np.int8).tolist(), n_bytes, truncated)


def pack(examples: list[Example], block: int, packing: bool) -> list[list[Example]]:
    """Examples into rows: in order, a new row when the next example would not fit in `block` tokens
    (packing), or one example per row. No example is cut between rows."""
    if not packing:
        return [[e] for e in examples]
    rows, current, used = [], [], 0
    for e in examples:
        if current and used + len(e.ids) > block:
            rows.append(current)
            current, used = [], 0
        current.append(e)
        used += len(e.ids)
    return rows + ([current] if current else [])
