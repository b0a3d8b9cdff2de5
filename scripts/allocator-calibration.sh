#!/usr/bin/env bash
# Allocator calibration across traces (docs/benchmarks.md, "Whether the
# stated P(OOM) is calibrated"): replays the four sets of simulated runs
# (55 in all) and counts, per set and per history bucket, the bands of
# stated P(OOM) with 100 jobs or more that are within ±30 % of what they
# realized, outside it by chance alone, or beyond chance.
#
#   scripts/allocator-calibration.sh                          # as the model stands
#   scripts/allocator-calibration.sh --set fallback_sigma=0.2 # a parameter changed in every run
#   SETS=unseen scripts/allocator-calibration.sh              # the two sets no change was chosen on
#
# Arguments are passed to every `simulate` run. Each run's report is kept
# in the directory printed at the end (or $OUT). SETS=unseen runs, instead
# of the four sets, two more of 13 (sparse seeds 71 and 91 on, dense seeds
# 7 and 8): kept to check a change on runs it was not chosen on, once.
set -euo pipefail
case "${SETS:-}" in
  "" | unseen) ;;
  *) echo "SETS must be unset or 'unseen', not '$SETS'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
cargo build --release -p runyard-allocator --bin runyard-allocator
bin="$PWD/target/release/runyard-allocator"
out="${OUT:-$(mktemp -d -t allocator-calibration.XXXXXX)}"
mkdir -p "$out"

sparse="--profile sparse"
noisier="--sigma-max 0.6 --size-sigma 2.0 --spike-rate 0.01"
jumps="--version-share 0.9 --version-jump 1.0"
same_day="--same-day-share 0.5 --retry-delay-hours 6"
bimodal="--bimodal-share 0.3"
waves="--new-share 0.3 --new-package-days 3"

# A set of 13 runs from sparse seed $2 on (and dense seed $3), one of each
# structure.
structures() {
  local set=$1 s=$2 dense=$3
  cat <<EOF
$set|sparse-$s|$sparse --seed $s
$set|sparse-$((s + 1))|$sparse --seed $((s + 1))
$set|sparse-$((s + 2))|$sparse --seed $((s + 2))
$set|noisier-$((s + 3))|$sparse --seed $((s + 3)) $noisier
$set|jumps-$((s + 4))|$sparse --seed $((s + 4)) $jumps
$set|same-day-$((s + 5))|$sparse --seed $((s + 5)) $same_day
$set|bimodal-$((s + 6))|$sparse --seed $((s + 6)) $bimodal
$set|waves-$((s + 7))|$sparse --seed $((s + 7)) $waves
$set|small-$((s + 8))|$sparse --seed $((s + 8)) --size-median 0.2
$set|big-$((s + 9))|$sparse --seed $((s + 9)) --size-median 6
$set|dense-$dense|--seed $dense
$set|sparse-$s-at-1|$sparse --seed $s --target-oom 0.01
$set|sparse-$((s + 1))-at-5|$sparse --seed $((s + 1)) --target-oom 0.05
EOF
}

# set|name|flags (target 3 % unless the flags say otherwise): the 17 runs
# the documented figures come from, 12 held out, then two sets of 13 made
# later.
runs="
documented|dense-1|--seed 1
documented|dense-2|--seed 2
documented|dense-3|--seed 3
documented|dense-1-at-1|--seed 1 --target-oom 0.01
documented|dense-1-at-5|--seed 1 --target-oom 0.05
documented|sparse-1|$sparse --seed 1
documented|sparse-2|$sparse --seed 2
documented|sparse-3|$sparse --seed 3
documented|sparse-1-at-1|$sparse --seed 1 --target-oom 0.01
documented|sparse-1-at-5|$sparse --seed 1 --target-oom 0.05
documented|noisier-4|$sparse --seed 4 $noisier
documented|big-5|$sparse --seed 5 --size-median 6
documented|small-6|$sparse --seed 6 --size-median 0.2
documented|jumps-8|$sparse --seed 8 $jumps
documented|same-day-11|$sparse --seed 11 $same_day
documented|bimodal-12|$sparse --seed 12 $bimodal
documented|waves-13|$sparse --seed 13 $waves
held|sparse-21|$sparse --seed 21
held|sparse-22|$sparse --seed 22
held|sparse-23|$sparse --seed 23
held|sparse-24|$sparse --seed 24
held|noisier-25|$sparse --seed 25 $noisier
held|jumps-26|$sparse --seed 26 $jumps
held|same-day-27|$sparse --seed 27 $same_day
held|bimodal-28|$sparse --seed 28 $bimodal
held|waves-29|$sparse --seed 29 $waves
held|dense-4|--seed 4
held|sparse-21-at-1|$sparse --seed 21 --target-oom 0.01
held|sparse-22-at-5|$sparse --seed 22 --target-oom 0.05
$(structures new 31 5)
$(structures fresh 51 6)
"
if [ "${SETS:-}" = unseen ]; then
  runs="
