"""Known answers for pipeline/data/similarity/minhash.py: shingles, hashes, signatures, LSH, clustering."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from datasketch import LeanMinHash, MinHash, MinHashLSH

from pipeline.config import DedupConfig
from pipeline.data.similarity import minhash, shingling, signatures

HORRIBLE = [
    "  Hello \t World  ", "", "   ", "!!!", "a\u2003b\n\nc ", "Straße STRASSE ẞ", "x",
    "naïve café 😀 test_x 😀",
    "\x1c a \x1f", "\u200bzero\u200bwidth", "مرحبا بالعالم", "a_b-c d.e", "ǅ ﬁ Ⅻ ①",
    "bad \udcff byte",  # a lone surrogate, as surrogateescape decoding leaves
]


def make_texts(n: int, words: int = 30, seed: int = 0) -> list[str]:
    """Unrelated texts: random pseudo-words, so two texts share almost no word 3-grams."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}x{rng.integers(1000)}" for i in range(3000)]
    return [" ".join(rng.choice(vocab, words)) for _ in range(n)]


def edit(text: str, positions: list[int], seed: int = 1) -> str:
    """Replace the words at `positions` with new ones (a near-duplicate, not a copy)."""
    words = text.split()
    for k, p in enumerate(positions):
        words[p] = f"edited{seed}y{k}"
    return " ".join(words)


def jaccard(a: str, b: str, cfg: DedupConfig) -> float:
    x, y = set(minhash.shingles(a, cfg.shingle, cfg.ngram)), set(minhash.shingles(b, cfg.shingle, cfg.ngram))
    return len(x & y) / len(x | y)


def test_shingles_word_and_char_with_short_texts():
    assert minhash.shingles("The cat, the HAT!", "word", 3) == ["the cat the", "cat the hat"]
    assert minhash.shingles("Two words", "word", 3) == ["two words"]  # shorter than n: one shingle
    assert minhash.shingles(" ?! ", "word", 3) == ["?!"]  # no word at all: the whole normalized text
    assert minhash.shingles("Ab  C", "char", 3) == ["ab ", "b c"]
    assert minhash.shingles("ab", "char", 3) == ["ab"]


def test_normalize_text_is_casefold_split_join_for_every_kind_of_space():
    texts = HORRIBLE + ["a  b", " a", "a ", "a\xa0b", "A\u2003B", "x\u3000", "tab\there", "ok text", "ẞ",
                        "a\x85b", "\r\n x \r\n", "a" + " " * 1000 + "b", "\x8a mojibake\x9d  \u2028end "]
    for t in texts + [t.upper() for t in texts] + ["".join(texts)]:
        assert minhash.normalize_text(t) == " ".join(t.casefold().split()), repr(t)
    # what its scans rely on: the characters str.split() splits on are " " and _OTHER_SPACES, and
    # " " is the one printable one
    splits = [chr(c) for c in range(sys.maxunicode + 1) if len(f"a{chr(c)}b".split()) == 2]
    assert sorted(splits) == sorted(" " + shingling._OTHER_SPACES)
    assert [c for c in splits if c.isprintable()] == [" "]
    # and what folded=True relies on: casefolding is idempotent (character by character, so for texts)
    assert all(chr(c).casefold().casefold() == chr(c).casefold() for c in range(sys.maxunicode + 1))
    for t in texts:
        assert minhash.normalize_text(t.casefold(), folded=True) == minhash.normalize_text(t)
    # normalized_lengths counts what normalize_text makes, folded or not, one text or many
    every = texts + [t.upper() for t in texts] + ["", " ", "\U0001F600 \U0001F600", "x"]
    want = [len(minhash.normalize_text(t)) for t in every]
    assert minhash.normalized_lengths(every).tolist() == want
    assert minhash.normalized_lengths([t.casefold() for t in every], folded=True).tolist() == want
    assert [minhash.normalized_lengths([t]).tolist() for t in every] == [[n] for n in want]
    assert minhash.normalized_lengths([]).tolist() == []


