"""Tokenize stage: WordPiece or byte-level BPE ids with attention masks, truncated, never padded.

Truncation (`tokenize.truncation`) keeps a long text's head (the default), its tail, or both ends
(head_tail: Sun et al. 2019, "How to Fine-Tune BERT for Text Classification?"), with the special
tokens of the tokenizer's template ([CLS] ... [SEP], or none for a byte-level BPE) in place.

The tokenizer is either a pretrained one (its files copied into the artifact) or a new one trained
here on the train split only, so validation/test text never shapes the vocabulary. Encoding uses
the `tokenizers` library directly: fast batch encoding in Rust, and no torch import in prepare.
The artifact's `tokenizer/` folder is a regular transformers tokenizer folder (AutoTokenizer loads it).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np

from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import SPLITS, TEXT, add_up, column
from pipeline.data.io import pair
from pipeline.models.pretrained import resolve_pretrained
from pipeline.schema import TokenizeConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "merges.txt",
                   "chat_template.jinja")
WORDPIECE_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
BPE_SPECIALS = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": "<pad>"}


def local_tokenizer(name: str) -> Path | None:
    """The folder of a pretrained tokenizer given as a path or `package:MODULE`; None for a hub id.
    Cheap, so prepare checks it before any stage runs: a mistyped path fails first, not last."""
    src = resolve_pretrained(name)
    looks_local = src.startswith(("/", ".", "~")) or Path(src).exists()
    if not looks_local:
        return None
    folder = Path(src).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer '{name}': {folder} is not a folder (tokenize.pretrained, or "
                                f"model.name_or_path when that is empty); point it at a tokenizer folder or a hub id")
    return folder


def _pretrained_files(name: str, dest: Path) -> Path:
    """Copy a pretrained tokenizer's files into `dest`; returns the tokenizer.json path."""
    folder = local_tokenizer(name)
    if folder is None:  # a hub id: fetch only the tokenizer files (fails fast and clearly when offline)
        from huggingface_hub import snapshot_download

        try:
            folder = Path(snapshot_download(name, allow_patterns=list(TOKENIZER_FILES)))
        except Exception as e:  # noqa: BLE001 - the hub client raises many types; the user needs one message
            raise FileNotFoundError(f"tokenizer '{name}' is not a local folder and could not be fetched from the hub: "
                                    f"{' '.join(str(e).split())}") from None
    dest.mkdir(parents=True, exist_ok=True)
    if (folder / "tokenizer.json").is_file():
        for f in TOKENIZER_FILES:
            if (folder / f).is_file():
                shutil.copy2(folder / f, dest / f)
    else:  # a slow-only tokenizer (vocab.txt / merges.txt): let transformers convert it once
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(folder)).save_pretrained(str(dest))
    return dest / "tokenizer.json"


