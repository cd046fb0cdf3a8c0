#!/usr/bin/env bash
# Runs the contention benchmarks RUNS times (default 2) and prints, for each
# scenario and thread count, every competitor's throughput as a ratio to
# governor keyed from the same run: the median over runs, with the lowest
# and highest run. Then prints bytes per key, the paired ratios of
# benches/paired.rs and the latency of benches/latency.rs.
#
#   bash scripts/bench.sh                 # full suite, 2 runs (~10 minutes)
#   RUNS=3 bash scripts/bench.sh
#   bash scripts/bench.sh hot_deny        # only benchmarks matching a filter
#
# Results of each run are kept in $TARGET/bench-runs/run-N.tsv; the summary
# is also written to $TARGET/bench-runs/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-2}"
FILTER="${1:-}"
TARGET="${CARGO_TARGET_DIR:-target}"
OUT="$TARGET/bench-runs"
CRITERION="$TARGET/criterion"
mkdir -p "$OUT"
rm -f "$OUT"/run-*.tsv

echo "== machine"
uname -srm
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' || true
echo "cores: $(nproc)"
rustc --version

cargo bench --no-run --bench contention --bench bytes_per_key --bench paired --bench latency >/dev/null 2>&1 \
  || cargo bench --no-run --bench contention --bench bytes_per_key --bench paired --bench latency

for run in $(seq 1 "$RUNS"); do
  echo "== run $run of $RUNS (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  rm -rf "$CRITERION"
  cargo bench --bench contention -- --noplot ${FILTER:+"$FILTER"} >"$OUT/run-$run.log" 2>&1 \
    || { tail -30 "$OUT/run-$run.log"; exit 1; }
  python3 - "$CRITERION" "$OUT/run-$run.tsv" <<'PY'
import json, os, sys
root, out = sys.argv[1], sys.argv[2]
rows = []
for dirpath, _, files in os.walk(root):
    if os.path.basename(dirpath) != "new" or "estimates.json" not in files:
        continue
    with open(os.path.join(dirpath, "benchmark.json")) as f:
        bench = json.load(f)
    with open(os.path.join(dirpath, "estimates.json")) as f:
        est = json.load(f)
    elements = (bench.get("throughput") or {}).get("Elements", 1)
    ns = est["median"]["point_estimate"]
    rows.append((bench["group_id"], bench["function_id"], bench["value_str"], elements * 1e9 / ns))
with open(out, "w") as f:
    for r in sorted(rows):
        f.write("%s\t%s\t%s\t%.0f\n" % r)
PY
  echo "   $(wc -l <"$OUT/run-$run.tsv") benchmarks, load after: $(cut -d' ' -f1-3 /proc/loadavg)"
done

python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import glob, statistics, sys
from collections import defaultdict
out = sys.argv[1]
runs = []
for path in sorted(glob.glob(out + "/run-*.tsv")):
    data = {}
    for line in open(path):
        group, func, param, rate = line.rstrip("\n").split("\t")
        data[(group, func, param)] = float(rate)
    runs.append(data)
order = ["keyrate", "keyrate_nocache", "keyrate_nostats", "keyrate_under", "keyrate_handle", "governor", "mutex_hashmap", "dashmap_tuple",
         "scc_box_word", "atomic_floor"]
groups = ["hot_admit", "hot_deny", "spread", "churn", "mixed"]
targets = {("hot_deny", "1"): 1.5, ("hot_deny", "2"): 5, ("hot_admit", "1"): 1.5,
           ("hot_admit", "2"): 3, ("spread", "1"): 1.5, ("spread", "2"): 1.5,
           ("churn", "1"): 1.7, ("churn", "2"): 1.7}
print("Throughput as a ratio to governor keyed in the same run: median of %d runs "
      "[lowest-highest]; governor's own median in M calls/s." % len(runs))
print()
print("| scenario | threads | governor M/s | " + " | ".join(f for f in order if f != "governor") + " | target (keyrate) |")
print("|---|---:|---:|" + "---:|" * (len(order) - 1) + "---|")
for group in groups:
    for threads in ["1", "2", "4"]:
        gov = [r.get((group, "governor", threads)) for r in runs]
        if not all(gov):
            continue
        cells = []
        for func in order:
            if func == "governor":
                continue
            ratios = [r[(group, func, threads)] / r[(group, "governor", threads)]
                      for r in runs if (group, func, threads) in r]
            if not ratios:
                cells.append("-")
            elif len(ratios) == 1:
                cells.append("%.2fx" % ratios[0])
            else:
                cells.append("%.2fx [%.2f-%.2f]" % (statistics.median(ratios), min(ratios), max(ratios)))
        target = targets.get((group, threads))
        verdict = "-"
        if target:
            ratios = [r[(group, "keyrate", threads)] / r[(group, "governor", threads)]
                      for r in runs if (group, "keyrate", threads) in r]
            med = statistics.median(ratios)
            verdict = ">= %gx: %s" % (target, "met" if med >= target else "MISSED")
        print("| %s | %s | %.1f | %s | %s |" % (group, threads, statistics.median(gov) / 1e6,
                                               " | ".join(cells), verdict))
hasher = [(r.get(("hasher", "foldhash", "40B")), r.get(("hasher", "siphash", "40B"))) for r in runs]
hasher = [h for h in hasher if all(h)]
if hasher:
    print()
    print("Hasher on a 40-byte key: foldhash %.1f ns, SipHash-1-3 %.1f ns (median of runs)."
          % (statistics.median(1e9 / h[0] for h in hasher),
             statistics.median(1e9 / h[1] for h in hasher)))
PY

echo
cargo bench --bench bytes_per_key 2>/dev/null | tee -a "$OUT/summary.md"

# The paired, interleaved ratios (robust against the machine's slow and
# fast phases) and the latency of single calls. PAIRED=0 skips both.
if [ "${PAIRED:-1}" != 0 ] && [ -z "$FILTER" ]; then
  echo | tee -a "$OUT/summary.md"
  echo "== paired ratios (benches/paired.rs)" | tee -a "$OUT/summary.md"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.md"
  cargo bench --bench paired 2>/dev/null | tee -a "$OUT/summary.md"
  echo | tee -a "$OUT/summary.md"
  echo "== latency (benches/latency.rs)" | tee -a "$OUT/summary.md"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.md"
  cargo bench --bench latency 2>/dev/null | tee -a "$OUT/summary.md"
fi