@pytest.mark.parametrize("unit,n", [("word", 3), ("word", 1), ("char", 5), ("char", 2)])
def test_shingle_hashes_agree_with_shingle_strings(unit, n):
    texts = HORRIBLE + make_texts(20, words=8)
    hashes, offsets = minhash.shingle_hashes(texts, unit, n)
    seen: dict[str, int] = {}
    for i, t in enumerate(texts):
        strings = minhash.shingles(t, unit, n)
        assert offsets[i + 1] - offsets[i] == len(strings), t
        for s, h in zip(strings, hashes[offsets[i] : offsets[i + 1]].tolist()):
            assert seen.setdefault(s, h) == h  # equal shingles, equal hashes
    assert len(set(seen.values())) == len(seen)  # different shingles, different hashes
    again = minhash.shingle_hashes([minhash.normalize_text(t) for t in texts], unit, n, normalized=True)
    np.testing.assert_array_equal(again[0], hashes)
    np.testing.assert_array_equal(again[1], offsets)


def test_ranges_concatenate_aranges_with_empty_ones_anywhere():
    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(0, 12))
        starts, lengths = rng.integers(0, 50, k), rng.integers(0, 4, k)
        want = [i for s, n in zip(starts.tolist(), lengths.tolist()) for i in range(s, s + n)]
        got = shingling._ranges(starts, lengths)
        assert got.tolist() == want and got.dtype == np.int64


def test_text_hashes_equal_exactly_for_equal_texts():
    texts = [minhash.normalize_text(t) for t in HORRIBLE + ["hello world", "HELLO\n  world ", "hello  worlds"]]
    h = minhash.text_hashes(texts).tolist()
    for i, a in enumerate(texts):
        for j, b in enumerate(texts):
            assert (h[i] == h[j]) == (a == b), (a, b)


def test_signatures_are_bit_identical_to_datasketch():
    texts = make_texts(5) + HORRIBLE[:4]
    hashes, offsets = minhash.shingle_hashes(texts, "word", 3)
    sig = minhash.signatures_from_hashes(hashes, offsets, 64, seed=7)
    for i in range(len(texts)):
        m = MinHash(num_perm=64, seed=7, hashfunc=lambda x: x)
        m.update_batch(minhash.hash32(hashes[offsets[i] : offsets[i + 1]]).tolist())
        np.testing.assert_array_equal(sig[i], m.hashvalues)


