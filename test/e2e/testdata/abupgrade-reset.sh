#!/bin/bash
# A hard reset while the import writes slot b, and the upgrade reboot timed
# against a plain one (abupgrade_test.go, issue 23), on one machine built on
# the A/B base with Secure Boot (issue 35): the machine starts in setup mode,
# systemd-boot enrols the factory's keys and resets it before boot 1; every
# boot is a db-signed unified kernel image (the factory's, then the one the
# 1.1 stick carried and the node checked and wrote), and its signed command
# line names the root hashes dm-verity opens /usr and the image partition with:
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

efivar() { od -An -t u1 -j4 -N1 "/sys/firmware/efi/efivars/$1" 2>/dev/null | tr -d ' '; }
# Through cat: tail -c +5 on an efivarfs file itself read nothing here.
loadervar() { cat "/sys/firmware/efi/efivars/$1-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f" 2>/dev/null | tail -c +5 | tr -d '\0'; }
param() { tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=//p"; }
# secure_boot: the firmware booted this kernel under Secure Boot through
# systemd-stub, and dm-verity opened /usr and the image partition with the
# root hashes of the signed command line.
secure_boot() {
    local sb setup stub usr images want
    sb=$(efivar SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c)
    setup=$(efivar SetupMode-8be4df61-93ca-11d2-aa0d-00e098032b8c)
    if [ "$sb" = 1 ] && [ "$setup" = 0 ]; then pass secure-boot enabled; else fail secure-boot "SecureBoot=${sb:-none} SetupMode=${setup:-none}"; fi
    if journalctl -k -b 0 -q --no-pager | grep -q 'secureboot: Secure boot enabled'; then pass kernel-secure-boot; else fail kernel-secure-boot "$(journalctl -k -b 0 -q --no-pager | grep -i secure | oneline)"; fi
    stub=$(loadervar StubInfo)
    if [[ $stub == systemd-stub* ]]; then pass stub "$stub"; else fail stub "StubInfo=${stub:-none}: not booted through systemd-stub"; fi
    usr=$(veritysetup status usr | sed -n 's/^ *root hash: *//p')
    if [ -n "$usr" ] && [ "$usr" = "$(param usrhash)" ]; then pass usr-roothash "$usr"; else fail usr-roothash "usrhash=$(param usrhash), /usr opened with ${usr:-nothing}"; fi
    images=$(veritysetup status kiln-images | sed -n 's/^ *root hash: *//p')
    want=$(param kiln.images.roothash)
    if [ -n "$images" ] && [ "$images" = "$want" ]; then pass images-roothash "$images"; else fail images-roothash "kiln.images.roothash=${want:-none}, the image partition opened with ${images:-nothing}"; fi
    if [[ $(findmnt -n -o SOURCE /var/lib/kiln/images) == /dev/mapper/kiln-images ]]; then pass mount-verity; else fail mount-verity "$(findmnt -n -o SOURCE /var/lib/kiln/images)"; fi
}
case $n in
1)
    settled 1.0.0
    booted ignition-firstboot.efi 12 "$USRA"
    secure_boot
    pass lockdown "$(cat /sys/kernel/security/lockdown 2>&1)"
    if grep -q "Secure Boot db" <<<"$(journalctl -k -b 0 -q --no-pager | grep 'Loaded X.509 cert')"; then pass db-in-kernel; else fail db-in-kernel "the kernel loaded no db certificate"; fi
    if journalctl -b 0 -q --no-pager -t ignition | grep -q 'Ignition finished successfully'; then pass ignition; else fail ignition "Ignition did not finish on the first boot"; fi
    workload 1.0.0
    udevadm settle --timeout=30 || true
    sleep 10
    echo "kiln-e2e: rebooting plainly"
    shutdown_now reboot
    ;;
2)
    workload 1.0.0
    settled 1.0.0
    booted kiln-1.0.efi 12 "$USRA"
    echo "kiln-e2e: plug 1.1.0"
    sleep 900
    fail reset "the machine was not reset within 900 s of the plug: $("$AGENT" agent status | oneline)"
    shutdown_now poweroff
    ;;
3)
    booted kiln-1.0.efi 12 "$USRA"
    if status_is current 1\\.0\\.0; then pass current 1.0.0; else fail current "$("$AGENT" agent status | oneline)"; fi
    staged_reboot 1.1.0
    ;;
4)
    workload 1.1.0
    settled 1.1.0
    booted kiln-1.1.0+3.efi 1.1 "$USRB"
    secure_boot
    failed=$(systemctl --failed --plain --no-legend | awk '{print $1}' | xargs)
    if [ -z "$failed" ]; then pass failed-units; else fail failed-units "$failed"; fi
    show_status
    shutdown_now poweroff
    ;;
*)
    fail unexpected-boot "boot $n"
    shutdown_now poweroff
    ;;
esac
