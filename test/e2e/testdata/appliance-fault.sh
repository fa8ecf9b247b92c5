#!/bin/bash
# Runs in a damaged kiln appliance (installed by an Ignition fragment of the
# recipe): reports how the node copes, one "KILN-E2E: <name> PASS|FAIL
# <detail>" line per check, then the unit powers the machine off.
# The test damages a copy of the built disk one of two ways, and requires
# the checks of that way:
#   missing partition (GPT entry deleted): fault=missing-partition, ...
#   damaged blob (bytes flipped in a layer blob on the partition): fault=damaged-blob, ...
# The test fills in the @…@ values. Every wait is bounded.
#@LIB@

MNT=/var/lib/kiln/images
DROPIN=/etc/containers/registries.conf.d/50-kiln-mirror.conf
SERVED_REF="@SERVED_REF@"
LAYER="@LAYER_DIGEST@"

dev=$(unit_what)
# dm-verity (issue 9): the partition is the verity unit's data device.
vdev=$(systemctl cat kiln-images-verity.service 2>/dev/null | sed -n 's/^ExecStart=[^ ]* open \([^ ]*\) .*/\1/p')
dev=${vdev:-$dev}
udevadm settle --timeout=60 >/dev/null 2>&1
ran() { [ "$(prop kiln-images-failed.service ExecMainStartTimestampMonotonic)" != 0 ] \
    && [ "$(prop kiln-images-failed.service ActiveState)" != activating ]; }
if [ -e "$dev" ]; then
    # dm-verity (issue 9): the partition is there; a hash tree that does not
    # match (bad-tree) fails the mount, a changed layer block does not.
    settled() { findmnt -n "$MNT" >/dev/null || ran; }
    wait_for 240 settled
    if findmnt -n "$MNT" >/dev/null; then fault=damaged-blob; else fault=bad-tree; fi
else
    fault=missing-partition
fi
pass fault "$fault"

if [ "$fault" != damaged-blob ]; then
    # The mount gives up after its bounded wait for the device (or dm-verity
    # refuses the partition), and kiln-images-failed.service tells the
    # technician, console and journal.
    if [ "$fault" = bad-tree ]; then
        why=$(journalctl -b 0 -q --no-pager -o cat -u kiln-images-verity.service -u var-lib-kiln-images.mount | grep -iE 'verity|corrupt|fail|superblock|error' | tail -n 3 | oneline 300)
        pass bad-tree-reason "${why:-none}"
    fi
    if wait_for 300 ran; then
        msg=$(journalctl -b 0 -q --no-pager -u kiln-images-failed.service -o cat | grep -m1 'kiln: the image partition')
        # The GUID the units wait for (the mount's own, or under dm-verity
        # the verity unit's) must be in the message.
        guid=$(systemctl show -P Description var-lib-kiln-images.mount | sed -n 's/.*partition GUID \([0-9a-f-]*\).*/\1/p')
        if [ -n "$msg" ] && [ -n "$guid" ] && [[ "$msg" == *"$guid"* ]]; then
            pass images-failed-message "$(echo "$msg" | cut -c1-200)"
        else
            fail images-failed-message "message lacks the GUID or is missing: ${msg:-none}"
        fi
    else
        fail images-failed-message "kiln-images-failed.service did not run within 300 s (mount: $(prop var-lib-kiln-images.mount ActiveState)/$(prop var-lib-kiln-images.mount Result))"
    fi
    if findmnt -n "$MNT" >/dev/null; then fail mount-absent "something is mounted on $MNT"; else pass mount-absent "mount $(prop var-lib-kiln-images.mount ActiveState)/$(prop var-lib-kiln-images.mount Result)"; fi
    # Nothing serves and nothing points at a registry that is not there.
    if is_active kiln-registry.service; then fail registry-down "kiln-registry.service is active"; else pass registry-down "$(prop kiln-registry.service ActiveState)/$(prop kiln-registry.service Result)"; fi
    if [ -e "$DROPIN" ]; then fail no-mirror "$DROPIN exists"; else pass no-mirror; fi
    # CRI-O reads the preloaded store on the partition: it must not run
    # without it (its job failed on the mount, and the console says so).
    if is_active crio.service; then fail crio-not-started "crio.service is active without the image partition"; else
        pass crio-not-started "$(prop crio.service ActiveState)/$(prop crio.service Result)"
    fi
    # Nothing of kiln waits for ever. The kubelet, restarting without a
    # runtime, wants CRI-O again, and CRI-O's start asks for the image mount
    # again: such a retry is bounded like the first attempt and ends, so
    # wait (bounded) for a moment with no kiln job queued.
    kiln_jobs() { systemctl list-jobs --no-legend --plain | grep -E ' (kiln-(registry|mirror|firstboot|images-failed|preload-copy)|var-lib-kiln)'; }
    no_kiln_jobs() { [ -z "$(kiln_jobs)" ]; }
    if wait_for 300 no_kiln_jobs; then pass no-kiln-jobs; else fail no-kiln-jobs "after 300 s: $(kiln_jobs | oneline)"; fi
else
    if wait_for 240 findmnt -n "$MNT"; then mnt_wait=180; pass mounted; else mnt_wait=10; fail mounted "$(prop var-lib-kiln-images.mount ActiveState)"; fi
    if wait_for "$mnt_wait" test -f "$DROPIN"; then pass mirror-on; else fail mirror-on "no $DROPIN after $mnt_wait s"; fi
    # The pull must fail: an error, never an image made of wrong bytes.
    if out=$(timeout 180 podman pull "$SERVED_REF" 2>&1); then
        fail pull-refused "podman pull succeeded: $(echo "$out" | tail -n1)"
    else
        pass pull-refused "$(echo "$out" | tail -n 2 | oneline 200)"
    fi
    if podman image exists "$SERVED_REF" 2>/dev/null; then fail not-stored "$SERVED_REF is in local storage"; else pass not-stored; fi
    # The registry's journal names the damaged blob.
    line=$(journalctl -b 0 -q --no-pager -u kiln-registry.service -o cat | grep 'damaged' | grep -m1 "${LAYER#sha256:}")
    if [ -n "$line" ]; then pass registry-names-blob "$(echo "$line" | cut -c1-300)"; else
        fail registry-names-blob "no 'damaged' line naming $LAYER; last: $(journalctl -b 0 -q --no-pager -u kiln-registry.service -o cat | tail -n 3 | oneline)"
    fi
    # dm-verity (issue 9): the kernel refused the changed block, on the console.
    line=$(journalctl -b 0 -k -q --no-pager -o cat | grep -m1 'verity.*corrupted')
    if [ -n "$line" ]; then pass verity-refused "$line"; else fail verity-refused "no dm-verity corruption message in the kernel log"; fi
    # First boot is not declared done with an image missing.
    if [ -e /var/lib/kiln/firstboot.done ]; then fail firstboot-not-done "marker written"; else pass firstboot-not-done "$(prop kiln-firstboot.service ActiveState)"; fi
fi
pass uptime "$(cut -d' ' -f1 /proc/uptime)s"
sync
