#!/bin/bash
# Runs in the guest on every boot (installed by the test's Ignition config):
# reports what this boot looks like as "KILN-E2E: <name> PASS|FAIL <detail>"
# lines on the console; the unit then powers the machine off.
set -u
report() { echo "KILN-E2E: $1 $2 ${3:-}"; }

state=/var/lib/kiln-e2e
mkdir -p "$state"
n=$(( $(cat "$state/boots" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$state/boots"
report boot PASS "n=$n"

if grep -qw ignition.firstboot /proc/cmdline; then fb=yes; else fb=no; fi
report firstboot-flag PASS "$fb"

# Ignition logs under its own name, in the initramfs part of this boot's
# journal; no lines means Ignition did not run on this boot.
ign=$(journalctl -b 0 -q --no-pager -t ignition | wc -l)
report ignition-this-boot PASS "lines=$ign"
if journalctl -b 0 -q --no-pager -t ignition | grep -q 'Ignition finished successfully'; then
    report ignition-finished PASS yes
else
    report ignition-finished PASS no
fi

want="hello from ignition"
got=$(cat /etc/kiln-e2e/hello.txt 2>&1)
if [ "$got" = "$want" ]; then report hello-file PASS; else report hello-file FAIL "got: ${got:0:80}"; fi

# Enabled through Ignition's preset file, applied by systemd on first boot.
en=$(systemctl is-enabled kiln-e2e-check.service 2>&1)
if [ "$en" = enabled ]; then report unit-enabled PASS; else report unit-enabled FAIL "$en"; fi

if v=$(podman --version 2>&1); then report podman PASS "$v"; else report podman FAIL "$v"; fi

# On first boot systemd applies presets (that is how Ignition's "enabled"
# units get enabled); it must not have failed half-way.
preset_err=$(journalctl -b 0 -q --no-pager | grep -m1 'Failed to populate /etc with preset')
if [ -n "$preset_err" ]; then
    report presets FAIL "${preset_err:0:160}"
else
    report presets PASS
fi

failed=$(systemctl --failed --plain --no-legend | awk '{print $1}' | xargs)
if [ -z "$failed" ]; then report failed-units PASS; else report failed-units FAIL "$failed"; fi

report uptime PASS "$(cut -d' ' -f1 /proc/uptime)s"
sync
