#!/bin/bash
# The field-upgrade scenario (upgrade_test.go), on every boot of one machine.
# It plays the technician: it asks the test to plug a stick in (a console line
# "kiln-e2e: plug VERSION"; the test hot-plugs it through QEMU's monitor and
# pulls it out when the console says the stick may be removed), waits until
# the release is staged and the stick gone, then reboots, as the recipe's
# reboot policy (command) asks. Each boot checks what the upgrade did and
# prints "KILN-E2E: bN-<check> PASS|FAIL" lines, and its release state as
# "KILN-E2E-STATUS: n=N {kiln agent status -o json}" for the test to read.
#   boot 1: factory 1.0                       -> plug 1.1 (delta from 1.0)
#   boot 2: 1.1 tried and confirmed           -> plug 1.2 (delta from 1.1)
#   boot 3: 1.2 tried and confirmed, 1.0 gone -> plug 1.3 (delta from 1.2)
#   boot 4: 1.3's workload fails: kiln-release-check rolls it back and reboots
#   boot 5: 1.2 again, 1.3's files, image and blobs gone -> power off
# Every wait is bounded.
#@LIB@
#@UPGRADE_LIB@
case $n in
1)
    settled 1.0.0
    workload 1.0.0
    cri pinned pause-pinned "$PAUSE_REF" "$PAUSE_DIGEST" true
    pinned app-1.0-pinned 1.0.0 true
    trust "$TRUST_FACTORY"
    show_status
    plug 1.1.0
    ;;
2)
    begin_before_crio
    mirror_opened
    settled 1.1.0
    if status_is previous 1\\.0\\.0; then pass previous 1.0.0; else fail previous "$("$AGENT" agent status | oneline)"; fi
    workload 1.1.0
    pinned app-1.1-pinned 1.1.0 true
    pinned app-1.0-pinned 1.0.0 true
    if grep -q "${DIGEST[1.1.0]}" /etc/crio/crio.conf.d/50-kiln-pins.conf; then pass pins-file; else fail pins-file "$(oneline < /etc/crio/crio.conf.d/50-kiln-pins.conf)"; fi
    # 1.1 confirmed: the node trusts its keys, the new one beside the factory's.
    trust "$TRUST_FACTORY" "$TRUST_ROTATED"
    show_status
    plug 1.2.0
    ;;
3)
    begin_before_crio
    mirror_opened
    settled 1.2.0
    workload 1.2.0
    pinned app-1.2-pinned 1.2.0 true
    pinned app-1.1-pinned 1.1.0 true
    # 1.0 retired: unpinned; its image stays on the read-only image partition
    # (factory content), what it kept on /var (its pod manifest) is gone.
    pinned app-1.0-unpinned 1.0.0 false
    if [ ! -e "$STORE/${POD10_BLOB#sha256:}" ]; then pass pod-1.0-blob-gone; else fail pod-1.0-blob-gone "$STORE/${POD10_BLOB#sha256:} still there"; fi
    # 1.2 retired the factory key: a stick signed by it is refused.
    trust "$TRUST_ROTATED"
    refused retired
    show_status
    plug 1.3.0
    ;;
4)
    begin_before_crio
    # While 1.3 is tried, its image is loaded and its blobs are stored.
    if status_is trying 1\\.3\\.0 && podman image exists "$TOOLS_REF@$TOOLS_DIGEST"; then pass tools-loaded; else fail tools-loaded "$("$AGENT" agent status | oneline)"; fi
    # 1.3's manifest names an image the node does not have and may not pull:
    # the kubelet never starts the container.
    if wait_for 300 journal_has kubelet.service ErrImageNeverPull; then
        pass workload-failed "$(journalctl -b 0 -q --no-pager -u kubelet.service -o cat | grep -m1 -o 'Container image [^ ]* is not present with pull policy of Never' | tr -d '\\')"
    else
        fail workload-failed "no ErrImageNeverPull in the kubelet's journal: $(/usr/local/bin/cri-check -timeout 20s ready "$POD" 2>&1 | oneline)"
    fi
    # Checked: the health check may now call the pod's missing image final
    # (kiln-e2e-health), and kiln-release-check rolls 1.3 back at once; its
    # FailureAction reboots (this script is stopped then): boot 5 checks the
    # result.
    touch /run/kiln-e2e-tried
    echo "kiln-e2e: waiting for the health check to roll 1.3.0 back and reboot"
    sleep 600
    fail rollback-reboot "no reboot 600 s after 1.3.0's workload failed: $("$AGENT" agent status | oneline)"
    shutdown_now poweroff
    ;;
5)
    settled 1.2.0
    if "$AGENT" agent status | grep -qE "^last: +rollback 1\.3\.0 FAILED: .*kiln-e2e-health said unhealthy \(exit status 3\): cri-check: pod $POD can never start"; then pass rolled-back "$("$AGENT" agent status | grep '^last:')"; else fail rolled-back "$("$AGENT" agent status | oneline)"; fi
    if grep -qx "      image: $APP:1.2" "$MANIFEST"; then pass files-restored; else fail files-restored "$(oneline < "$MANIFEST")"; fi
    workload 1.2.0
    pinned app-1.2-pinned 1.2.0 true
    pinned app-1.1-pinned 1.1.0 true
    if podman image exists "$TOOLS_REF@$TOOLS_DIGEST"; then fail tools-removed "still in containers/storage"; else pass tools-removed; fi
    if [ -e "$STORE/${TOOLS_LAYER#sha256:}" ]; then fail tools-blob-gone "$TOOLS_LAYER still stored"; else pass tools-blob-gone; fi
    # 1.3 was never confirmed: its trust never took effect.
    trust "$TRUST_ROTATED"
    show_status
    shutdown_now poweroff
    ;;
*)
    fail unexpected-boot "boot $n"
    shutdown_now poweroff
    ;;
esac
