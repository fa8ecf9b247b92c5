#!/bin/bash
# Times two kiln binaries against each other and against cp, interleaved,
# on a BenchmarkBuild fixture (KILN_BENCH_KEEP=1 keeps one and prints its
# directory). Each round: cp of the layout's blobs, A cold, B cold, A warm,
# B warm; each run after removing its last output and a sync, timed to a
# final sync. Both share one cache, emptied before each cold build: each
# build's staging links move the layout's files' ctime, so with a cache of
# its own each binary would find the stamps it recorded stale and hash every
# blob again in its warm build.
#
#   test/paired/builds.sh ROUNDS FIXTURE_DIR A_DIR B_DIR [RECIPE]
#
# A_DIR and B_DIR hold a kiln and its kiln-agent (make build's pair).
set -euo pipefail
rounds=$1 dir=$2 a=$3 b=$4 recipe=${5:-bench.yaml}
cd "$dir"
t() { sync; local s; s=$(date +%s.%N); "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }; sync; echo "$(date +%s.%N) - $s" | bc; }
for _ in $(seq "$rounds"); do
  rm -rf cpx; c=$(t cp -r oci/blobs cpx)
  rm -rf cache disk-a.raw; ac=$(XDG_CACHE_HOME=$PWD/cache t "$a/kiln" build "$recipe" -o disk-a.raw)
  rm -rf cache disk-b.raw; bc=$(XDG_CACHE_HOME=$PWD/cache t "$b/kiln" build "$recipe" -o disk-b.raw)
  rm -f disk-a.raw; aw=$(XDG_CACHE_HOME=$PWD/cache t "$a/kiln" build "$recipe" -o disk-a.raw)
  rm -f disk-b.raw; bw=$(XDG_CACHE_HOME=$PWD/cache t "$b/kiln" build "$recipe" -o disk-b.raw)
  echo "cp $c A-cold $ac B-cold $bc A-warm $aw B-warm $bw load $(cut -d' ' -f1 /proc/loadavg)"
done
rm -rf cpx cache disk-a.raw disk-b.raw
