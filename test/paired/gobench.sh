#!/bin/bash
# Pairs two sub-benchmarks of one Go test binary, for the benchmarks that
# report each side on its own line (BenchmarkVerityTree's kiln and
# veritysetup, the registry's kiln and direct, …): go test runs one side's
# iterations, then the other's, so on a shared machine a change of load
# between them lands in the ratio. Here the two run alternately, each pair
# in the same moment (which goes first alternates), and the ratio of each
# pair's ns/op, candidate / baseline (times: lower is better for the
# candidate), is printed with the median and range and the load average.
#
#   go test -c -tags … -o partitions.test ./partitions/
#   test/paired/gobench.sh RUNS ./partitions.test BASELINE CANDIDATE [-test.benchtime 3x …]
#
# BASELINE and CANDIDATE are -test.bench patterns, each matching one
# benchmark (e.g. 'VerityTree/veritysetup$' 'VerityTree/kiln$'); the flags
# after them go to the test binary.
set -euo pipefail
runs=$1 bin=$2 base=$3 cand=$4
shift 4
# nsop PATTERN: the ns/op of the one benchmark PATTERN matches.
nsop() {
  local pattern=$1 out n
  shift
  out=$("$bin" -test.run '^$' -test.bench "$pattern" "$@" 2>&1) || { echo "$out" >&2; exit 1; }
  n=$(awk '{ for (i = 2; i <= NF; i++) if ($i == "ns/op") { print $(i-1); c++ } } END { if (c != 1) exit 1 }' <<<"$out") ||
    { echo "pattern $pattern did not match exactly one benchmark:" >&2; echo "$out" >&2; exit 1; }
  echo "$n"
}
ratios=()
for i in $(seq "$runs"); do
  if [ $((i % 2)) -eq 1 ]; then
    b=$(nsop "$base" "$@"); c=$(nsop "$cand" "$@")
  else
    c=$(nsop "$cand" "$@"); b=$(nsop "$base" "$@")
  fi
  r=$(awk -v c="$c" -v b="$b" 'BEGIN { printf "%.3f\n", c / b }')
  echo "pair $i: $base $b ns/op, $cand $c ns/op, $cand / $base $r"
  ratios+=("$r")
done
sorted=$(printf '%s\n' "${ratios[@]}" | sort -g)
n=${#ratios[@]}
median=$(awk -v n="$n" '{ v[NR] = $1 } END { if (n % 2) print v[(n+1)/2]; else printf "%.3f\n", (v[n/2] + v[n/2+1]) / 2 }' <<<"$sorted")
echo "$cand / $base (time): median $median ($(head -1 <<<"$sorted")–$(tail -1 <<<"$sorted")) over $n pairs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