def slow_signatures(hashes: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """The definition: per text, the minimum over its shingles of every permutation (uint64 math)."""
    a, b = (x.astype(np.uint64) for x in minhash.permutations(num_perm, seed))
    h = signatures._fmix32(minhash.hash32(hashes)).astype(np.uint64)
    sig = np.full((len(offsets) - 1, num_perm), 0xFFFFFFFF, dtype=np.uint64)
    for d in range(len(offsets) - 1):
        for x in h[offsets[d] : offsets[d + 1]].tolist():
            sig[d] = np.minimum(sig[d], (a * np.uint64(x) + b) & np.uint64(0xFFFFFFFF))
    return sig.astype(np.uint32)


@pytest.mark.parametrize("block", [16 * 4, 100 * 4, 1 << 21])  # chunks of 4, 100 and all shingles at P = 16
def test_signatures_in_chunks_equal_the_definition_with_empty_and_long_texts(monkeypatch, block):
    rng = np.random.default_rng(2)
    lengths = [0, 3, 1, 0, 0, 250, 7, 4, 0, 1, 33, 0]  # empty texts inside, at the end, across chunk edges
    hashes = rng.integers(0, 2**63, sum(lengths), dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    monkeypatch.setattr(signatures, "_SIGNATURE_BLOCK", block)
    sig = minhash.signatures_from_hashes(hashes, offsets, 16, seed=3)
    np.testing.assert_array_equal(sig, slow_signatures(hashes, offsets, 16, seed=3))
    assert (sig[[0, 3, 4, 8, 11]] == 0xFFFFFFFF).all()  # empty: datasketch's empty MinHash values
    assert minhash.signatures_from_hashes(hashes[:0], np.zeros(3, dtype=np.int64), 16, 3).shape == (2, 16)


@pytest.mark.parametrize("positions, block", [(5, 16 * 4), (64, 16 * 3), (10**6, 1 << 19), (0, 1 << 19)])
def test_signatures_by_position_and_by_run_equal_the_definition(monkeypatch, positions, block):
    """Texts of at most `positions` shingles signed by position, in blocks of `block` // 16 texts,
    the longer ones by run: every mix of the two ways gives the definition's signatures, and
    numpy's ufunc buffer is set back after."""
    rng = np.random.default_rng(5)
    lengths = np.concatenate([rng.integers(0, 80, 300), [0, 1, 1, 200, 65, 64, 63, 0]])
    hashes = rng.integers(0, 2**63, int(lengths.sum()), dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    monkeypatch.setattr(signatures, "_POSITIONS", positions)
    monkeypatch.setattr(signatures, "_POSITION_BLOCK", block)
    monkeypatch.setattr(signatures, "_SIGNATURE_BLOCK", 16 * 50)
    buffer = np.getbufsize()
    sig = minhash.signatures_from_hashes(hashes, offsets, 16, seed=3)
    assert np.getbufsize() == buffer
    np.testing.assert_array_equal(sig, slow_signatures(hashes, offsets, 16, seed=3))
    assert sig.T.flags.c_contiguous  # permutation-major, as the band keys read it
    for bands, rows in ((5, 3), (8, 2), (16, 1)):
        keys, order = minhash.band_keys_from_hashes(hashes, offsets, 16, 3, bands, rows)
        assert sorted(order.tolist()) == list(range(len(lengths)))
        np.testing.assert_array_equal(keys, minhash.band_keys(np.ascontiguousarray(sig), bands, rows)[:, order])
        np.testing.assert_array_equal(minhash.candidates_of_keys(keys, order), minhash.band_candidates(sig, bands, rows))


@pytest.mark.slow
def test_signed_band_keys_in_two_processes_equal_one():
    cfg = DedupConfig(num_perm=32)
    hashes, offsets = minhash.shingle_hashes(make_texts(2 * minhash._MIN_DOCS_PER_PROC + 10, words=10), "word", 3)
    one, texts1, procs1 = minhash.signed_band_keys(hashes, offsets, cfg, 8, 4, num_proc=1)
    two, texts2, procs2 = minhash.signed_band_keys(hashes, offsets, cfg, 8, 4, num_proc=2)
    assert (procs1, procs2) == (1, 2)
    sk, _ = minhash.signed(hashes, offsets, cfg, num_proc=2)
    for keys, texts in ((one, texts1), (two, texts2)):
        np.testing.assert_array_equal(keys, minhash.band_keys(sk.sig, 8, 4)[:, texts])
        np.testing.assert_array_equal(minhash.candidates_of_keys(keys, texts), minhash.band_candidates(sk.sig, 8, 4))


def test_jaccard_estimate_within_binomial_tolerance():
    """Under min-wise hashing the share of equal signature values is Binomial(P, J) / P, standard
    deviation sqrt(J(1-J)/P) (<= 0.031 at P=256); 4 deviations (plus half a step) fail with
    probability ~6e-5 per pair, and the seed is fixed, so this is a stable known answer."""
    cfg = DedupConfig(shingle="word", ngram=1, num_perm=256)
    base = [f"tok{i}" for i in range(200)]
    pairs = [(" ".join(base[:100]), " ".join(base[k : k + 100])) for k in range(0, 100, 7)]
    sk, _ = minhash.sketch([t for p in pairs for t in p], cfg)
    idx = np.arange(0, 2 * len(pairs), 2)
    est = minhash.estimated_jaccard(sk.sig, np.stack([idx, idx + 1], axis=1))
    for (a, b), e in zip(pairs, est.tolist()):
        true = jaccard(a, b, cfg)
        assert abs(e - true) <= 4 * math.sqrt(true * (1 - true) / 256) + 0.5 / 256, (true, e)
    exact = minhash.exact_jaccard(sk, np.stack([idx, idx + 1], axis=1))
    np.testing.assert_allclose(exact, [jaccard(a, b, cfg) for a, b in pairs])


def test_band_candidates_are_what_a_datasketch_index_answers():
    texts = make_texts(150, words=12)
    texts += [edit(t, [3]) for t in texts[:40]] + [edit(t, [2, 9]) for t in texts[40:60]]
    cfg = DedupConfig(num_perm=64)
    sk, _ = minhash.sketch(texts, cfg)
    b, r = minhash.lsh_params(0.5, 64)
    lsh = MinHashLSH(num_perm=64, params=(b, r))
    signs = [LeanMinHash(seed=cfg.seed, hashvalues=s, scheme="affine32") for s in sk.sig]
    for i, m in enumerate(signs):
        lsh.insert(i, m)
    expected = {(min(i, j), max(i, j)) for i, m in enumerate(signs) for j in lsh.query(m) if i != j}
    got = set(map(tuple, minhash.band_candidates(sk.sig, b, r).tolist()))
    assert got == expected and len(got) >= 40


def sharing_a_band(sig: np.ndarray, bands: int, rows: int) -> list[list[int]]:
    """The definition of the candidates, pair by pair: equal values on all rows of some band."""
    cut = [sig[:, k * rows : (k + 1) * rows] for k in range(bands)]
    return [[i, j] for i in range(len(sig)) for j in range(i + 1, len(sig))
            if any(np.array_equal(c[i], c[j]) for c in cut)]


@pytest.mark.parametrize("bands, rows", [(8, 1), (6, 2), (3, 5)])
def test_band_candidates_are_the_pairs_sharing_a_band(bands, rows):
    """Few distinct values: groups of many texts, one band's values repeated in other bands."""
    sig = np.random.default_rng(bands).integers(0, 3, size=(60, bands * rows + 1)).astype(np.uint32)
    got = minhash.band_candidates(sig, bands, rows)
    assert got.tolist() == sharing_a_band(sig, bands, rows) and len(got) > 20


@pytest.mark.parametrize("n", [200, 100_000])  # codes in 32 bits, and in 64 (n * n > 2^32)
def test_pair_codes_are_the_pairs_within_groups(n):
    rng = np.random.default_rng(n)
    sizes = rng.integers(2, 12, 40)
    members = np.concatenate([np.sort(rng.choice(n, s, replace=False)) for s in sizes])
    pairs = minhash._pairs_within_groups(members, sizes)
    np.testing.assert_array_equal(minhash._pair_codes(members, sizes, n), pairs[:, 0] * n + pairs[:, 1])


def test_band_candidates_keep_each_band_apart_where_sorted_keys_meet():
    """Band 0's largest key equal to band 1's smallest (the same values in both): no pair across."""
    values = np.arange(1, 200, dtype=np.uint32)
    keys = minhash.band_keys(values[:, None], 1, 1)[0]
    u, v, w, x = values[np.argsort(keys)[[0, 50, 100, 150]]]  # increasing keys
    sig = np.array([[v, w], [v, x], [u, v]], dtype=np.uint32)  # band 0 sorted: u v v; band 1: v w x
    assert minhash.band_candidates(sig, 2, 1).tolist() == [[0, 1]]


def test_band_keys_differ_for_bands_differing_in_one_value():
    rng = np.random.default_rng(1)
    sig = rng.integers(0, 2**32, size=(500, 8), dtype=np.uint32)
    changed = sig.copy()
    changed[np.arange(500), rng.integers(0, 8, 500)] ^= rng.integers(1, 2**32, 500, dtype=np.uint32)
    assert not (minhash.band_keys(sig, 1, 8) == minhash.band_keys(changed, 1, 8)).any()


def test_sorted_unique_is_np_unique():
    for values in (np.zeros(0, np.int64), np.array([5]), np.random.default_rng(2).integers(-50, 50, 1000)):
        np.testing.assert_array_equal(minhash.sorted_unique(values), np.unique(values))


def test_exact_jaccard_matches_python_sets():
    cfg = DedupConfig(shingle="char", ngram=4)
    texts = make_texts(30, words=6) + HORRIBLE
    sk, _ = minhash.sketch(texts, cfg)
    pairs = np.array([(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts)) if (i + j) % 5 == 0])
    got = minhash.exact_jaccard(sk, pairs)
    np.testing.assert_allclose(got, [jaccard(texts[i], texts[j], cfg) for i, j in pairs.tolist()])


def test_exact_jaccard_in_small_blocks_and_shared_sets(monkeypatch):
    cfg = DedupConfig()
    texts = make_texts(40, words=12) + [edit(t, [2, 7]) for t in make_texts(40, words=12)] + HORRIBLE
    sk, _ = minhash.sketch(texts, cfg)
    pairs = np.array([(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts)) if (i * j) % 7 == 1])
    expected = [jaccard(texts[i], texts[j], cfg) for i, j in pairs.tolist()]
    monkeypatch.setattr(minhash, "_SORTED_PER_BLOCK", 50)  # a few pairs per sort
    sets = minhash.ShingleSets(sk, pairs)
    np.testing.assert_array_equal(sets.jaccard(pairs), minhash.exact_jaccard(sk, pairs))
    np.testing.assert_allclose(sets.jaccard(pairs[::-1]), expected[::-1])
    assert len(minhash.exact_jaccard(sk, np.zeros((0, 2), dtype=np.int64))) == 0


@pytest.mark.parametrize("merged_run", [0, 10**9])
def test_exact_jaccard_with_either_sort_and_wide_keys(monkeypatch, merged_run):
    """The merge sort (timsort) or the quicksort, and 64-bit keys (more shingles than 32-bit keys
    hold with a block of pairs): the same answers."""
    cfg = DedupConfig()
    texts = make_texts(40, words=12) + [edit(t, [2, 7]) for t in make_texts(40, words=12)] + HORRIBLE
    sk, _ = minhash.sketch(texts, cfg)
    pairs = np.array([(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts)) if (i * j) % 5 == 2])
    expected = [jaccard(texts[i], texts[j], cfg) for i, j in pairs.tolist()]
    monkeypatch.setattr(minhash, "_MERGED_RUN", merged_run)
    sets = minhash.ShingleSets(sk, pairs)
    np.testing.assert_allclose(sets.jaccard(pairs), expected)
    sets.bits = 30  # ranks still fit: the keys no longer do in 32 bits
    np.testing.assert_allclose(sets.jaccard(pairs), expected)


