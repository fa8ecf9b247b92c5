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
udevadm settle --timeout=60 >/dev/null 2>&1
if [ -e "$dev" ]; then fault=damaged-blob; else fault=missing-partition; fi
pass fault "$fault"

if [ "$fault" = missing-partition ]; then
    # The mount gives up after its bounded wait for the device, and
    # kiln-images-failed.service tells the technician, console and journal.
    ran() { [ "$(prop kiln-images-failed.service ExecMainStartTimestampMonotonic)" != 0 ] \
        && [ "$(prop kiln-images-failed.service ActiveState)" != activating ]; }
    if wait_for 300 ran; then
        msg=$(journalctl -b 0 -q --no-pager -u kiln-images-failed.service -o cat | grep -m1 'kiln: the image partition')
        if [ -n "$msg" ] && [[ "$msg" == *"${dev#/dev/disk/by-partuuid/}"* ]]; then
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
    # Nothing of kiln is still waiting on a job.
    jobs=$(systemctl list-jobs --no-legend --plain | grep -E ' (kiln-(registry|mirror|firstboot|images-failed|preload-copy)|var-lib-kiln)' | oneline)
    if [ -z "$jobs" ]; then pass no-kiln-jobs; else fail no-kiln-jobs "$jobs"; fi
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
    # First boot is not declared done with an image missing.
    if [ -e /var/lib/kiln/firstboot.done ]; then fail firstboot-not-done "marker written"; else pass firstboot-not-done "$(prop kiln-firstboot.service ActiveState)"; fi
fi
pass uptime "$(cut -d' ' -f1 /proc/uptime)s"
sync
