#!/bin/bash
# Runs in the guest on every boot of the A/B base (installed by Ignition
# through /usr/local, a symlink to /var/usrlocal): reports how /usr is
# mounted and verified, which boot loader entry was booted and what
# systemd-bless-boot made of it, as "KILN-E2E: <name> PASS|FAIL <detail>".
set -u
report() { echo "KILN-E2E: $1 $2 ${3:-}"; }
oneline() { tr '\n' ' ' | cut -c1-200; }

state=/var/lib/kiln-e2e
mkdir -p "$state"
n=$(($(cat "$state/boots" 2>/dev/null || echo 0) + 1))
echo "$n" >"$state/boots"
report boot PASS "n=$n"
if journalctl -b 0 -q --no-pager -t ignition | grep -q 'Ignition finished successfully'; then
    report ignition-finished PASS yes
else
    report ignition-finished PASS no
fi
# Ignition wrote this script to /usr/local/bin: it is on root, not in /usr.
report check-script PASS "$(readlink -f "$0")"

# /usr: the dm-verity device over usr-a, squashfs, read-only.
read -r src fstype opts < <(findmnt -no SOURCE,FSTYPE,OPTIONS /usr)
case ",$opts," in *,ro,*) ro=ro ;; *) ro=rw ;; esac
if [ "$src" = /dev/mapper/usr ] && [ "$fstype" = squashfs ] && [ "$ro" = ro ]; then
    report usr-mount PASS "$src $fstype $ro"
else
    report usr-mount FAIL "$src $fstype $opts"
fi
if touch /usr/.kiln-e2e-write 2>/dev/null; then
    report usr-write FAIL "wrote to /usr"
else
    report usr-write PASS refused
fi

# The verity target's root hash is the one the entry named (usrhash=), and
# its data and hash devices are usr-a and usr-a-verity.
status=$(veritysetup status usr 2>&1)
field() { sed -n "s/^ *$1: *//p" <<<"$status"; }
cmdline_hash=$(tr ' ' '\n' </proc/cmdline | sed -n 's/^usrhash=//p')
if [ "$(field type)" = VERITY ] && [ "$(field status)" = verified ] && [ "$(field 'root hash')" = "$cmdline_hash" ]; then
    report usr-verity PASS "$(field 'root hash')"
else
    report usr-verity FAIL "$(oneline <<<"$status") usrhash=$cmdline_hash"
fi
partuuid() { lsblk -dno PARTUUID "$1" 2>&1; }
report usr-data PASS "$(partuuid "$(field 'data device')")"
report usr-hash PASS "$(partuuid "$(field 'hash device')")"

# The root partition's own /usr (under the mount) is empty.
mnt=$(mktemp -d)
mount --bind / "$mnt"
left=$(ls -A "$mnt/usr" | oneline)
umount "$mnt"
rmdir "$mnt"
if [ -z "$left" ]; then report root-usr-empty PASS; else report root-usr-empty FAIL "$left"; fi

# The entry systemd-boot booted (LoaderEntrySelected, UTF-16 after 4 bytes
# of attributes) and what systemd-bless-boot says of this boot.
var=/sys/firmware/efi/efivars/LoaderEntrySelected-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f
# (efivarfs cannot seek: read it whole through a pipe.)
entry=$(cat "$var" 2>/dev/null | tail -c +5 | tr -d '\0')
if [ -n "$entry" ]; then report boot-entry PASS "$entry"; else report boot-entry FAIL "no LoaderEntrySelected"; fi
# The ESP, where bless-boot renames entries: mounted on /efi on first use
# by systemd-gpt-auto-generator's automount.
ls /efi/loader/entries >/dev/null 2>&1
esp=$(findmnt -rno FSTYPE,PARTUUID /efi 2>&1 | awk '$1 != "autofs" {print $1, $2}' | oneline)
report esp-mount PASS "$esp"
load=$(systemctl show -p LoadState --value systemd-bless-boot.service)
if [ "$load" = loaded ]; then report bless-boot-unit PASS; else report bless-boot-unit FAIL "$load"; fi
# On a counted boot, bless-boot runs once boot-complete.target is reached.
for _ in $(seq 30); do
    [ -z "$(systemctl list-jobs --no-legend systemd-bless-boot.service boot-complete.target)" ] && break
    sleep 1
done
report bless-status PASS "$(/usr/lib/systemd/systemd-bless-boot status 2>&1 | oneline)"

# CRI-O and the kubelet run from /usr (the slot), started by their units.
for unit in crio kubelet; do
    for _ in $(seq 60); do
        pid=$(systemctl show -p MainPID --value "$unit.service")
        [ "${pid:-0}" -gt 0 ] && break
        sleep 1
    done
    exe=$(readlink "/proc/$pid/exe" 2>&1)
    on=$(findmnt -no SOURCE -T "$exe" 2>&1)
    if [ "$exe" = "/usr/bin/$unit" ] && [ "$on" = /dev/mapper/usr ]; then
        report "$unit-from-usr" PASS "$exe on $on"
    else
        report "$unit-from-usr" FAIL "pid=$pid exe=$exe on=$on $(systemctl is-active "$unit.service")"
    fi
done

# The OS release: /etc/os-release links to /usr's, so the slot says it.
# jq is what release 1.1 added to /usr.
report os-release PASS "$(. /etc/os-release && echo "VERSION_ID=$VERSION_ID IMAGE_VERSION=${IMAGE_VERSION:-none}")"
if jq=$(command -v jq); then
    report jq PASS "$(jq --version) $jq on $(findmnt -no SOURCE -T "$jq" 2>&1): $(echo '{"n":[1,2]}' | jq -c '.n|add' 2>&1)"
else
    report jq PASS none
fi

failed=$(systemctl --failed --plain --no-legend | awk '{print $1}' | xargs)
if [ -z "$failed" ]; then report failed-units PASS; else report failed-units FAIL "$failed"; fi
report uptime PASS "$(cut -d' ' -f1 /proc/uptime)s"
sync
