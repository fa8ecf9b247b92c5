package slotwrite

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/kiln-appliance/kiln/systemd/contract"
	"github.com/kiln-appliance/kiln/systemd/contract/slot"
)

// Veritysetup is the tool Seal runs (cryptsetup's, as the image partition's
// unit does).
var Veritysetup = "/usr/sbin/veritysetup"

// Seal formats the slot's hash partition from its data with the factory's
// values and checks that the root hash is the signed one: after Write, the
// proof that data holds exactly the factory's slot image. A slot that fails
// is never made bootable; its hash partition is left as written (the next
// Write and Seal start over).
func Seal(ctx context.Context, data, hash string, v slot.Verity) error {
	if err := v.Check(); err != nil {
		return err
	}
	args := []string{"format", "--hash=sha256", "--format=1",
		"--data-block-size=" + strconv.Itoa(slot.VerityBlock), "--hash-block-size=" + strconv.Itoa(slot.VerityBlock),
		"--data-blocks=" + strconv.FormatInt(v.DataBlocks, 10), "--salt=" + saltArg(v.Salt), "--uuid=" + v.UUID,
		data, hash}
	out, err := exec.CommandContext(ctx, Veritysetup, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("veritysetup format of the new slot: %v: %s", err, strings.TrimSpace(string(out)))
	}
	got := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, val, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "Root hash" {
			got = strings.TrimSpace(val)
		}
	}
	if got == "" {
		return fmt.Errorf("veritysetup format of the new slot printed no root hash: %s", strings.TrimSpace(string(out)))
	}
	if got != v.RootHash {
		return fmt.Errorf("%w: the new slot's root hash is %s, the signed release says %s: what was written is not the factory's image; the node stays on its release (plug the stick in again, or reflash)", contract.ErrDamaged, got, v.RootHash)
	}
	return nil
}

// saltArg is veritysetup's spelling of an empty salt.
func saltArg(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
