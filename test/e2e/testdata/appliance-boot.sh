#!/bin/bash
# Runs in a kiln appliance on every boot (installed by an Ignition fragment of
# the recipe, merged by kiln build): checks what kiln's units did and prints
# one "KILN-E2E: <name> PASS|FAIL <detail>" line per check; the unit then
# powers the machine off. Boot 1 checks the first boot, boot 2 the second.
# The test fills in the @…@ values (references and their locked digests).
# Every wait is bounded: TCG is slow, but nothing may wait forever.
#@LIB@
# diag UNIT...: the tail of their journal on the console, for a failed check.
diag() { for u in "$@"; do journalctl -b 0 -q --no-pager -n 15 -u "$u" | sed "s/^/diag $u: /"; done; }
# registry_settled: active, restarting in a loop, or without its partition
# (no point waiting longer).
registry_settled() {
    is_active kiln-registry.service || [ "$(prop kiln-registry.service NRestarts)" -ge 3 ] || ! findmnt -n "$MNT"
}
# After a failed check, what depends on it gets a short wait, so a broken
# appliance still reports every check well within the boot's bound.
short_or() { if [ "$1" = yes ]; then echo "$2"; else echo 10; fi; }
reg_ok=no; pull_ok=no

MNT=/var/lib/kiln/images
DROPIN=/etc/containers/registries.conf.d/50-kiln-mirror.conf
PINS=/etc/crio/crio.conf.d/50-kiln-pins.conf
LINE="@HELLO_LINE@"
# name digest, one per line
PRELOADED="@HELLO_REF@ @HELLO_DIGEST@
@PRELOADED_REF@ @PRELOADED_DIGEST@"
SERVED_REF="@SERVED_REF@"
SERVED_DIGEST="@SERVED_DIGEST@"
ALL="$PRELOADED
$SERVED_REF $SERVED_DIGEST"

WORKLOAD_POD="@WORKLOAD_POD@"
PRELOAD_MODE="@PRELOAD_MODE@"
HELLO_REF="@HELLO_REF@"
HELLO_DIGEST="@HELLO_DIGEST@"