$(structures unseen-71 71 7)
$(structures unseen-91 91 8)
"
fi

extra=""
for arg in "$@"; do
  extra+=" $(printf '%q' "$arg")"
done
echo "$runs" | while IFS='|' read -r set name flags; do
  [ -n "$set" ] || continue
  case "$flags" in *--target-oom*) target="" ;; *) target="--target-oom 0.03" ;; esac
  printf '%s\0' "$bin simulate --generate $target $flags$extra > $out/$set.$name.txt 2>&1"
done | xargs -0 -P "$(nproc)" -I{} bash -c '{}'

# The first calibration table of each report, one cell a line: set,
# bucket, band (1-5), realized %, stated %, jobs, verdict (within, chance,
# beyond, or none under 100 jobs).
cells="$out/cells.tsv"
for report in "$out"/*.txt; do
  set_name="$(basename "$report" .txt)"
  awk -v run="${set_name%%.*}" '
    /^Calibration of runyard/ { table = 1; next }
    table && seen && !/^\|/ { exit }
    table && /^\| prior samples/ { next }
    table && /^\|---/ { next }
    table && /^\| / {
      seen = 1
      n = split($0, cells, "|")
      bucket = cells[2]; gsub(/^ +| +$/, "", bucket)
      for (i = 3; i < n; i++) {
        if (match(cells[i], /[0-9.]+% \/ [0-9.]+% \([0-9]+\)/) == 0) continue
        cell = substr(cells[i], RSTART, RLENGTH)
        gsub(/[%\/()]/, " ", cell)
        split(cell, v, " ")
        verdict = cells[i] ~ /✓/ ? "within" : cells[i] ~ /≈/ ? "chance" : cells[i] ~ /✗/ ? "beyond" : "none"
        print run "\t" bucket "\t" i - 2 "\t" v[1] "\t" v[2] "\t" v[3] "\t" verdict
      }
      next
    }
  ' "$report"
done > "$cells"

# Verdicts by set and bucket.
awk -F'\t' '
  $7 != "none" { count[$1, $7]++; total[$7]++; sets[$1] = 1
    if ($7 == "beyond") { by_bucket[$2]++; buckets[$2] = 1 } }
  END {
    printf "%-12s %8s %8s %8s\n", "set", "within", "chance", "beyond"
    split("documented held new fresh unseen-71 unseen-91", order, " ")
    for (i = 1; i <= 6; i++) {
      s = order[i]
      if (s in sets) printf "%-12s %8d %8d %8d\n", s, count[s, "within"], count[s, "chance"], count[s, "beyond"]
    }
    printf "%-12s %8d %8d %8d\n\nbeyond chance by bucket:\n", "all", total["within"], total["chance"], total["beyond"]
    for (b in buckets) printf "  %-28s %d\n", b, by_bucket[b]
  }' "$cells"

# Every band of every run pooled, per bucket: kills against the kills the
# stated P(OOM) predicts. A band a few runs miss by chance pools to a ratio
# near 1; a structural miss shows in every run and pools away from it.
# (From the reports' rounded figures: a band's realized and stated rates
# are each within 0.05 points.)
echo
echo "all runs pooled, per bucket and band of stated P(OOM): realized / stated (jobs), ratio"
awk -F'\t' '
  { kills[$2, $3] += $4 * $6 / 100; predicted[$2, $3] += $5 * $6 / 100; jobs[$2, $3] += $6 }
  END {
    split("package never seen|package seen, workload not|1–2|3–5|6+", order, "|")
    split("0–1 %|1–2 %|2–4 %|4–8 %|≥ 8 %", bands, "|")
    printf "  %-28s", "bucket"
    for (b = 1; b <= 5; b++) printf " %24s", bands[b]
    printf "\n"
    for (o = 1; o <= 5; o++) {
      printf "  %-28s", order[o]
      for (b = 1; b <= 5; b++) {
        k = order[o] SUBSEP b
        if (jobs[k] > 0 && predicted[k] > 0)
          printf " %24s", sprintf("%.2f/%.2f (%d) %.2f", 100 * kills[k] / jobs[k], 100 * predicted[k] / jobs[k], jobs[k], kills[k] / predicted[k])
        else
          printf " %24s", "—"
      }
      printf "\n"
    }
  }' "$cells"
echo "reports: $out"
