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
ENV10_BLOB="@ENV10_BLOB@" # the factory release's workload.env, stored at the first begin
WORKLOAD=kiln-e2e-workload.service

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

# workload VERSION: the workload pod runs VERSION's app image, by digest.
workload() {
    wait_for 300 is_active "$WORKLOAD" || diag "$WORKLOAD"
    cri workload "$POD" "$APP:${1%.0}" "${DIGEST[$1]}" "$LINE" || diag "$WORKLOAD" crio.service
}

# pinned CHECK VERSION true|false: CRI-O's ImageStatus of VERSION's app image.
pinned() { cri pinned "$1" "$APP:${2%.0}" "${DIGEST[$2]}" "$3"; }