def test_exact_jaccard_when_hashes_differ_in_their_low_bits_only():
    """Hashes that agree but for the low bits the grouping sort packs the index into: still exact."""
    base = [np.uint64(k << 40) for k in range(1, 6)]
    sets = [[base[0], base[0] | 1, base[1], base[2] | 3], [base[0] | 1, base[2] | 3, base[3]],
            [base[0], base[2], base[2] | 2, base[4]], [base[0] | 2, base[4], base[0]]]
    offsets = np.cumsum([0] + [len(x) for x in sets])
    sk = minhash.Sketch(np.zeros((len(sets), 4), np.uint32), np.array([h for x in sets for h in x], np.uint64), offsets)
    pairs = np.array([(i, j) for i in range(len(sets)) for j in range(i + 1, len(sets))])
    expected = [len(set(sets[i]) & set(sets[j])) / len(set(sets[i]) | set(sets[j])) for i, j in pairs.tolist()]
    np.testing.assert_allclose(minhash.exact_jaccard(sk, pairs), expected)
    assert sorted(expected)[-1] > 0 and 0 in expected


def plain_union_find(n: int, pairs: list) -> list[int]:
    label = list(range(n))
    for _ in range(n):  # relax until nothing changes: the smallest index reaches its whole component
        for i, j in pairs:
            label[i] = label[j] = min(label[i], label[j])
    return label


