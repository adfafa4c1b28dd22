#!/usr/bin/env python3
"""Runs `kettle embed` on each embedding golden (scripts/make-embedding-goldens.py) and
prints the lowest cosine against sentence-transformers' vectors per case; exits 1 when any
is below 0.9999 or a token count differs.
  python3 scripts/check-embedding-goldens.py KETTLE GOLDENS_DIR [kettle embed flags...]"""
import json, math, os, subprocess, sys, tempfile

kettle, root, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
worst_all, bad = 1.0, 0
for case in sorted(c for c in os.listdir(root) if os.path.isdir(os.path.join(root, c))):
    golden = json.load(open(os.path.join(root, case, "golden.json")))
    groups = {}
    for row in golden["cases"]:
        groups.setdefault(row["prompt_name"], []).append(row)
    worst, failed = 1.0, 0
    for prompt_name, rows in groups.items():
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("\n".join(r["text"] for r in rows) + "\n")
        cmd = [kettle, "embed", "-m", os.path.join(root, case, "model"), "--file", f.name] + extra
        if prompt_name:
            cmd += ["--prompt-name", prompt_name]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(case, "kettle embed failed:", out.stderr.strip()); failed += 1; continue
        for row, line in zip(rows, out.stdout.splitlines()):
            got = json.loads(line)
            a, b = got["embedding"], row["embedding"]
            cos = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
            worst = min(worst, cos)
            if got["tokens"] != len(row["input_ids"]):
                print(case, "token count", got["tokens"], "!=", len(row["input_ids"])); bad += 1
    if failed:
        print(f"{case}: FAILED ({failed} kettle embed runs failed)"); bad += failed; continue
    print(f"{case}: lowest cosine {worst:.7f} over {len(golden['cases'])} texts")
    worst_all = min(worst_all, worst)
sys.exit(1 if bad or worst_all < 0.9999 else 0)
