#!/bin/bash
# The power-cut scenario of a field upgrade (powercut_test.go, issue 27), on
# every boot of one machine. The power is cut (the test presses QEMU's reset
# when the console says "kiln-e2e: cut the power") while CRI-O runs the
# workload: once during the upgrade boot, before the health check has
# decided, and once after the new release was confirmed. The release's
# image is in CRI-O's writable store (the import loaded it), which CRI-O
# may wipe after an unclean shutdown: kiln must put it back from the release
# store before the workload and the health check, and nothing that passed
# may be rolled back.
#   boot 1: factory 1.0                         -> plug 1.1 (delta), reboot
#   boot 2: trying 1.1 (attempt 1), workload up; the health check waits for
#           /run/kiln-e2e-healthy, which this boot never writes -> cut
#   boot 3: trying 1.1 (attempt 2): restored, workload up, healthy -> confirmed -> cut
#   boot 4: 1.1 current: restored, workload up, 1.1 and 1.0 pinned -> power off
# Every wait is bounded.
#@LIB@
#@UPGRADE_LIB@
# power_cut: let ext4 commit this boot's files (5 s interval), then ask for the
# power cut; nothing is stopped or synced first.
power_cut() {
    sleep 10
    echo "kiln-e2e: cut the power"
    sleep 600
    fail power-cut "the power was not cut within 600 s"
    shutdown_now poweroff
    exit 0
}
case $n in
1)
    settled 1.0.0
    workload 1.0.0
    show_status
    plug 1.1.0
    ;;
2)
    begin_before_crio
    if status_is trying '1\.1\.0'; then pass trying "$("$AGENT" agent status | grep '^trying:')"; else fail trying "$("$AGENT" agent status | oneline)"; fi
    workload 1.1.0
    show_status
    power_cut
    ;;
3)
    restore_checks "$WORKLOAD"
    if status_is trying '1\.1\.0 .*boot 2,'; then pass trying-again "$("$AGENT" agent status | grep '^trying:')"; else fail trying-again "$("$AGENT" agent status | oneline)"; fi
    workload 1.1.0
    touch /run/kiln-e2e-healthy
    settled 1.1.0
    if status_is previous '1\.0\.0'; then pass previous 1.0.0; else fail previous "$("$AGENT" agent status | oneline)"; fi
    show_status
    power_cut
    ;;
4)
    restore_checks "$WORKLOAD"
    settled 1.1.0
    workload 1.1.0
    pinned app-1.1-pinned 1.1.0 true
    pinned app-1.0-pinned 1.0.0 true
    show_status
    shutdown_now poweroff
    ;;
*)
    fail unexpected-boot "boot $n"
    shutdown_now poweroff
    ;;
esac
