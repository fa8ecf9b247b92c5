// Package e2e holds kiln's end-to-end tests: real disk images booted in QEMU
// (TCG, UEFI, no network), configured by Ignition at first boot, checked from
// inside the guest and offline afterwards. Run them with `make e2e`; see
// docs/e2e.md. Building blocks: fixture (the base OS disk), vm (boot and
// console), rawdisk (offline reads and writes of partition contents).
package e2e