def _wordpiece(texts, vocab_size: int, min_frequency: int, numbered_first: list[str]):
    """tokenizers' WordPiece training, with `numbered_first` numbered right after the specials."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                        special_tokens=list(WORDPIECE_SPECIALS.values()) + numbered_first)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def continuation_tokens(texts) -> list[str]:
    """The `##c` tokens WordPiece training on `texts` makes, sorted: a pass without merges over each
    distinct space-separated piece of the texts. The normalizer acts on each character alone and the
    pre-tokenizer splits at every space, so the pieces hold the same words as the texts (tested on
    hostile text), at a fraction of the cost of counting every word again."""
    pieces: set[str] = set()
    for text in texts:
        pieces.update(text.split(" "))
    vocab = _wordpiece(pieces, 0, 0, []).get_vocab()
    return sorted(t for t in vocab if t.startswith("##") and len(t) == 3)


def _train_wordpiece(texts, cfg: TokenizeConfig):
    """WordPiece trained the same way every run. tokenizers' trainer (0.23, huggingface/tokenizers#1794)
    numbers the `##c` continuation tokens in the order it meets them in a hash map, which changes from
    process to process; the ids then break ties between merges of equal count, so the same texts gave a
    different vocabulary, ids and model each run. Here the trainer is handed those tokens, sorted, ahead
    of training (as special tokens, so it numbers them in that order and never on its own), and their
    special marking is taken off afterwards."""
    from tokenizers import Tokenizer, decoders, processors

    trained = _wordpiece(texts, cfg.vocab_size, cfg.min_frequency, continuation_tokens(texts))
    spec = json.loads(trained.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in WORDPIECE_SPECIALS.values()]
    tok = Tokenizer.from_str(json.dumps(spec))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.decoder = decoders.WordPiece()
    return tok, WORDPIECE_SPECIALS


def _train_bpe(texts, cfg: TokenizeConfig):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
        special_tokens=["<|endoftext|>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok, BPE_SPECIALS


def _save_trained(tok, specials: dict, dest: Path, cfg: TokenizeConfig) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_length, **specials}
    if pair_types(tok):  # BERT's segments: transformers (pipeline() too) then feeds a pair's token types as trained
        config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (dest / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")


def build_tokenizer(train_texts, cfg: TokenizeConfig, pretrained: str, dest: Path, pairs: bool = False):
    """Make the artifact's tokenizer folder at `dest`; return a `tokenizers.Tokenizer` set to truncate
    (`pairs`: sentence pairs, cut by tokenize.pair_truncation)."""
    from tokenizers import Tokenizer

    if cfg.kind == "pretrained":
        tok = Tokenizer.from_file(str(_pretrained_files(pretrained, dest)))
    else:
        tok, specials = (_train_wordpiece if cfg.kind == "wordpiece" else _train_bpe)(train_texts, cfg)
        _save_trained(tok, specials, dest, cfg)
    tok.no_padding()  # padding happens per batch at training time
    # head_tail has no equivalent in tokenizers' settings: the artifact keeps the head (see _head_tail_encoder)
    tok.enable_truncation(max_length=cfg.max_length, direction="left" if cfg.truncation == "tail" else "right",
                          strategy=cfg.pair_truncation if pairs else "longest_first")
    tok.save(str(dest / "tokenizer.json"))  # the artifact encodes exactly as this stage did (head, tail)
    return tok


def special_template(tok) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer's post-processor puts before and after one text's tokens:
    ([CLS], [SEP]) for BERT's WordPiece, ([], []) for a byte-level BPE without a post-processor. Probed on a copy
    without padding or truncation, as the stage encodes: a tokenizer.json saved with padding to a fixed length
    (the packaged MiniLM's pads to 128) would count its pads as special tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tok.to_str())
    tok.no_padding()
    tok.no_truncation()
    probe = tok.encode("a", add_special_tokens=False)  # one token in any vocabulary ([UNK] at worst)
    full = tok.post_process(probe)
    content = [i for i, special in enumerate(full.special_tokens_mask) if not special]
    return full.ids[: content[0]], full.ids[content[-1] + 1 :]


def head_tail_ids(ids: list[int], prefix: list[int], suffix: list[int], budget: int, head: int) -> tuple[list[int], bool]:
    """A text's content ids cut to `budget` tokens, `head` from its start and the rest from its end,
    between the special ids; returns (ids, truncated). A text within budget is left whole."""
    if len(ids) <= budget:
        return prefix + ids + suffix, False
    return prefix + ids[:head] + ids[len(ids) - (budget - head) :] + suffix, True


def head_tokens(cfg: TokenizeConfig, budget: int) -> int:
    """tokenize.head_tokens, or (0) Sun et al.'s 128 of 510 content tokens scaled to this budget."""
    head = cfg.head_tokens or round(budget * 128 / 510)
    if not cfg.head_tokens and budget < 2:  # the user set only max_length: say that it is too small
        raise ValueError(f"tokenize.truncation=head_tail keeps a head and a tail: tokenize.max_length={cfg.max_length} "
                         f"less its {cfg.max_length - budget} special tokens leaves {budget} content token; raise "
                         f"tokenize.max_length to at least {cfg.max_length - budget + 2}")
    if not 0 < head < budget:
        raise ValueError(f"tokenize.head_tokens={head} leaves no tail: max_length={cfg.max_length} less the "
                         f"special tokens is {budget} content tokens; keep head_tokens below {budget}")
    return head


TRAINED_SPECIALS = {"wordpiece": 2, "bpe": 0}  # around one text: [CLS] [SEP] (_train_wordpiece), none for BPE


