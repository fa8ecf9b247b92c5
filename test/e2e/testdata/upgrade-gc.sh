#!/bin/bash
# The kubelet's image garbage collector against kiln's pins (gc_test.go,
# issue 24), on every boot of one machine (preload mode copy: every image is
# in CRI-O's writable store, where the collector can remove it). The test
# fills the image filesystem past the kubelet's high threshold (a ballast
# file, then images no kept release has, made here from random bytes:
# nothing comes from a network), and the collector must remove only those
# images: every image of the release being tried, of the current one (the
# rollback target, which runs nothing then) and of the previous one stays.
# Then the rollback runs the current release offline. The negative control: without kiln's pins, the
# same pressure removes a release image.
#
# The pressure: the node's kubelet drop-in (written at boot 2) sets its hard
# eviction threshold at the image GC's high threshold, so the kubelet's
# eviction manager, which looks every 10 s, has the image collector free
# space (DeleteUnusedImages: every unused image it may remove) within a
# minute of the kubelet's start, instead of at the collector's own run every
# 5 minutes. The same collector, the same rules: never a pinned image, never
# one a container uses, never one it first saw less than imageMinimumGCAge
# ago; static pods are critical, so no pod is evicted.
#   boot 1: factory 1.0                               -> plug 1.1, reboot
#   boot 2: 1.1 tried and confirmed (previous 1.0); the kubelet stopped (it
#           collects nothing before the next boot), the drop-in written, the
#           disk filled past the threshold             -> plug 1.3 (broken), reboot
#   boot 3: 1.3 tried, its pod cannot start; the collector removes fill
#           images only; then the health check rolls 1.3 back and reboots
#   boot 4: 1.1 again, its pod on the image the collector kept, nothing
#           restored; pins removed, the kubelet stopped, the disk filled
#           again, the kubelet started: the collector removes 1.0's image
#                                                      -> power off
# Every wait is bounded.
#@LIB@
#@UPGRADE_LIB@
FILLS=$state/fill-ids # image IDs of the fill images, one per line
KCONF=/usr/lib/kubelet/config.yaml
HIGH=$(sed -n 's/^imageGCHighThresholdPercent: *//p' "$KCONF")
DROPIN=/etc/kubernetes/kubelet.conf.d/50-kiln-e2e-gc.conf
APP11_ID= APP10_ID=

# usage: the image filesystem's use in percent, as the kubelet computes it
# (100 - available*100/capacity; ext4's reserved blocks count as used).
usage() { stat -f -c '%a %b' /var/lib/containers/storage | awk '{print 100 - int($1 * 100 / $2)}'; }

# fill PERCENT: bring the image filesystem to at least PERCENT full: a
# ballast file (fallocate: instant, and no image, so the collector cannot
# free it) up to one point below, then images of random bytes (32 MiB each,
# a layer of their own, tagged localhost/kiln-e2e/fill:N; at least two)
# until it is; their IDs go to $FILLS. Filling with images alone took
# minutes of podman under TCG.
BALLAST=/var/lib/kiln-e2e-ballast
fill() {
    local i=0 tmp=/var/tmp/kiln-e2e-fill avail blocks bsize need have
    read -r avail blocks bsize < <(stat -f -c '%a %b %S' /var/lib/containers/storage)
    need=$(((blocks * ($1 - 1) / 100 - (blocks - avail)) * bsize))
    if [ "$need" -gt 0 ]; then
        have=$(stat -c %s "$BALLAST" 2>/dev/null || echo 0)
        fallocate -l $((have + need)) "$BALLAST" || { fail fill "fallocate $BALLAST failed"; return; }
    fi
    mkdir -p "$tmp"
    while { [ "$(usage)" -lt "$1" ] || [ $i -lt 2 ]; } && [ $i -lt 40 ]; do
        i=$((i + 1))
        head -c 32M /dev/urandom >"$tmp/data"
        tar -C "$tmp" -cf "$tmp/layer.tar" data
        id=$(podman import -q "$tmp/layer.tar" "localhost/kiln-e2e/fill:$n-$i") || { fail fill "podman import failed"; break; }
        echo "${id#sha256:}" >>"$FILLS"
        rm -f "$tmp/data" "$tmp/layer.tar"
    done
    rm -rf "$tmp"
    if [ "$(usage)" -ge "$1" ]; then pass fill "$(($(stat -c %s "$BALLAST") >> 20)) MiB of ballast and $i images of 32 MiB: $(usage)% used (the kubelet collects above $HIGH%)"; else fail fill "$(usage)% used after $i images, want $1%"; fi
}

# image_id NAME DIGEST: the image's ID (what the kubelet's log names).
image_id() { podman image inspect --format '{{.Id}}' "${1%:*}@$2"; }

# collected: the image IDs of this boot's "Removing image to free bytes"
# lines of the kubelet, one per line.
collected() { journalctl -b 0 -q --no-pager -u kubelet.service -o cat | sed -n 's/.*Removing image to free bytes.*imageID="\(sha256:\)\{0,1\}\([^"]*\)".*/\2/p' | sort -u; }

case $n in
1)
    settled 1.0.0
    workload 1.0.0
    show_status
    plug 1.1.0
    ;;
