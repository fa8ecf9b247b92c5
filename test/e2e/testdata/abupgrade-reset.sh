#!/bin/bash
# A hard reset while the import writes slot b, and the upgrade reboot timed
# against a plain one (abupgrade_test.go, issue 23), on one machine built on
# the A/B base:
#   boot 1: factory 1.0 (slot a), first boot          -> a plain reboot
#   boot 2: 1.0 again, its workload runs              -> plug 1.1; the test resets
#           the machine as the slot write begins
#   boot 3: 1.0 again, from its own entry; the stick, still in, is imported
#           again, keeping what the first import wrote -> reboot to try 1.1
#   boot 4: 1.1 from slot b, its workload runs, confirmed -> power off
# The test times boot 2's and boot 4's workloads from the reboot before them.
# Checks print "KILN-E2E: bN-<check> PASS|FAIL", the state "KILN-E2E-STATUS: n=N {json}".
#@LIB@
#@UPGRADE_LIB@
USRA=@USR_A@; USRB=@USR_B@ # PARTUUIDs
case $n in
1)
    settled 1.0.0
    booted ignition-firstboot.conf 12 "$USRA"
    workload 1.0.0
    udevadm settle --timeout=30 || true
    sleep 10
    echo "kiln-e2e: rebooting plainly"
    shutdown_now reboot
    ;;
2)
    workload 1.0.0
    settled 1.0.0
    booted kiln-1.0.conf 12 "$USRA"
    echo "kiln-e2e: plug 1.1.0"
    sleep 900
    fail reset "the machine was not reset within 900 s of the plug: $("$AGENT" agent status | oneline)"
    shutdown_now poweroff
    ;;
3)
    booted kiln-1.0.conf 12 "$USRA"
    if status_is current 1\\.0\\.0; then pass current 1.0.0; else fail current "$("$AGENT" agent status | oneline)"; fi
    staged_reboot 1.1.0
    ;;
4)
    workload 1.1.0
    settled 1.1.0
    booted kiln-1.1.0+3.conf 1.1 "$USRB"
    show_status
    shutdown_now poweroff
    ;;
*)
    fail unexpected-boot "boot $n"
    shutdown_now poweroff
    ;;
esac
