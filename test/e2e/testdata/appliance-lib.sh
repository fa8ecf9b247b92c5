# Shared by the appliance check scripts: the test puts it in place of
# their "#@LIB@" line (the guest gets one self-contained script).
set -u
report() { echo "KILN-E2E: $1 $2 ${3:-}"; }
pass() { report "$1" PASS "${2:-}"; }
fail() { report "$1" FAIL "${2:-}"; }
# wait_for SECONDS CMD...: run CMD every second until it succeeds.
wait_for() {
    local n=$1; shift
    for ((i = 0; i < n; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 1
    done
    return 1
}
prop() { systemctl show -p "$2" --value "$1"; }
# shutdown_now reboot|poweroff: ask for an orderly shutdown as a person does
# (systemctl, through logind, so the kubelet's graceful node shutdown runs),
# after the line the harness times the shutdown from (vm.ShutdownMarker).
shutdown_now() { echo "KILN-E2E-SHUTDOWN: $1 requested"; systemctl --no-block "$1"; }
oneline() { tr '\n' ' ' | tr -s ' ' | cut -c1-"${1:-240}"; }
# What= as the unit file says it (systemctl show reports the resolved device once mounted).
unit_what() { systemctl cat var-lib-kiln-images.mount | sed -n 's/^What=//p' | tail -n1; }
is_active() { [ "$(prop "$1" ActiveState)" = active ]; }
# pod_up POD SECONDS: wait (bounded) until the kubelet runs pod POD, ready,
# every container running.
pod_up() { wait_for "$2" /usr/local/bin/cri-check -timeout 20s ready "$1"; }
# restore_checks WORKLOAD: after a power cut, CRI-O found the shutdown
# unclean and checked its store (after which it may wipe it), and kiln's
# restore ran after CRI-O and before the unit WORKLOAD (the kubelet), and succeeded; kiln
# agent status says every kept image is in local storage. The details say
# whether CRI-O wiped its store and what kiln restored (the test reads them).
restore_checks() {
    local j wiped r c w restored
    j=$(journalctl -b 0 -q --no-pager -u crio.service -o cat)
    wiped=$(grep -c 'Wiping storage directory' <<<"$j")
    if grep -q 'because of unclean shutdown' <<<"$j"; then pass crio-unclean "wiped=$wiped"; else fail crio-unclean "CRI-O logged no check of its store: the power cut was not seen"; fi
    wait_for 300 is_active kiln-restore-images.service || diag kiln-restore-images.service
    r=$(prop kiln-restore-images.service ActiveEnterTimestampMonotonic)
    c=$(prop crio.service ActiveEnterTimestampMonotonic)
    w=$(prop "$1" ExecMainStartTimestampMonotonic)
    restored=$(journalctl -b 0 -q --no-pager -u kiln-restore-images.service -o cat | grep -c '^kiln: restored .* from ')
    if is_active kiln-restore-images.service && [ "${c:-0}" -gt 0 ] && [ "${r:-0}" -ge "$c" ] && [ "${w:-0}" -ge "$r" ]; then
        pass restore "restored=$restored wiped=$wiped crio=${c}us restore=${r}us workload=${w}us"
    else
        fail restore "$(prop kiln-restore-images.service ActiveState)/$(prop kiln-restore-images.service Result) crio=${c}us restore=${r}us workload=${w}us"
        diag kiln-restore-images.service
    fi
    if /var/lib/kiln/images/bin/kiln agent status | grep -q '^images: *all [0-9]* image(s) the node keeps are in local storage'; then
        pass status-images
    else
        fail status-images "$(/var/lib/kiln/images/bin/kiln agent status | grep -A3 '^images:' | oneline)"
    fi
}
