#!/bin/bash
# The Secure Boot first boot (secureboot_test.go): the machine started in
# setup mode, systemd-boot enrolled the factory's keys from loader/keys/auto
# and reset it; this boot is the firmware checking systemd-boot, systemd-boot
# (through the firmware) checking the signed first-boot UKI, and the UKI's
# signed command line naming the root hashes dm-verity opens /usr and the
# image partition with. Then the appliance must run as it does without.
# Checks print "KILN-E2E: <check> PASS|FAIL <detail>"; the unit powers off.
#@LIB@
efivar() { od -An -t u1 -j4 -N1 "/sys/firmware/efi/efivars/$1" 2>/dev/null | tr -d ' '; }
# Through cat: tail -c +5 on an efivarfs file itself read nothing here.
loadervar() { cat "/sys/firmware/efi/efivars/$1-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f" 2>/dev/null | tail -c +5 | tr -d '\0'; }
POD=@WORKLOAD_POD@
param() { tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=//p"; }

sb=$(efivar SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c)
setup=$(efivar SetupMode-8be4df61-93ca-11d2-aa0d-00e098032b8c)
if [ "$sb" = 1 ] && [ "$setup" = 0 ]; then pass secure-boot enabled; else fail secure-boot "SecureBoot=${sb:-none} SetupMode=${setup:-none}"; fi
if journalctl -k -b 0 -q --no-pager | grep -q 'secureboot: Secure boot enabled'; then pass kernel-secure-boot; else fail kernel-secure-boot "$(journalctl -k -b 0 -q --no-pager | grep -i secure | oneline)"; fi
pass lockdown "$(cat /sys/kernel/security/lockdown 2>&1)"
if grep -q "Secure Boot db" <<<"$(journalctl -k -b 0 -q --no-pager | grep 'Loaded X.509 cert')"; then pass db-in-kernel; else fail db-in-kernel "the kernel loaded no db certificate"; fi
# systemd-stub says it started this kernel (a UKI), systemd-boot which entry.
stub=$(loadervar StubInfo); entry=$(loadervar LoaderEntrySelected)
loadervars=$(ls /sys/firmware/efi/efivars | sed -n 's/-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f$//p' | xargs)
if [[ $stub == systemd-stub* ]]; then pass stub "$stub"; else fail stub "StubInfo=${stub:-none}: not booted through systemd-stub (loader variables: $loadervars)"; fi
if [ "$entry" = ignition-firstboot.efi ]; then pass booted-entry "$entry"; else fail booted-entry "LoaderEntrySelected=${entry:-none} (loader variables: $loadervars; $(loadervar LoaderInfo))"; fi
if journalctl -b 0 -q --no-pager -t ignition | grep -q 'Ignition finished successfully'; then pass ignition; else fail ignition "Ignition did not finish on the first boot"; fi

# The signed command line's root hashes are the ones dm-verity opened with.
usr=$(veritysetup status usr | sed -n 's/^ *root hash: *//p')
if [ -n "$usr" ] && [ "$usr" = "$(param usrhash)" ]; then pass usr-roothash "$usr"; else fail usr-roothash "usrhash=$(param usrhash), /usr opened with ${usr:-nothing}"; fi
images=$(veritysetup status kiln-images | sed -n 's/^ *root hash: *//p')
want=$(param kiln.images.roothash)
if [ -n "$images" ] && [ "$images" = "$want" ]; then pass images-roothash "$images"; else fail images-roothash "kiln.images.roothash=${want:-none}, the image partition opened with ${images:-nothing}"; fi
if [[ $(findmnt -n -o SOURCE /var/lib/kiln/images) == /dev/mapper/kiln-images ]]; then pass mount-verity; else fail mount-verity "$(findmnt -n -o SOURCE /var/lib/kiln/images)"; fi

if pod_up "$POD" 300; then pass workload-up "$(cut -d' ' -f1 /proc/uptime)s after boot"; else
    fail workload-up "pod $POD not ready: $(/usr/local/bin/cri-check -timeout 20s ready "$POD" 2>&1 | oneline)"
fi
failed=$(systemctl --failed --plain --no-legend | awk '{print $1}' | xargs)
if [ -z "$failed" ]; then pass failed-units; else fail failed-units "$failed"; fi
sync