state=/var/lib/kiln-e2e
mkdir -p "$state"
n=$(( $(cat "$state/boots" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$state/boots"
pass boot "n=$n"

ign=$(journalctl -b 0 -q --no-pager -t ignition | wc -l)
pass ignition-this-boot "lines=$ign"

# short NAME: the check-name form of an image name (quay.io/x/hello:1.0 -> hello).
short() { local n=${1##*/}; echo "${n%%:*}"; }
# check_image NAME DIGEST: the image is in local storage with that digest.
check_image() {
    local got
    if got=$(podman image inspect --format '{{.Digest}}' "$1" 2>&1) && [ "$got" = "$2" ]; then
        pass "image-$(short "$1")" "$2"
    else
        fail "image-$(short "$1")" "want $2, got: ${got:0:160}"
    fi
}
# check_run NAME: a container of the image runs, offline, and says hello.
check_run() {
    local got
    got=$(timeout 180 podman run --rm --network none "$1" 2>&1)
    if [ "$got" = "$LINE" ]; then pass "run-$(short "$1")"; else fail "run-$(short "$1")" "got: ${got:0:200}"; fi
}
# mount_checks: the partition is mounted read-only, from the partition
# whose PARTUUID the test compares with the GPT (detail of mount-partuuid).
mount_checks() {
    if ! wait_for 240 findmnt -n "$MNT"; then
        fail mount-ro "nothing mounted on $MNT after 240 s: $(prop var-lib-kiln-images.mount ActiveState)"
        fail mount-partuuid none
        return
    fi
    local src opts pu
    src=$(findmnt -n -o SOURCE "$MNT"); opts=$(findmnt -n -o OPTIONS "$MNT")
    if [[ ",$opts," == *,ro,* ]]; then pass mount-ro "$src $opts"; else fail mount-ro "$src $opts"; fi
    # dm-verity (issue 9): the mount's source is the verity device; the
    # partition under it is what the GPT check compares.
    local part=$src name
    if [[ $src == /dev/mapper/* ]]; then
        name=${src#/dev/mapper/}
        part=$(veritysetup status "$name" | sed -n 's/^ *data device: *//p')
        if veritysetup status "$name" 2>&1 | grep -q 'type: *VERITY'; then
            pass mount-verity "$(veritysetup status "$name" | grep -E 'status|root hash|data device' | oneline 300)"
        else
            fail mount-verity "$src is not a verity device: $(veritysetup status "$name" 2>&1 | oneline 200)"
        fi
    else
        fail mount-verity "$src is the partition itself, not a verity device"
    fi
    pu=$(blkid -p -s PART_ENTRY_UUID -o value "$part" 2>&1)
    # The detail is compared with the GPT by the test; the unit must name it too.
    if [ "$(unit_what)" = "/dev/disk/by-partuuid/$pu" ] ||
        systemctl cat kiln-images-verity.service 2>/dev/null | grep -q "^ExecStart=.* /dev/disk/by-partuuid/$pu "; then
        pass mount-partuuid "$pu"
    else
        fail mount-partuuid "$pu (unit What=$(unit_what))"
    fi
}

# crio_checks: CRI-O runs, started only once the image partition was mounted
# (its preloaded store is an additional image store), and through the CRI
# every image given as NAME=DIGEST is listed with that digest and pinned.
crio_checks() {
    local m c
    if wait_for 240 is_active crio.service; then
        m=$(prop var-lib-kiln-images.mount ActiveEnterTimestampMonotonic)
        c=$(prop crio.service ExecMainStartTimestampMonotonic)
        if [ "${m:-0}" -gt 0 ] && [ "${c:-0}" -ge "$m" ]; then
            pass crio-after-mount "mount=${m}us crio-start=${c}us mode=$PRELOAD_MODE"
        else
            fail crio-after-mount "mount=${m}us crio-start=${c}us"
        fi
    else
        fail crio-after-mount "crio.service $(prop crio.service ActiveState)/$(prop crio.service Result)"
        diag crio.service
    fi
    /usr/local/bin/cri-check -timeout 60s images "$@" || diag crio.service
}
# workload_checks: the kubelet runs the static pod $WORKLOAD_POD through CRI-O
# from the preloaded image, and CRI-O pulled nothing for it.
workload_checks() {
    if pod_up "$WORKLOAD_POD" 240; then
        pass workload-up "$(cut -d' ' -f1 /proc/uptime)s after boot"
    else
        fail workload-up "pod $WORKLOAD_POD not ready: $(/usr/local/bin/cri-check -timeout 20s ready "$WORKLOAD_POD" 2>&1 | oneline)"
        diag kubelet.service crio.service
    fi
    /usr/local/bin/cri-check -timeout 60s workload "$WORKLOAD_POD" "$HELLO_REF" "$HELLO_DIGEST" "$LINE" || diag kubelet.service crio.service
    local pulls
    pulls=$(journalctl -b 0 -q --no-pager -u crio.service -o cat | grep -c "Pulling image: ${HELLO_REF%:*}")
    if [ "$pulls" = 0 ]; then pass workload-no-pull; else fail workload-no-pull "CRI-O logged $pulls pulls of ${HELLO_REF%:*}"; fi
}
# served_pod: the served image's static pod runs (the first boot puts its
# manifest in place once it pulled the image; the kubelet runs it from then
# on, also after the power cut). The power is cut without a sync: the
# manifest goes in durably (temp beside, fsync, rename, fsync the directory;
# the kubelet ignores dot files), or ext4 leaves it empty.
served_pod() {
    local dir=/etc/kubernetes/manifests
    if [ ! -e $dir/served.yaml ]; then
        cp "@SERVED_MANIFEST@" $dir/.served.yaml && sync $dir/.served.yaml && mv $dir/.served.yaml $dir/served.yaml && sync $dir
    fi
    if pod_up served 240; then pass served-pod-up; else
        fail served-pod-up "$(/usr/local/bin/cri-check -timeout 20s ready served 2>&1 | oneline)"; diag kubelet.service
    fi
}
PRELOADED_ARGS=$(while read -r name digest; do printf '%s=%s ' "$name" "$digest"; done <<< "$PRELOADED")
if [ "$n" = 1 ]; then
    if journalctl -b 0 -q --no-pager -t ignition | grep -q 'Ignition finished successfully'; then
        pass ignition
    else
        fail ignition "no 'Ignition finished successfully' in this boot's journal"
    fi
    # No NIC (CRI-O's pod bridge and veths stay on the node), and every
    # upstream name points at a dead address.
    nics=$(ip -o link | grep -vE '^[0-9]+: (lo|cni0|veth[^:]*):' | xargs)
    if [ -n "$nics" ]; then fail upstreams-dead "a network interface exists: $nics"
    elif ! getent hosts quay.io | grep -q '^127.0.0.9'; then fail upstreams-dead "quay.io resolves to $(getent hosts quay.io)"
    elif timeout 10 curl -sS -o /dev/null https://quay.io/v2/ 2>/dev/null; then fail upstreams-dead "quay.io answers"
    else pass upstreams-dead; fi

    mount_checks

    wait_for 240 registry_settled
    if is_active kiln-registry.service; then
        reg_ok=yes
        ready=$(journalctl -b 0 -q --no-pager -u kiln-registry.service | grep -m1 'msg=ready')
        # Through dm-verity the registry must see it (issue 26: only there are
        # a blob's bytes trusted without a check bound to its file).
        if [ -z "$ready" ]; then fail registry-ready "active, but no 'ready' line in its journal"
        elif [[ $(findmnt -n -o SOURCE "$MNT") == /dev/mapper/* && $ready != *"1 of 1 layouts on dm-verity"* ]]; then
            fail registry-ready "the partition is mounted through dm-verity, the registry does not see it: ${ready:0:300}"
        else pass registry-ready "${ready:0:300}"; fi
    else
        fail registry-ready "not active: $(prop kiln-registry.service ActiveState)/$(prop kiln-registry.service SubState), restarts $(prop kiln-registry.service NRestarts)"
        diag kiln-registry.service
    fi

    # The drop-in appears only after the registry said READY: compare the
    # journal's monotonic timestamps of both events, and systemd's own view.
    if wait_for "$(short_or $reg_ok 180)" test -f "$DROPIN"; then
        t_ready=$(journalctl -b 0 -q --no-pager -o short-monotonic -u kiln-registry.service | grep -m1 'msg=ready' | sed -E 's/^\[ *([0-9.]+)\].*/\1/')
        t_write=$(journalctl -b 0 -q --no-pager -o short-monotonic -u kiln-mirror.service | grep -m1 'mirror on:' | sed -E 's/^\[ *([0-9.]+)\].*/\1/')
        reg_up=$(prop kiln-registry.service ActiveEnterTimestampMonotonic)
        gate_start=$(prop kiln-mirror.service ExecMainStartTimestampMonotonic)
        d="ready=${t_ready:-none} write=${t_write:-none} registry-active=${reg_up}us gate-start=${gate_start}us"
        if [ -n "$t_ready" ] && [ -n "$t_write" ] && awk -v r="$t_ready" -v w="$t_write" 'BEGIN{exit !(r < w)}' \
            && [ "${reg_up:-0}" -gt 0 ] && [ "${gate_start:-0}" -ge "$reg_up" ]; then
            pass mirror-after-ready "$d"
        else
            fail mirror-after-ready "$d"
        fi
    else
        fail mirror-after-ready "no $DROPIN: kiln-mirror.service $(prop kiln-mirror.service ActiveState)"
        diag kiln-mirror.service
    fi

    # shellcheck disable=SC2086
    crio_checks $PRELOADED_ARGS
    workload_checks

    while read -r name digest; do check_image "$name" "$digest"; done <<< "$PRELOADED"
    while read -r name _; do check_run "$name"; done <<< "$PRELOADED"

    # Served only: pulled by CRI-O (PullImage through the CRI, as kubelet
    # does) through the mirror, from the node's own registry; podman then
    # sees it in the same containers/storage.
    if /usr/local/bin/cri-check -timeout 180s pull "$SERVED_REF" "$SERVED_DIGEST"; then
        got=$(podman image inspect --format '{{.Digest}}' "$SERVED_REF" 2>&1)
        if [ "$got" = "$SERVED_DIGEST" ]; then pull_ok=yes; pass "pull-$(short "$SERVED_REF")" "$got"; else fail "pull-$(short "$SERVED_REF")" "digest $got, want $SERVED_DIGEST"; fi
        /usr/local/bin/cri-check -timeout 60s images "$SERVED_REF=$SERVED_DIGEST"
    else
        fail "pull-$(short "$SERVED_REF")" "CRI PullImage failed (cri-pull line above)"
        diag kiln-registry.service kiln-mirror.service crio.service
    fi
    # ...and the node's registry is what answered it.
    served_path="/v2/${SERVED_REF%:*}/manifests/"
    reqs=$(journalctl -b 0 -q --no-pager -u kiln-registry.service -o cat | grep -c "msg=request method=GET path=$served_path")
    if [ "$reqs" -gt 0 ]; then pass registry-served-pull "GET $served_path: $reqs"; else fail registry-served-pull "the registry logged no GET of $served_path"; fi

    # Pins: every image by repo@digest, exactly.
    missing=""
    while read -r name digest; do
        grep -qF "\"${name%:*}@$digest\"" "$PINS" 2>/dev/null || missing="$missing ${name%:*}@$digest"
    done <<< "$ALL"
    if [ -z "$missing" ]; then pass pins "$(grep -c @sha256: "$PINS") digest pins"; else fail pins "missing:$missing; file: $(head -c 300 "$PINS" 2>&1 | xargs)"; fi

    # First boot completes once every image is in local storage; then the
    # registry stops, and the mirror goes first.
    done_ok() { [ -f /var/lib/kiln/firstboot.done ] && [ "$(prop kiln-firstboot.service ActiveState)" != activating ]; }
    if wait_for "$(short_or $pull_ok 240)" done_ok; then
        r=$(prop kiln-firstboot.service Result)
        if [ "$r" = success ]; then pass firstboot-done "$(prop kiln-firstboot.service ActiveState)/$r"; else fail firstboot-done "result $r"; fi
    else
        fail firstboot-done "no marker: $(prop kiln-firstboot.service ActiveState)/$(prop kiln-firstboot.service SubState); $(journalctl -b 0 -q --no-pager -u kiln-firstboot.service | tail -n 2 | xargs | cut -c1-240)"
    fi
    stopped() { [ "$(prop kiln-registry.service ActiveState)" = inactive ]; }
    if wait_for "$(short_or $pull_ok 120)" stopped; then pass registry-stopped; else fail registry-stopped "$(prop kiln-registry.service ActiveState)"; fi
    if wait_for "$(short_or $pull_ok 60)" test ! -e "$DROPIN"; then pass mirror-removed; else fail mirror-removed "$DROPIN still there"; fi
    if timeout 5 curl -sf http://127.0.0.1:5050/v2/ >/dev/null 2>&1; then fail registry-port-closed "127.0.0.1:5050 still answers"; else pass registry-port-closed; fi

    # Pins follow `systemctl reload crio` (SIGHUP; upgrades rely on it, see
    # docs/units.md): a later drop-in that pins only the preloaded image
    # unpins the served one; removing it pins it again.
    reloads() { journalctl -b 0 -q --no-pager -u crio.service -o cat | grep -c 'Configuration reload completed'; }
    reloaded_since() { [ "$(reloads)" -gt "$1" ]; }
    # reload_pins CHECK PINNED: systemctl reload crio, then CRI-O must
    # report the served image's pinned flag as PINNED within 60 s (the
    # gate's own asynchronous reloads may complete in between, so wait for
    # the outcome, not for one log line).
    reload_pins() {
        local before; before=$(reloads)
        if ! systemctl reload crio.service || ! wait_for 60 reloaded_since "$before"; then
            fail "$1" "no 'Configuration reload completed' from CRI-O within 60 s"; diag crio.service; return
        fi
        wait_for 60 /usr/local/bin/cri-check -timeout 20s pinned "$1" "$SERVED_REF" "$SERVED_DIGEST" "$2"
        /usr/local/bin/cri-check -timeout 60s pinned "$1" "$SERVED_REF" "$SERVED_DIGEST" "$2"
    }
    extra=/etc/crio/crio.conf.d/60-kiln-e2e-reload.conf
    printf '[crio.image]\npinned_images = ["%s"]\n' "@PRELOADED_REF@" > "$extra"
    reload_pins cri-reload-unpins false
    rm -f "$extra"
    reload_pins cri-reload-pins true
    # A pod of the served-only image runs beside the workload when the power
    # is cut (after the checks below): the next boot must find it restorable.
    served_pod
else
    # Second and later boots: nothing of the first boot runs again.
    if [ "$(prop kiln-firstboot.service ConditionResult)" = no ] && [ "$(prop kiln-firstboot.service ExecMainStartTimestampMonotonic)" = 0 ]; then
        pass firstboot-skipped
    else
        fail firstboot-skipped "ConditionResult=$(prop kiln-firstboot.service ConditionResult) started=$(prop kiln-firstboot.service ExecMainStartTimestampMonotonic)"
    fi
    mount_checks
    restore_checks kubelet.service
    sleep 5 # give anything wrongly queued a moment to show itself
    if [ "$(prop kiln-registry.service ExecMainStartTimestampMonotonic)" = 0 ] && ! is_active kiln-registry.service; then
        pass registry-not-started
    else
        fail registry-not-started "$(prop kiln-registry.service ActiveState), started at $(prop kiln-registry.service ExecMainStartTimestampMonotonic)"
    fi
    if [ -e "$DROPIN" ]; then fail no-mirror "$DROPIN exists"; else pass no-mirror; fi
    # shellcheck disable=SC2086
    crio_checks $PRELOADED_ARGS "$SERVED_REF=$SERVED_DIGEST"
    workload_checks
    while read -r name digest; do check_image "$name" "$digest"; done <<< "$ALL"
    check_run "@HELLO_REF@"
    check_run "$SERVED_REF" # pulled through the mirror at first boot
    served_pod
fi

failed=$(systemctl --failed --plain --no-legend | awk '{print $1}' | xargs)
if [ -z "$failed" ]; then pass failed-units; else
    # The first error line of each says why (e.g. podman.service started
    # before the image partition was mounted: its additional store is missing).
    why=$(for u in $failed; do journalctl -b 0 -q --no-pager -o cat -u "$u" | grep -m1 -i 'error' | cut -c1-160; done | oneline)
    fail failed-units "$failed: $why"
    diag $failed
fi
pass uptime "$(cut -d' ' -f1 /proc/uptime)s"
if [ "$n" = 1 ] && [ "@POWER_CUT@" = yes ]; then
    # The power is cut while CRI-O runs both pods (the test presses QEMU's
    # reset): nothing is synced or stopped first. ext4 has committed this
    # boot's files by now (5 s commit interval): what CRI-O does to its
    # store at the next start is what a field appliance meets.
    sleep 10
    echo "kiln-e2e: cut the power"
    sleep 600
    fail power-cut "the power was not cut within 600 s"
fi
sync
