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
oneline() { tr '\n' ' ' | tr -s ' ' | cut -c1-"${1:-240}"; }
# What= as the unit file says it (systemctl show reports the resolved device once mounted).
unit_what() { systemctl cat var-lib-kiln-images.mount | sed -n 's/^What=//p' | tail -n1; }
is_active() { [ "$(prop "$1" ActiveState)" = active ]; }
