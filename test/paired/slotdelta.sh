#!/bin/bash
# What a stick carries for an OS slot that gained one Debian package: the
# e2e base fixture's /usr as squashfs (1.0), the same with jq and its two
# libraries unpacked into it (1.1), both cut by kiln's chunker; the pack (the
# chunks 1.0 lacks) over the bytes the packages install. For each squashfs
# layout asked for, every chunk size test/slotdelta compares.
#
#   test/paired/slotdelta.sh BASE.raw [MKSQUASHFS-FLAGS...]
#
# BASE.raw: the fixture base (KILN_E2E_CACHE/base-*.raw, built by the e2e
# harness); its third partition is the root. Root (loop mount); needs the
# Debian archive (apt-get download) and mksquashfs.
set -euo pipefail
base=$1
shift
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(-comp zstd -no-fragments)
work=$(mktemp -d)
trap 'umount "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
start=$(sgdisk -i 3 "$base" | awk '/^First sector/{print $3}')
mkdir "$work/mnt" "$work/debs" "$work/pkg"
mount -o ro,loop,offset=$((start * 512)) "$base" "$work/mnt"
cp -a "$work/mnt/usr" "$work/old"
cp -a "$work/mnt/usr" "$work/new"
umount "$work/mnt"
(cd "$work/debs" && apt-get download jq libjq1 libonig5 >/dev/null 2>&1)
for d in "$work"/debs/*.deb; do dpkg -x "$d" "$work/pkg"; done
installed=$(du -sb "$work/pkg/usr" | cut -f1)
cp -a "$work/pkg/usr/." "$work/new/"
for v in old new; do
  mksquashfs "$work/$v" "$work/$v.sqfs" -noappend -no-xattrs -all-root -mkfs-time 0 -all-time 0 \
    -quiet -no-progress "${flags[@]}" >/dev/null
done
echo "mksquashfs ${flags[*]}: 1.0 $(stat -c %s "$work/old.sqfs") bytes, 1.1 $(stat -c %s "$work/new.sqfs") bytes; the packages install $installed bytes"
go run ./test/slotdelta "$work/old.sqfs" "$work/new.sqfs" "$installed"
