# Shared by the upgrade scenarios' scripts (upgrade_test.go puts it in place
# of their "#@UPGRADE_LIB@" line, after appliance-lib.sh): the boot count,
# boot-tagged checks, the values the test fills in, and the helpers that
# read the node's release state and ask CRI-O.
state=/var/lib/kiln-e2e
mkdir -p "$state"
n=$(( $(cat "$state/boots" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$state/boots"
# Check names carry the boot: b2-cri-workload.
report() { echo "KILN-E2E: b$n-$1 $2 ${3:-}"; }
pass boot "n=$n"

AGENT=/var/lib/kiln/images/bin/kiln
STORE=/var/lib/kiln/releases/blobs/sha256
POD="@WORKLOAD_POD@"
LINE="@HELLO_LINE@"
APP="@APP_REPO@"
PAUSE_REF="@PAUSE_REF@"; PAUSE_DIGEST="@PAUSE_DIGEST@"
declare -A DIGEST=([1.0.0]="@APP10_DIGEST@" [1.1.0]="@APP11_DIGEST@" [1.2.0]="@APP12_DIGEST@")
TOOLS_REF="@TOOLS_REF@"; TOOLS_DIGEST="@TOOLS_DIGEST@"; TOOLS_LAYER="@TOOLS_LAYER@"
POD10_BLOB="@POD10_BLOB@" # the factory release's pod manifest, stored at the first begin
TRUST_FACTORY="@TRUST_FACTORY@"; TRUST_ROTATED="@TRUST_ROTATED@" # key files in /etc/kiln/trust
WORKLOAD=kubelet.service # runs the workload's static pod
MANIFEST=/etc/kubernetes/manifests/hello.yaml

if [ -x "$AGENT" ]; then pass agent "$AGENT"; else fail agent "no $AGENT"; fi
diag() { for u in "$@"; do journalctl -b 0 -q --no-pager -n 20 -u "$u" | sed "s/^/diag $u: /"; done; }
# cri NAME ARGS...: a cri-check command whose KILN-E2E lines carry the boot.
cri() { /usr/local/bin/cri-check -timeout 60s "$@" | sed "s/^KILN-E2E: /KILN-E2E: b$n-/"; }
status_is() { "$AGENT" agent status | grep -qE "^$1: +$2( |\$)"; }
show_status() { echo "KILN-E2E-STATUS: n=$n $("$AGENT" agent status -o json | tr -d '\n' | tr -s ' ')"; }

# settled VERSION: the health check has decided (nothing being tried) and
# VERSION is current.
settled() {
    if wait_for 420 status_is trying -; then pass settled; else fail settled "still trying after 420 s"; diag kiln-release-check.service; fi
    if status_is current "${1//./\\.}"; then pass current "$1"; else fail current "want $1: $("$AGENT" agent status | oneline)"; fi
}

# begin_before_crio: kiln-release-begin finished before CRI-O started.
begin_before_crio() {
    local b c
    b=$(prop kiln-release-begin.service ActiveEnterTimestampMonotonic)
    c=$(prop crio.service InactiveExitTimestampMonotonic)
    if [ "${b:-0}" -gt 0 ] && [ "${c:-0}" -gt "$b" ]; then pass begin-before-crio "begin=$b crio=$c"; else fail begin-before-crio "begin=$b crio=$c"; fi
}

# mirror_opened: the upgrade boot's mirror gate opened (every image of the
# release being tried answered the registry), not gave up after its wait.
mirror_opened() {
    local j
    wait_for 300 journal_has kiln-mirror.service 'mirror on:' || true
    j=$(journalctl -b 0 -q --no-pager -u kiln-mirror.service)
    if grep -q 'mirror on:' <<<"$j"; then pass mirror-opened; else fail mirror-opened "$(tail -n 3 <<<"$j" | oneline)"; diag kiln-registry.service; fi
}
journal_has() { journalctl -b 0 -q --no-pager -u "$1" | grep -q "$2"; }

# workload VERSION: the kubelet runs the workload pod from VERSION's
# manifest, on VERSION's app image, by digest.
workload() {
    if grep -qx "      image: $APP:${1%.0}" "$MANIFEST"; then pass manifest "$1"; else fail manifest "want $APP:${1%.0}: $(grep image: "$MANIFEST" | oneline)"; fi
    pod_up "$POD" 300 || diag "$WORKLOAD"
    cri workload "$POD" "$APP:${1%.0}" "${DIGEST[$1]}" "$LINE" || diag "$WORKLOAD" crio.service
}

# pinned CHECK VERSION true|false: CRI-O's ImageStatus of VERSION's app image.
pinned() { cri pinned "$1" "$APP:${2%.0}" "${DIGEST[$2]}" "$3"; }


# trust FILE...: the node trusts exactly these key files (/etc/kiln/trust).
trust() {
    local got want
    got=$(ls /etc/kiln/trust | sort | xargs)
    want=$(printf '%s\n' "$@" | sort | xargs)
    if [ "$got" = "$want" ]; then pass trust "$got"; else fail trust "trusts $got, want $want"; fi
}

IMPORT=kiln-import@vdb1.service
# fingerprint: what a refused stick must leave as it was.
fingerprint() { { cat /var/lib/kiln/state.json; ls -la "$STORE"; cat /etc/crio/crio.conf.d/50-kiln-pins.conf; ls -la /etc/kiln/trust; } | sha256sum | cut -c1-16; }

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

# plug VERSION [STICK]: ask for the stick (named VERSION unless STICK says
# otherwise), wait until VERSION is staged and the stick pulled out, reboot
# into it.
plug() {
    echo "kiln-e2e: plug ${2:-$1}"
    staged_reboot "$1"
}

# staged_reboot VERSION: wait until the stick in the node has VERSION
# staged and is pulled out, reboot into it.
staged_reboot() {
    local v=$1
    if wait_for 600 status_is staged "${v//./\\.}"; then pass staged "$v"; else fail staged "$v not staged after 600 s"; diag "kiln-import@vdb1.service"; fi
    if wait_for 180 test ! -e /sys/block/vdb; then pass stick-removed; else fail stick-removed "vdb still there after 180 s"; fi
    show_status
    # The firmware once hung on a reset 2 s after the hot-unplug (docs/e2e.md):
    # let the root port finish powering its slot off first (pciehp's 5 s), as a
    # technician would not reboot that fast either.
    udevadm settle --timeout=30 || true
    sleep 10
    echo "kiln-e2e: rebooting to try $v"
    shutdown_now reboot
    exit 0
}

# On a node whose OS is in A/B slots (issue 23):
booted_entry() { cat /sys/firmware/efi/efivars/LoaderEntrySelected-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f 2>/dev/null | tail -c +5 | tr -d '\0'; }
os_version() { sed -n 's/^VERSION_ID=//p' /usr/lib/os-release | tr -d '"'; }
usr_data() { lsblk -dno PARTUUID "$(veritysetup status usr | sed -n 's/^ *data device: *//p')"; }
# booted ENTRY VERSION PARTUUID: this boot came from ENTRY, /usr is OS
# VERSION from that partition, verified.
booted() {
    if [ "$(booted_entry)" = "$1" ]; then pass booted-entry "$1"; else fail booted-entry "$(booted_entry), want $1"; fi
    if [ "$(os_version)" = "$2" ]; then pass os-release "VERSION_ID=$2"; else fail os-release "$(os_version), want $2"; fi
    if [ "$(usr_data)" = "$3" ] && veritysetup status usr | grep -q 'status: *verified'; then pass usr-slot "$3"; else fail usr-slot "$(usr_data), want $3"; fi
}
