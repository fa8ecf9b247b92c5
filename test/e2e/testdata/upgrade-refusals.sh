#!/bin/bash
# The bad sticks and a power cut mid-import (upgrade_test.go,
# TestFieldUpgradeRefusals), on every boot of one machine. The test plugs
# the stick the guest asks for ("kiln-e2e: plug NAME"), pulls it out when the
# console says it was refused or may be removed, and presses reset when the
# 1.1 import starts copying blobs ("copy N blob(s) for M image(s): started").
#   boot 1: factory 1.0; a tampered stick, one signed by a key the node does
#           not trust, a downgrade (0.9.0): each refused, state.json and the
#           release store unchanged; then the good 1.1 stick: reset mid-copy
#   boot 2: the node runs 1.0 consistently (nothing staged, pins as the
#           state says); the stick is still in: udev imports it again at
#           boot, the import completes and stages 1.1 -> power off
# Every wait is bounded.
#@LIB@
#@UPGRADE_LIB@
IMPORT=kiln-import@vdb1.service

# fingerprint: what a refused stick must leave as it was.
fingerprint() { { cat /var/lib/kiln/state.json; ls -la "$STORE"; cat /etc/crio/crio.conf.d/50-kiln-pins.conf; } | sha256sum | cut -c1-16; }

# refused NAME: plug stick NAME, wait for the import to fail and the stick
# to be pulled; nothing may have changed.
refused() {
    local before after
    before=$(fingerprint)
    echo "kiln-e2e: plug $1"
    if wait_for 300 systemctl is-failed -q "$IMPORT"; then
        pass "$1-refused" "$(journalctl -b 0 -q --no-pager -u "$IMPORT" -g ' refused: ' | tail -n1 | cut -c1-200)"
    else
        fail "$1-refused" "$IMPORT: $(prop "$IMPORT" ActiveState)"; diag "$IMPORT"
    fi
    wait_for 180 test ! -e /sys/block/vdb || fail "$1-pulled" "vdb still there after 180 s"
    systemctl reset-failed "$IMPORT"
    after=$(fingerprint)
    if [ "$before" = "$after" ] && status_is staged -; then pass "$1-unchanged" "$after"; else fail "$1-unchanged" "$before -> $after: $("$AGENT" agent status | oneline)"; fi
}

case $n in
1)
    settled 1.0.0
    workload 1.0.0
    refused tampered
    refused untrusted
    refused downgrade
    show_status
    sync
    echo "kiln-e2e: plug 1.1.0"
    sleep 600 # the test resets the machine while the import copies
    fail reset "no reset 600 s after the 1.1.0 stick was asked for: $("$AGENT" agent status | oneline)"
    systemctl --no-block poweroff
    ;;
2)
    # The import the reset cut off staged nothing: the node runs 1.0.
    settled 1.0.0
    workload 1.0.0
    pinned app-1.0-pinned 1.0.0 true
    # The stick stayed in across the reset: udev starts the import at boot.
    if wait_for 600 status_is staged 1\\.1\\.0; then pass resumed-staged; else fail resumed-staged "$("$AGENT" agent status | oneline)"; diag "$IMPORT"; fi
    wait_for 180 test ! -e /sys/block/vdb || fail stick-pulled "vdb still there after 180 s"
    if "$AGENT" agent status | grep -q "as the state says"; then pass pins-consistent; else fail pins-consistent "$("$AGENT" agent status | oneline)"; fi
    show_status
    systemctl --no-block poweroff
    ;;
*)
    fail unexpected-boot "boot $n"
    systemctl --no-block poweroff
    ;;
esac
