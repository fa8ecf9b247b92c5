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
    shutdown_now poweroff
    ;;
2)
    # The import the reset cut off staged nothing: the node runs 1.0.
    settled 1.0.0
    workload 1.0.0
    pinned app-1.0-pinned 1.0.0 true
    # The stick stayed in across the reset: udev starts the import at boot.
    if wait_for 600 status_is staged 1\\.1\\.0; then pass resumed-staged; else fail resumed-staged "$("$AGENT" agent status | oneline)"; diag "$IMPORT"; fi
    wait_for 180 test ! -e /sys/block/vdb || fail stick-pulled "vdb still there after 180 s"
    # Anchored: "NOT as the state says" must not pass.
    if "$AGENT" agent status | grep -qE '^pins: +[0-9]+ in [^ ]+, as the state says$'; then pass pins-consistent; else fail pins-consistent "$("$AGENT" agent status | oneline)"; fi
    show_status
    shutdown_now poweroff
    ;;
*)
    fail unexpected-boot "boot $n"
    shutdown_now poweroff
    ;;
esac
