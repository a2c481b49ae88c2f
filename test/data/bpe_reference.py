"""The byte-level BPE tests' reference (test/data/bpe_test.cpp), written from
GPT-2's published algorithm with the standard library only: the pre-tokenizer
is GPT-2's pattern run by `re`, with \\p{L}, \\p{N} and \\s spelled out as
classes (Unicode's letter and number categories from unicodedata, through
runtime/data/unicode_tables.py's ranges; the White_Space property), and
the merges are GPT-2's bpe() loop.

  bpe_reference.py train TEXT_FILE DIR MERGES   writes DIR/vocab.json and DIR/merges.txt
  bpe_reference.py encode DIR TEXT_FILE OUT     writes OUT: {"ordinary": ids, "special": ids,
                                                "train": ids, "val": ids} (train and val: the text
                                                cut at 90% of its characters, as nanoGPT's prepare.py)
"""
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "runtime", "data"))
import unicode_tables  # noqa: E402  (its category ranges, from unicodedata2 or Python's unicodedata)

SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
SPECIAL = "<|endoftext|>"


def category_class(major):
    return "".join(re.escape(chr(a)) if a == b else re.escape(chr(a)) + "-" + re.escape(chr(b))
                   for a, b in unicode_tables.ranges(major))


L, N = category_class("L"), category_class("N")
PATTERN = re.compile(
    "'(?:[sdmt]|ll|ve|re)| ?[%s]+| ?[%s]+| ?[^%s%s%s]+|[%s]+(?![^%s])|[%s]+" % (L, N, SPACE, L, N, SPACE, SPACE, SPACE))


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE = bytes_to_unicode()


def pieces(text):
    return ["".join(BYTE[b] for b in p.encode("utf-8")) for p in PATTERN.findall(text)]


def merge(word, pair):
    """Every occurrence of the pair, left to right, as one symbol."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def bpe(word, ranks):
    word = list(word)
    while len(word) > 1:
        pairs = set(zip(word, word[1:]))
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        word = merge(word, best)
    return word


def train(text, merges):
    words = {}
    for p in pieces(text):
        words[tuple(p)] = words.get(tuple(p), 0) + 1
    learned = []
    for _ in range(merges):
        counts = {}
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + c
        if not counts:
            break
        best = max(sorted(counts), key=lambda p: counts[p])
        learned.append(best)
        merged = {}
        for w, c in words.items():
            out = tuple(merge(w, best))
            merged[out] = merged.get(out, 0) + c
        words = merged
    return learned


def main():
    if sys.argv[1] == "train":
        text = open(sys.argv[2], encoding="utf-8").read()
        learned = train(text, int(sys.argv[4]))
        alphabet = list(BYTE.values())
        random.Random(5).shuffle(alphabet)  # byte tokens' ids in no byte order
        vocab = {s: i for i, s in enumerate(alphabet)}
        for a, b in learned:
            vocab.setdefault(a + b, len(vocab))
        vocab[SPECIAL] = len(vocab)
        json.dump(vocab, open(sys.argv[3] + "/vocab.json", "w", encoding="utf-8"), ensure_ascii=False)
        with open(sys.argv[3] + "/merges.txt", "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join("%s %s\n" % m for m in learned))
        return
    d = sys.argv[2]
    vocab = json.load(open(d + "/vocab.json", encoding="utf-8"))
    lines = open(d + "/merges.txt", encoding="utf-8").read().split("\n")[1:]
    ranks = {tuple(m.split(" ")): i for i, m in enumerate(m for m in lines if m)}

    def ordinary(s):
        return [vocab[t] for p in pieces(s) for t in bpe(p, ranks)]

    def special(s):
        out = []
        for k, part in enumerate(s.split(SPECIAL)):
            out += ([vocab[SPECIAL]] if k else []) + ordinary(part)
        return out

    text = open(sys.argv[3], encoding="utf-8", newline="").read()
    n = len(text)
    json.dump({"ordinary": ordinary(text), "special": special(text), "train": ordinary(text[:int(n * 0.9)]),
               "val": ordinary(text[int(n * 0.9):])}, open(sys.argv[4], "w"))


if __name__ == "__main__":
    main()
