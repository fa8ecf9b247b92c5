#!/bin/bash
# The whole-appliance upgrade scenario (abupgrade_test.go, issue 23), on
# every boot that reaches userspace of one machine built on the A/B base:
#   boot 1: factory 1.0 (OS 1.0 in slot a)   -> plug 1.1 (a delta with OS 1.1 and its own agent)
#   boot 2: 1.1 booted from its entry (slot b), its agent, tried, confirmed, blessed
#                                             -> plug 1.2 (its initramfs cannot boot)
#   (1.2's three tries panic; systemd-boot falls back to 1.1's entry)
#   boot 3: 1.1 again, by itself: the state rolled 1.2 back, its entry gone
#                                             -> plug 1.3 (OS 1.0 into slot a, its own agent, a workload image it lacks)
#   boot 4: 1.3 booted from slot a with its agent; its health check fails: rolled back, reboot
#   boot 5: 1.1 again, with 1.1's agent, 1.3's entry gone -> power off
# Checks print "KILN-E2E: bN-<check> PASS|FAIL", the state "KILN-E2E-STATUS: n=N {json}".
#@LIB@
#@UPGRADE_LIB@
USRA=@USR_A@; USRB=@USR_B@ # PARTUUIDs
entries() { ls /efi/loader/entries | xargs; }
# agent_is VERSION: the agent every unit runs is the booted release's.
agent_is() {
    if [ "$("$AGENT" --version | head -n 1)" = "kiln-agent $1" ]; then pass agent-version "$("$AGENT" --version | head -n 1)"; else fail agent-version "$("$AGENT" --version 2>&1 | head -n 1), want $1"; fi
}
# What 1.0's first boot wrote under /etc and /var survives every upgrade and
# rollback (the OS slots hold /usr only).
MARKERS="/etc/kiln-e2e-written-on-1.0 /var/lib/kiln-e2e-written-on-1.0"
kept() {
    local f bad=
    for f in $MARKERS; do [ "$(cat "$f" 2>/dev/null)" = "written by 1.0's first boot" ] || bad="$bad $f"; done
    if [ -z "$bad" ]; then pass etc-var-kept "$MARKERS"; else fail etc-var-kept "changed or gone:$bad"; fi
}
blessed() {
    if wait_for 120 sh -c '/usr/lib/systemd/systemd-bless-boot status | grep -qx good'; then pass blessed "$(entries)"; else fail blessed "$(/usr/lib/systemd/systemd-bless-boot status 2>&1 | oneline) $(entries)"; fi
}
case $n in
1)
    settled 1.0.0
    booted ignition-firstboot.conf 12 "$USRA" # the first boot (Ignition); the A/B base 1.0 keeps Debian's VERSION_ID
    workload 1.0.0
    for f in $MARKERS; do echo "written by 1.0's first boot" >"$f"; done
    sync
    show_status
    plug 1.1.0
    ;;
2)
    settled 1.1.0
    booted kiln-1.1.0+3.conf 1.1 "$USRB"
    agent_is 1.1.0-e2e
    if [ "$(echo '{"n":[1,2]}' | jq -c '.n|add' 2>&1)" = 3 ]; then pass os-1.1-package "$(jq --version) $(command -v jq) on $(findmnt -no SOURCE -T "$(command -v jq)")"; else fail os-1.1-package "jq in 1.1's /usr: $(command -v jq || echo none)"; fi
    if "$AGENT" agent status | grep -q '^booted: *kiln-1.1.0 (release 1.1.0, slot b)'; then pass status-booted; else fail status-booted "$("$AGENT" agent status | oneline)"; fi
    blessed
    if [ "$(entries)" = "kiln-1.0.conf kiln-1.1.0.conf" ]; then pass entries "$(entries)"; else fail entries "$(entries)"; fi
    kept
    workload 1.1.0
    pinned app-1.1-pinned 1.1.0 true
    pinned app-1.0-pinned 1.0.0 true
    show_status
    plug 1.2.0
    ;;
3)
    settled 1.1.0
    booted kiln-1.1.0.conf 1.1 "$USRB"
    if "$AGENT" agent status | grep -qE '^last: +rollback 1\.2\.0 FAILED: release 1\.2\.0 never reached boot-complete'; then
        pass rolled-back "$("$AGENT" agent status | grep '^last:' | oneline)"
    else
        fail rolled-back "$("$AGENT" agent status | oneline)"
    fi
    if journalctl -b 0 -q --no-pager -u kiln-release-begin.service | grep -q 'kiln: release 1.2.0 never reached boot-complete'; then pass begin-said-so; else fail begin-said-so "$(journalctl -b 0 -q --no-pager -u kiln-release-begin.service | tail -n 3 | oneline)"; fi
    if [ "$(entries)" = "kiln-1.1.0.conf" ]; then pass entries "$(entries)"; else fail entries "$(entries)"; fi
    agent_is 1.1.0-e2e
    kept
    workload 1.1.0
    # 1.2's import wrote 1.0's slot: 1.0 is no longer kept, so no longer pinned
    # (its image stays on the read-only image partition).
    pinned app-1.1-pinned 1.1.0 true
    pinned app-1.0-unpinned 1.0.0 false
    show_status
    plug 1.3.0
    ;;
4)
    # Tried: slot a now holds 1.0's OS again, under 1.3's entry and agent.
    booted kiln-1.3.0+3.conf 12 "$USRA"
    agent_is 1.3.0-e2e
    if status_is trying 1\\.3\\.0; then pass trying "1.3.0"; else fail trying "$("$AGENT" agent status | oneline)"; fi
    # Its workload names an image it does not carry: once checked here, the
    # health check calls that final (kiln-e2e-health), rolls 1.3 back at once,
    # removes its entry, and its FailureAction reboots (this script is
    # stopped then): boot 5 checks the result.
    touch /run/kiln-e2e-tried
    echo "kiln-e2e: waiting for the health check to roll 1.3.0 back and reboot"
    sleep 600
    fail rollback-reboot "no reboot 600 s after 1.3.0 was tried: $("$AGENT" agent status | oneline)"
    shutdown_now poweroff
    ;;
5)
    settled 1.1.0
    booted kiln-1.1.0.conf 1.1 "$USRB"
    agent_is 1.1.0-e2e
    if "$AGENT" agent status | grep -qE '^last: +rollback 1\.3\.0 FAILED: '; then
        pass rolled-back "$("$AGENT" agent status | grep '^last:' | oneline)"
    else
        fail rolled-back "$("$AGENT" agent status | oneline)"
    fi
    if [ "$(entries)" = "kiln-1.1.0.conf" ]; then pass entries "$(entries)"; else fail entries "$(entries)"; fi
    kept
    workload 1.1.0
    pinned app-1.1-pinned 1.1.0 true
    show_status
    shutdown_now poweroff
    ;;
*)
    fail unexpected-boot "boot $n"
    shutdown_now poweroff
    ;;
esac