def test_union_find_equals_a_plain_relaxation_on_chains_and_random_graphs():
    rng = np.random.default_rng(4)
    chain = [(k, k + 1) for k in range(50)][::-1] + [(90, 60), (60, 75)]  # long, reversed, unsorted
    for pairs in [chain, *[rng.integers(0, 120, size=(m, 2)).tolist() for m in (10, 60, 200)]]:
        got = minhash.union_find(120, np.array(pairs, dtype=np.int64))
        assert got.tolist() == plain_union_find(120, pairs)


def test_union_find_labels_components_by_smallest_member():
    labels = minhash.union_find(7, np.array([[5, 6], [1, 3], [3, 5], [2, 4]]))
    assert labels.tolist() == [0, 1, 2, 1, 2, 1, 1]
    assert minhash.union_find(3, np.zeros((0, 2), dtype=np.int64)).tolist() == [0, 1, 2]


def test_near_duplicate_pairs_finds_edited_copies_and_drops_false_positives():
    texts = make_texts(200)
    texts += [edit(texts[i], [5, 20], seed=i) for i in range(10)]  # J ~ 0.6 with their originals
    cfg = DedupConfig(threshold=0.5)
    found = minhash.near_duplicate_pairs(minhash.sketch(texts, cfg)[0], cfg)
    assert set(map(tuple, found.pairs.tolist())) == {(i, 200 + i) for i in range(10)}
    assert all(s >= 0.5 for s in found.similarity) and found.candidates >= len(found.pairs)