2)
    settled 1.1.0
    if status_is previous 1\\.0\\.0; then pass previous 1.0.0; else fail previous "$("$AGENT" agent status | oneline)"; fi
    workload 1.1.0
    # The next boot's kubelet is the one that must meet the full disk: this
    # one stops (its pods run on; the reboot stops them without a kubelet).
    systemctl stop kubelet.service
    # Hard eviction at the collector's high threshold (the file replaces the
    # whole evictionHard map of the OS's configuration).
    printf '%s\n' 'apiVersion: kubelet.config.k8s.io/v1beta1' 'kind: KubeletConfiguration' 'evictionHard:' \
        '  memory.available: 50Mi' "  nodefs.available: $((100 - HIGH))%" "  imagefs.available: $((100 - HIGH))%" '  nodefs.inodesFree: 2%' >"$DROPIN"
    : >"$FILLS"
    fill $((HIGH + 3))
    show_status
    plug 1.3.0 1.3.0-on-1.1
    ;;
3)
    begin_before_crio
    if status_is trying 1\\.3\\.0; then pass trying 1.3.0; else fail trying "$("$AGENT" agent status | oneline)"; fi
    if wait_for 300 journal_has kubelet.service ErrImageNeverPull; then pass workload-failed; else fail workload-failed "no ErrImageNeverPull in the kubelet's journal"; fi
    APP11_ID=$(image_id "$APP:1.1" "${DIGEST[1.1.0]}"); APP10_ID=$(image_id "$APP:1.0" "${DIGEST[1.0.0]}")
    TOOLS_ID=$(image_id "$TOOLS_REF" "$TOOLS_DIGEST"); PAUSE_ID=$(image_id "$PAUSE_REF" "$PAUSE_DIGEST")
    # The eviction manager sees the pressure once the kubelet's stats are up;
    # an image is collectable from the pass after the one that first saw it.
    removed_some() { [ -n "$(collected)" ]; }
    if wait_for 180 removed_some; then
        pass gc-ran "$(journalctl -b 0 -q --no-pager -u kubelet.service -o cat | grep -m1 -E 'attempting to reclaim|Attempting to delete unused images' | cut -c1-200)"
    else
        fail gc-ran "the kubelet removed nothing in 180 s: $(usage)% used"
        diag kubelet.service
    fi
    sleep 20 # the collector removes one image after the other: let it end its pass
    gone=$(collected)
    # Everything it removed was a fill image; the release images all stay.
    stray=$(comm -23 <(echo "$gone") <(sort -u "$FILLS") | xargs)
    if [ -n "$gone" ] && [ -z "$stray" ]; then pass gc-removed-fills-only "$(echo "$gone" | wc -l) of $(wc -l <"$FILLS") fill images removed"; else fail gc-removed-fills-only "removed non-fill images: $stray"; fi
    for id in $APP11_ID $APP10_ID $TOOLS_ID $PAUSE_ID; do
        if grep -qx "$id" <<<"$gone"; then fail gc-kept-release "the kubelet removed $id"; fi
    done
    # shellcheck disable=SC2086
    [ -z "$gone" ] || cri absent gc-fills-absent $gone
    pinned gc-kept-current 1.1.0 true # the rollback target: runs nothing now
    pinned gc-kept-previous 1.0.0 true
    cri pinned gc-kept-trying "$TOOLS_REF" "$TOOLS_DIGEST" true
    cri pinned gc-kept-pause "$PAUSE_REF" "$PAUSE_DIGEST" true
    # The rollback boot starts below the threshold, as after a real
    # collection: the ballast is no image.
    rm -f "$BALLAST"
    # 1.3 is not healthy: kiln-release-check rolls it back and reboots.
    echo "kiln-e2e: waiting for the health check to roll 1.3.0 back and reboot"
    sleep 600
    fail rollback-reboot "no reboot 600 s after the collection: $("$AGENT" agent status | oneline)"
    shutdown_now poweroff
    ;;
4)
    settled 1.1.0
    if "$AGENT" agent status | grep -qE '^last: +rollback 1\.3\.0 FAILED'; then pass rolled-back; else fail rolled-back "$("$AGENT" agent status | oneline)"; fi
    # The rollback runs offline on the image the collector kept: kiln had
    # nothing to put back.
    workload 1.1.0
    restored=$(journalctl -b 0 -q --no-pager -u kiln-restore-images.service -o cat | grep -c '^kiln: restored ')
    if [ "$restored" = 0 ]; then pass nothing-restored; else fail nothing-restored "kiln restored $restored image(s)"; fi
    # The negative control: without the pins the same pressure removes a
    # release image (1.0's: the previous release, which runs nothing). The
    # fill images the last collection left go first, so that 1.0's image is
    # the one image the collector may take.
    xargs -r podman rmi -f <"$FILLS" >/dev/null
    APP10_ID=$(image_id "$APP:1.0" "${DIGEST[1.0.0]}")
    rm -f /etc/crio/crio.conf.d/50-kiln-pins.conf
    systemctl reload crio.service
    wait_for 60 /usr/local/bin/cri-check -timeout 20s pinned x "$APP:1.0" "${DIGEST[1.0.0]}" false || true
    pinned unpinned-previous 1.0.0 false
    # As for boot 3: the pressure is there when the kubelet starts (a
    # running kubelet would collect the fill images as they come, and the
    # disk would never reach the threshold).
    systemctl stop kubelet.service
    : >"$FILLS"
    fill $((HIGH + 3))
    systemctl start kubelet.service
    removed_app10() { collected | grep -qx "$APP10_ID"; }
    if wait_for 180 removed_app10; then pass unpinned-collected "the kubelet removed $APP:1.0 ($APP10_ID)"; else fail unpinned-collected "$APP:1.0 still there after 180 s: $(usage)% used"; diag kubelet.service; fi
    cri absent unpinned-absent "$APP:1.0@${DIGEST[1.0.0]}"
    show_status
    shutdown_now poweroff
    ;;
*)
    fail unexpected-boot "boot $n"
    shutdown_now poweroff
    ;;
esac
