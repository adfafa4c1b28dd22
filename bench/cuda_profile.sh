#!/usr/bin/env bash
# Per-kernel times and DRAM bytes of a few decode steps under Nsight Compute
# (clocks left as they are), summed per kernel name.
#   [BENCH_ARGS="--q-bits 4"] bash bench/cuda_profile.sh KETTLE_BINARY PRESET OUT_DIR
set -uo pipefail
kettle=${1:?kettle binary}; preset=${2:?preset}; out=${3:?out dir}
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes.sum --csv --launch-skip "${PROFILE_SKIP:-1500}" \
  --launch-count "${PROFILE_COUNT:-300}" "$kettle" bench --synthetic "$preset" --device cuda -p 16 -g 64 -r 1 ${BENCH_ARGS:-} >"$out/ncu.csv" 2>"$out/ncu.err"
python3 - "$out/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; rows = rows[1:]
ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
t = collections.defaultdict(float); b = collections.defaultdict(float); c = collections.Counter()
for r in rows:
  name = r[ki].split("(")[0].split("::")[-1][:40]
  v = float(r[vi].replace(",", ""))
  if r[mi] == "gpu__time_duration.sum": t[name] += v; c[name] += 1
  else: b[name] += v
total = sum(t.values())
for n, v in sorted(t.items(), key=lambda x: -x[1]):
  print(f"{n:42s} n={c[n]:4d} avg={v/c[n]/1e3:8.2f} us  total={v/1e6:7.3f} ms  {100*v/total:5.1f}%  GB/s={b[n]/v if v else 0:7.0f}")
PY