def check_head_tail(cfg: TokenizeConfig) -> None:
    """Before any stage runs: truncation=head_tail fits tokenize.max_length (it was found at the tokenize stage,
    after five stages). The pretrained tokenizer's special tokens are read from its folder (a hub id: later)."""
    if cfg.truncation != "head_tail":
        return
    if cfg.kind != "pretrained":
        head_tokens(cfg, cfg.max_length - TRAINED_SPECIALS[cfg.kind])
        return
    folder = local_tokenizer(cfg.pretrained)
    if folder is not None and (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        prefix, suffix = special_template(Tokenizer.from_file(str(folder / "tokenizer.json")))
        head_tokens(cfg, cfg.max_length - len(prefix) - len(suffix))


def _head_tail_encoder(tok, cfg: TokenizeConfig):
    """The batch function for truncation=head_tail: each text is encoded whole (linear in its length)
    without special tokens, cut by `head_tail_ids`, and the template's specials put back around it."""
    from tokenizers import Tokenizer

    whole = Tokenizer.from_str(tok.to_str())
    whole.no_truncation()
    prefix, suffix = special_template(whole)  # probed untruncated: max_length cannot cut the probe
    budget = cfg.max_length - len(prefix) - len(suffix)
    head = head_tokens(cfg, budget)

    def enc(batch):
        cut = [head_tail_ids(e.ids, prefix, suffix, budget, head)
               for e in whole.encode_batch(batch[TEXT], add_special_tokens=False)]
        return _columns([ids for ids, _ in cut], [t for _, t in cut])

    return enc, head


def _columns(ids: list[list[int]], truncated: list[bool]) -> dict:
    """The columns the stage adds for one batch; never padded, so every kept token is attended."""
    return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids], "length": [len(x) for x in ids],
            "truncated": truncated}


def pair_types(tok) -> bool:
    """Whether the tokenizer's pair template marks the second text with token type 1 (BERT's [SEP] b [SEP]:1):
    then the pairs carry token_type_ids; a template without (a byte-level BPE's) gives them all 0."""
    return any(tok.post_process(tok.encode("a", add_special_tokens=False),
                                tok.encode("b", add_special_tokens=False)).type_ids)


def feeds_types(folder: Path) -> bool:
    """Whether transformers' tokenizer of `folder` returns token_type_ids (its model_input_names): BERT's and MiniLM's
    do, DistilBERT's and RoBERTa's do not (their models take none). What `pipeline()` feeds the model is what the
    tokenizer returns, so training feeds the same."""
    from transformers import AutoTokenizer

    return "token_type_ids" in AutoTokenizer.from_pretrained(str(folder)).model_input_names


def _pair_encoder(tok, cfg: TokenizeConfig, types: bool):
    """The batch function of sentence pairs: each row's two texts through the tokenizer's pair template, as
    transformers' `tokenizer(text, text_pair)` and `pipeline()` encode them; token_type_ids where the template
    has types and the tokenizer returns them (`types`). A side that only_first/only_second cannot cut enough is
    one line naming the row."""

    def enc(batch):
        sides = list(zip(*pair.decode_all(batch[TEXT])))
        try:
            out = tok.encode_batch(sides)
        except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception; find the row and say why
            for k, (a, b) in enumerate(sides):
                try:
                    tok.encode(a, b)
                except Exception as e:  # noqa: BLE001
                    where = f"document '{batch['id'][k]}'" if "id" in batch else f"row {k}"
                    raise ValueError(f"tokenize: {where}: {e} (tokenize.pair_truncation={cfg.pair_truncation} cuts "
                                     f"one side only; the other is too long for max_length={cfg.max_length}: use "
                                     f"longest_first or raise max_length)") from None
            raise
        cols = _columns([e.ids for e in out], [bool(e.overflowing) for e in out])
        return {**cols, "token_type_ids": [e.type_ids for e in out]} if types else cols

    return enc


def _encoder(tok, cfg: TokenizeConfig, pairs: bool = False, types: bool = False):
    """The stage's batch function (text -> ids, mask, length, truncated) and the head tokens it keeps
    (None unless head_tail). head and tail are tokenizers' own truncation, right or left; `pairs`: sentence
    pairs, with token_type_ids when `types`."""
    if pairs:
        return _pair_encoder(tok, cfg, types), None
    if cfg.truncation == "head_tail":
        return _head_tail_encoder(tok, cfg)

    def enc(batch):
        out = tok.encode_batch(batch[TEXT])
        return _columns([e.ids for e in out], [bool(e.overflowing) for e in out])

    return enc, None


def saved_encoder(folder: Path, cfg: TokenizeConfig, pairs: bool = False):
    """The stage's batch function over the tokenizer it saved in `folder` (truncation as it ran): new rows encoded
    as the prepared data was (predict.py)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    types = pairs and pair_types(tok) and feeds_types(folder)
    return _encoder(tok, cfg, pairs, types)[0]


def length_stats(lengths: list[int], truncated: list[bool]) -> dict:
    """p50/p95/max of the lengths and the fraction truncated (the rows as lists: tests, one process)."""
    table = {"length": np.asarray(lengths, dtype=np.int64), "truncated": np.asarray(truncated, dtype=bool)}
    return stats_of(_length_counts(table))


def _length_counts(table) -> tuple[Counter, int]:
    """One batch's share of the length statistics: rows per token length, rows truncated."""
    lengths = np.asarray(table["length"], dtype=np.int64)
    values, counts = np.unique(lengths, return_counts=True)
    return Counter(dict(zip(values.tolist(), counts.tolist()))), int(np.count_nonzero(np.asarray(table["truncated"])))


