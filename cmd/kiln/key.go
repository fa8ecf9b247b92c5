//go:build !nodeonly

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

func init() { subcommands = append(subcommands, newKeyCommand) }

func newKeyCommand() *cobra.Command {
	key := &cobra.Command{
		Use:     "key",
		Short:   "Manage the keys that sign upgrade bundles",
		Example: `  kiln key generate factory   # factory.key signs bundles; factory.pub goes in the recipe's trust`,
	}
	key.AddCommand(&cobra.Command{
		Use:   "generate NAME",
		Short: "Write a new ed25519 key pair: NAME.key (private) and NAME.pub (public)",
		Long: `Generate writes NAME.key, the private key that signs bundles (PKCS#8 PEM, mode 0600; keep it
off the appliances and out of version control), and NAME.pub, the public key a recipe lists under
trust (PKIX PEM). Neither file is overwritten: generating over an existing key would orphan every
appliance that trusts it.`,
		Example: `  kiln key generate factory        # factory.key and factory.pub
  kiln key generate keys/factory   # keys/factory.key and keys/factory.pub`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := checkKeyName(name); err != nil {
				return usageError{err}
			}
			priv, pub, err := bundlefmt.GenerateKey()
			if err != nil {
				return err
			}
			if err := writeNew(name+".key", priv, 0o600); err != nil {
				return err
			}
			if err := writeNew(name+".pub", pub, 0o644); err != nil {
				os.Remove(name + ".key")
				return err
			}
			k, err := bundlefmt.ParsePublicKey(pub)
			if err != nil {
				return err
			}
			id, err := bundlefmt.KeyID(k)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s.key and %s.pub (key ID %s)\n", name, name, id)
			return nil
		},
	})
	return key
}

// keyFileName is what the last element of a key's NAME may be: a plain
// name, not empty and not hidden, so NAME.key and NAME.pub are files a
// technician sees (kiln key generate "" wrote ".key").
var keyFileName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// checkKeyName refuses a NAME that does not end in a plain file name, or
// that already ends in .key or .pub.
func checkKeyName(name string) error {
	base := filepath.Base(name)
	switch {
	case name == "" || strings.HasSuffix(name, "/") || !keyFileName.MatchString(base):
		return fmt.Errorf("key name %q: give a name such as factory (or DIR/factory): letters, digits, '.', '_' and '-', starting with a letter or digit; kiln writes NAME.key and NAME.pub", name)
	case strings.HasSuffix(base, ".key") || strings.HasSuffix(base, ".pub"):
		stem := name[:len(name)-len(".key")]
		return fmt.Errorf("key name %q: give it without .key or .pub (kiln key generate %s writes %s.key and %s.pub)", name, stem, stem, stem)
	}
	return nil
}

// writeNew writes a file that must not exist yet, durably.
func writeNew(p string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		if os.IsExist(err) {
			return fmt.Errorf("%s exists: kiln never overwrites a key; choose another name or move it away", p)
		}
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(p)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(p)
		return err
	}
	return f.Close()
}
