#!/bin/bash
# The whole-appliance upgrade scenario (abupgrade_test.go, issue 23), on
# every boot that reaches userspace of one machine built on the A/B base:
#   boot 1: factory 1.0 (OS 1.0 in slot a)   -> plug 1.1 (a delta with OS 1.1)
#   boot 2: 1.1 booted from its entry (slot b), tried, confirmed, blessed
#                                             -> plug 1.2 (its initramfs cannot boot)
#   (1.2's three tries panic; systemd-boot falls back to 1.1's entry)
#   boot 3: 1.1 again, by itself: the state rolled 1.2 back, its entry gone -> power off
# Checks print "KILN-E2E: bN-<check> PASS|FAIL", the state "KILN-E2E-STATUS: n=N {json}".
#@LIB@
#@UPGRADE_LIB@
USRA=@USR_A@; USRB=@USR_B@ # PARTUUIDs
booted_entry() { cat /sys/firmware/efi/efivars/LoaderEntrySelected-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f 2>/dev/null | tail -c +5 | tr -d '\0'; }
entries() { ls /efi/loader/entries | xargs; }
os_version() { sed -n 's/^VERSION_ID=//p' /usr/lib/os-release | tr -d '"'; }
usr_data() { lsblk -dno PARTUUID "$(veritysetup status usr | sed -n 's/^ *data device: *//p')"; }
# booted ENTRY VERSION PARTUUID: this boot came from ENTRY, /usr is OS
# VERSION from that partition, verified.
booted() {
    if [ "$(booted_entry)" = "$1" ]; then pass booted-entry "$1"; else fail booted-entry "$(booted_entry), want $1"; fi
    if [ "$(os_version)" = "$2" ]; then pass os-release "VERSION_ID=$2"; else fail os-release "$(os_version), want $2"; fi
    if [ "$(usr_data)" = "$3" ] && veritysetup status usr | grep -q 'status: *verified'; then pass usr-slot "$3"; else fail usr-slot "$(usr_data), want $3"; fi
}
blessed() {
    if wait_for 120 sh -c '/usr/lib/systemd/systemd-bless-boot status | grep -qx good'; then pass blessed "$(entries)"; else fail blessed "$(/usr/lib/systemd/systemd-bless-boot status 2>&1 | oneline) $(entries)"; fi
}
case $n in
1)
    settled 1.0.0
    booted ignition-firstboot.conf 12 "$USRA" # the first boot (Ignition); the A/B base 1.0 keeps Debian's VERSION_ID
    workload 1.0.0
    show_status
    plug 1.1.0
    ;;
2)
    settled 1.1.0
    booted kiln-1.1.0+3.conf 1.1 "$USRB"
    if command -v jq >/dev/null; then pass os-1.1-package "$(command -v jq)"; else fail os-1.1-package "no jq in 1.1's /usr"; fi
    if "$AGENT" agent status | grep -q '^booted: *kiln-1.1.0 (release 1.1.0, slot b)'; then pass status-booted; else fail status-booted "$("$AGENT" agent status | oneline)"; fi
    blessed
    if [ "$(entries)" = "kiln-1.0.conf kiln-1.1.0.conf" ]; then pass entries "$(entries)"; else fail entries "$(entries)"; fi
    workload 1.1.0
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
    workload 1.1.0
    show_status
    shutdown_now poweroff
    ;;
*)
    fail unexpected-boot "boot $n"
    shutdown_now poweroff
    ;;
esac