@pytest.mark.slow
def test_sketch_with_two_processes_equals_one():
    cfg = DedupConfig(num_perm=32)
    texts = make_texts(2 * minhash._MIN_DOCS_PER_PROC + 10, words=10)
    one, procs1 = minhash.sketch(texts, cfg, num_proc=1)
    two, procs2 = minhash.sketch(texts, cfg, num_proc=2)
    assert (procs1, procs2) == (1, 2)
    for field in ("sig", "hashes", "offsets"):
        np.testing.assert_array_equal(getattr(one, field), getattr(two, field))


def test_cross_duplicates_finds_planted_leaks_only():
    cfg = DedupConfig(threshold=0.7)
    train = make_texts(300, seed=3)
    queries = make_texts(50, seed=4)  # unrelated to train
    leaks = {7: 12, 21: 250, 40: 99}  # query index -> train index it was edited from
    for q, t in leaks.items():
        queries[q] = edit(train[t], [10], seed=q)
    queries[45] = train[5].upper()  # an exact copy in other case
    leaks[45] = 5
    hits = minhash.cross_duplicates(train, queries, cfg, threshold=0.7)
    assert [(q, t) for q, t, _ in hits] == sorted(leaks.items())
    for q, t, sim in hits:
        assert sim == pytest.approx(jaccard(queries[q], train[t], cfg)) and sim >= 0.7
    assert minhash.cross_duplicates([], queries, cfg, 0.7) == []


def test_lsh_params_configured_or_chosen():
    assert minhash.lsh_params(0.7, 128, 16, 8) == (16, 8)
    with pytest.raises(ValueError, match="dedup.bands"):
        minhash.lsh_params(0.7, 128, 1, 8)
    b, r = minhash.lsh_params(0.5, 128)
    hit = 1 - (1 - 0.5**r) ** b  # chance that a pair with J = 0.5 becomes a candidate
    assert b * r <= 128 and hit > 0.85 > 1 - (1 - 0.5**5) ** 25  # leaning to recall, unlike 25 x 5
