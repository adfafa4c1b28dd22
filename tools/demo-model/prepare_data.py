#!/usr/bin/env python3
"""Builds the demo models' training text from English that Debian packages ship
under free licences (see MODEL_CARD.md for the list and licences).

Runs on a Debian machine (not the GPU box): installs the packages with apt,
extracts plain text, and writes OUT/train.txt, OUT/heldout.txt (documents
separated by blank lines) and OUT/chat.jsonl (dictionary and riddle question /
answer pairs, used to teach the chat format).

    python3 tools/demo-model/prepare_data.py OUT
"""
import gzip
import html.parser
import json
import os
import random
import re
import subprocess
import sys

PACKAGES = ["bible-kjv", "fortunes-min", "dict-gcide", "python3.11-doc", "debian-reference-en"]
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def install():
    missing = [p for p in PACKAGES if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0]
    if missing:
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def kjv():
    """The King James Bible (public domain), one document per chapter."""
    text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    chapters, current, key = [], [], None
    for line in text.splitlines():
        m = re.match(r"^(\w+?)(\d+):(\d+) (.*)$", line)
        if not m:
            continue
        book_chapter = (m.group(1), m.group(2))
        if book_chapter != key and current:
            chapters.append(" ".join(current))
            current = []
        key = book_chapter
        current.append(m.group(4).strip())
    if current:
        chapters.append(" ".join(current))
    return chapters


def fortunes():
    """fortunes-min: quotations, literature, riddles (BSD licence)."""
    docs, riddles = [], []
    base = "/usr/share/games/fortunes"
    for name in ("fortunes", "literature", "riddles"):
        path = os.path.join(base, name)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for item in f.read().split("\n%\n"):
                item = item.strip()
                if item:
                    docs.append(item)
                    if name == "riddles":
                        riddles.append(item)
    return docs, riddles


def gcide_entries():
    """GCIDE (GPL-2+): (headword, definitions) with the dictd markup removed."""
    index = open("/usr/share/dictd/gcide.index", encoding="utf-8", errors="replace").read().splitlines()
    raw = gzip.open("/usr/share/dictd/gcide.dict.dz", "rb").read()

    def d64(s):
        n = 0
        for c in s:
            n = n * 64 + B64.index(c)
        return n

    out = []
    for line in index:
        parts = line.split("\t")
        if len(parts) != 3 or parts[0].startswith("00-"):
            continue
        word, off, length = parts[0], d64(parts[1]), d64(parts[2])
        body = raw[off:off + length].decode("utf-8", "replace")
        body = re.sub(r"\\[^\\]*\\", "", body, count=1)          # pronunciation
        body = re.sub(r"\[(1913 Webster|WordNet[^\]]*|PJC|RN|Century Dict\.|Webster 1913 Suppl\.)\]", "", body)
        body = re.sub(r"[{}]", "", body)
        body = re.sub(r"--[A-Z][\w. ]*\.?", "", body)            # citation authors
        body = re.sub(r"\s+", " ", body).strip()
        if len(body) > 40 and " " not in word.strip():
            out.append((word, body))
    return out


class TextExtractor(html.parser.HTMLParser):
    SKIP = {"script", "style", "nav", "head"}

    def __init__(self):
        super().__init__()
        self.parts, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        if tag in ("p", "div", "li", "h1", "h2", "h3", "pre", "br", "tr"):
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skip:
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_docs(root, max_bytes):
    """Python's documentation (PSF licence) or the Debian Reference (GPL-2+) as plain text."""
    docs, total = [], 0
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if not name.endswith(".html") or name in ("genindex.html", "search.html"):
                continue
            p = TextExtractor()
            p.feed(open(os.path.join(dirpath, name), encoding="utf-8", errors="replace").read())
            text = re.sub(r"[ \t]+", " ", "".join(p.parts))
            text = re.sub(r"\n\s*\n+", "\n", text).strip()
            paragraphs = [t.strip() for t in text.split("\n") if len(t.strip()) > 60]
            if paragraphs:
                doc = "\n".join(paragraphs)
                docs.append(doc)
                total += len(doc)
            if total > max_bytes:
                return docs
    return docs


def chat_pairs(entries, riddles, rng):
    pairs = []
    for word, body in rng.sample(entries, min(len(entries), 60000)):
        definition = body[:400].rsplit(" ", 1)[0] if len(body) > 400 else body
        question = rng.choice(["What does {} mean?", "Define {}.", "What is the meaning of the word {}?",
                               "Tell me what {} means."]).format(word.lower())
        pairs.append({"user": question, "assistant": f"{word}: {definition}"})
    for r in riddles:
        lines = [l for l in r.splitlines() if l.strip()]
        if len(lines) >= 2 and lines[0].startswith("Q:") and any(l.startswith("A:") for l in lines):
            q = " ".join(l for l in lines if not l.startswith("A:"))[2:].strip()
            a = " ".join(l[2:].strip() for l in lines if l.startswith("A:"))
            pairs.append({"user": q, "assistant": a})
    return pairs


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    install()
    rng = random.Random(1234)
    bible = kjv()
    fortune_docs, riddles = fortunes()
    entries = gcide_entries()
    # The dictionary would be most of the text; a sample keeps prose (Bible, documentation) in the majority.
    dictionary = [f"{w}: {b}" for w, b in rng.sample(entries, min(len(entries), 40000))]
    python_docs = html_docs("/usr/share/doc/python3.11/html", 12_000_000)
    debian_docs = html_docs("/usr/share/doc/debian-reference-en/docs", 3_000_000)
    sources = {"kjv": bible, "fortunes": fortune_docs, "gcide": dictionary, "python-doc": python_docs,
               "debian-reference": debian_docs}
    train, heldout, stats = [], [], {}
    for name, docs in sources.items():
        docs = list(docs)
        rng.shuffle(docs)
        n_held = max(1, len(docs) // 100)
        heldout += docs[:n_held]
        train += docs[n_held:]
        stats[name] = {"documents": len(docs), "bytes": sum(len(d.encode()) for d in docs)}
    rng.shuffle(train)
    with open(os.path.join(out, "train.txt"), "w") as f:
        f.write("\n\n".join(train) + "\n")
    with open(os.path.join(out, "heldout.txt"), "w") as f:
        f.write("\n\n".join(heldout) + "\n")
    pairs = chat_pairs(entries, riddles, rng)
    with open(os.path.join(out, "chat.jsonl"), "w") as f:
        for p in pairs:
            f.write(json.dumps(p) + "\n")
    stats["chat_pairs"] = len(pairs)
    json.dump(stats, open(os.path.join(out, "stats.json"), "w"), indent=1)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
