package builder

import (
	"context"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/partitions"
	"github.com/kiln-appliance/kiln/partitions/verity"
	"github.com/kiln-appliance/kiln/systemd/contract/bootentry"
)

func TestSecureBootLoaderConf(t *testing.T) {
	ids := []string{"kiln-1.0", "ignition-firstboot"}
	for _, c := range []struct{ name, in, want string }{
		{"none", "", "secure-boot-enroll force\n"},
		{"default of a replaced entry", "timeout 0\ndefault ignition-firstboot.conf\neditor no\n", "timeout 0\ndefault ignition-firstboot.efi\neditor no\nsecure-boot-enroll force\n"},
		{"default of another entry kept", "default other.conf\n", "default other.conf\nsecure-boot-enroll force\n"},
		{"a glob kept", "default kiln-*\n", "default kiln-*\nsecure-boot-enroll force\n"},
		{"an earlier setting replaced", "secure-boot-enroll manual\ntimeout 3", "timeout 3\nsecure-boot-enroll force\n"},
	} {
		if got := string(secureBootLoaderConf([]byte(c.in), ids)); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestOSRelease(t *testing.T) {
	for _, c := range []struct {
		e    bootentry.Entry
		want string
	}{
		{bootentry.Entry{ID: "kiln-1.0", Title: "Acme OS", Version: "1.0"}, "NAME=\"Acme OS\"\nPRETTY_NAME=\"Acme OS\"\nID=kiln\nVERSION_ID=\"1.0\"\n"},
		{bootentry.Entry{ID: "ignition-firstboot"}, "NAME=\"ignition-firstboot\"\nPRETTY_NAME=\"ignition-firstboot\"\nID=kiln\n"},
		{bootentry.Entry{ID: "x", Title: "a \"b\" $c `d` \\e"}, "NAME=\"a \\\"b\\\" \\$c \\`d\\` \\\\e\"\nPRETTY_NAME=\"a \\\"b\\\" \\$c \\`d\\` \\\\e\"\nID=kiln\n"},
	} {
		if got := string(osRelease(&c.e)); got != c.want {
			t.Errorf("%s: got %q, want %q", c.e.ID, got, c.want)
		}
	}
}

// A factory disk's UKIs sign the image partition's root hash: Write
// refuses a partition without one before it touches the disk (only a
// reflash stick's, NoImageVerity, goes without).
func TestSecureBootESPWriteNeedsImageRootHash(t *testing.T) {
	sb := &SecureBootESP{}
	for _, id := range []partitions.ImageIdentity{{}, {Verity: &verity.Verity{}}} {
		err := sb.Write(context.Background(), "no-such-disk", nil, id)
		if err == nil || !strings.Contains(err.Error(), "no dm-verity root hash to sign") {
			t.Errorf("Write of image %+v: %v, want a refusal", id, err)
		}
	}
}