def percentile_of_counts(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """np.percentile(a, q) (its default, linear method, the same float) of the array `a` holding
    each of `values` (ascending) `counts` times, without building `a`."""
    n = int(counts.sum())
    virtual = (n - 1) * (q / 100)  # numpy's virtual index for 'linear'
    below = int(np.floor(virtual))
    lo, hi = (n - 1, n - 1) if virtual >= n - 1 else (below, below + 1)
    ends = np.cumsum(counts)  # a[i] is values[first k with ends[k] > i]
    a, b = (float(values[np.searchsorted(ends, i, side="right")]) for i in (lo, hi))
    t = virtual - lo if virtual < n - 1 else 0.0
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t  # numpy's _lerp, both of its branches


def stats_of(tally: tuple[Counter, int]) -> dict:
    """length_stats from the summed `_length_counts` of every batch."""
    by_length, truncated = tally
    n = sum(by_length.values())
    if not n:
        return {"p50": 0, "p95": 0, "max": 0, "truncated_fraction": 0.0}
    values = np.array(sorted(by_length), dtype=np.int64)
    counts = np.array([by_length[v] for v in values.tolist()], dtype=np.int64)
    return {"p50": percentile_of_counts(values, counts, 50), "p95": percentile_of_counts(values, counts, 95),
            "max": int(values[-1]), "truncated_fraction": round(truncated / n, 4)}


def card_line(manifest: dict) -> str:
    """The model card's line for this stage's manifest: the tokenizer, max_length, how much of train was cut."""
    st = manifest.get("stats", {})
    trunc = st.get("train", {}).get("truncated_fraction")
    return (f"- **Tokens**: {st.get('kind')} tokenizer, max_length {st.get('max_length')}"
            + (f"; {trunc:.1%} of train truncated." if trunc is not None else "."))


def tokenize(dd, cfg: TokenizeConfig, ctx: StageContext) -> StageResult:
    """DatasetDict with text -> + input_ids, attention_mask, length (tokens); tokenizer saved alongside.
    cfg.pretrained is the resolved tokenizer name when kind=pretrained (the runner fills in model.name_or_path)."""
    from datasets import DatasetDict, List, Value

    # the columns `enc` adds, typed as datasets infers them from rows (it narrows these two names)
    encoded = {"input_ids": List(Value("int32")), "attention_mask": List(Value("int8")),
               "length": Value("int64"), "truncated": Value("bool")}

    # a trained tokenizer learns from the train texts, on the driver (the engine's answer must equal the local
    # one, so not from a sample); a pretrained one reads none of them
    train_texts = column(dd["train"], TEXT) if cfg.kind != "pretrained" else []
    if ctx.pairs:  # a new vocabulary learns from both sides of each pair, never from the mark between them
        train_texts = [side for t in train_texts for side in pair.decode(t)]
    pairs = bool(ctx.pairs)
    tok = build_tokenizer(train_texts, cfg, cfg.pretrained, ctx.out_dir / "tokenizer", pairs)

    types = pairs and pair_types(tok) and feeds_types(ctx.out_dir / "tokenizer")
    enc, head = _encoder(tok, cfg, pairs, types)
    if types:
        encoded["token_type_ids"] = List(Value("int8"))
    result = {}
    stats = {"kind": cfg.kind, "vocab_size": tok.get_vocab_size(), "max_length": cfg.max_length,
             "truncation": cfg.pair_truncation if pairs else cfg.truncation, **({"head_tokens": head} if head else {}),
             **({"pairs": True, "token_type_ids": "token_type_ids" in encoded} if pairs else {})}
    for s in SPLITS:  # one pass: the rows tokenized and their lengths tallied; `truncated` only counted, not kept
        result[s], tally = ctx.engine.map_filter(dd[s], enc, encoded, None, drop=["truncated"], tally=_length_counts,
                                                 combine=add_up, batch_size=1000, desc=f"tokenize {s}")
        stats[s] = stats_of(tally)
    return StageResult(DatasetDict(result), {}, stats)
