package contract

// ImagesRootHashParam is the kernel command line parameter that carries
// the image partition's dm-verity root hash in a Secure Boot-ready disk's
// signed unified kernel images, beside usrhash= for /usr: signed with the
// rest of the image, it cannot be edited on the ESP.
const ImagesRootHashParam = "kiln.images.roothash"

// SecureBoot is what a Secure Boot-ready disk's build wrote on its ESP
// (kiln.json's secureBoot; absent on a disk built without). The unified
// kernel images are listed by path, not digest: each carries the image
// partition's root hash, which covers this file, so their bytes are
// checked by their db signature and their command line instead.
type SecureBoot struct {
	// DB is the db certificate (PEM) the unified kernel images and
	// systemd-boot are signed for.
	DB string `json:"db"`
	// Keys is the ESP directory of the signed lists systemd-boot enrols
	// (loader/keys/NAME: PK.auth, KEK.auth, db.auth).
	Keys string `json:"keys"`
	// UKIs are the signed unified kernel images, each replacing the boot
	// loader entry of the same ID (EFI/Linux/ID.efi).
	UKIs []UKI `json:"ukis"`
	// Loaders are the signed systemd-boot binaries.
	Loaders []BootFile `json:"loaders"`
}

// UKI is one signed unified kernel image on the ESP.
type UKI struct {
	Path  string `json:"path"`  // on the ESP, e.g. EFI/Linux/kiln-1.0.efi
	Entry string `json:"entry"` // the boot loader entry ID it replaced
	// FirstBoot: its command line carries ignition.firstboot (the one-shot
	// entry the node removes after Ignition ran).
	FirstBoot bool `json:"firstBoot,omitempty"`
}

// BootFile is a file on the ESP and the sha256 of its bytes.
type BootFile struct {
	Path   string `json:"path"`   // on the ESP, e.g. EFI/BOOT/BOOTX64.EFI
	Digest string `json:"digest"` // sha256:…
}
