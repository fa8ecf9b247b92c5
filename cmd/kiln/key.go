//go:build !nodeonly

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-appliance/kiln/internal/secureboot"
	"github.com/kiln-appliance/kiln/systemd/contract/bundlefmt"
)

func init() { subcommands = append(subcommands, newKeyCommand) }

func newKeyCommand() *cobra.Command {
	key := &cobra.Command{
		Use:   "key",
		Short: "Manage the keys that sign upgrade bundles and Secure Boot's boot files",
		Example: `  kiln key generate factory   # factory.key signs bundles; factory.pub goes in the recipe's trust
  kiln key secureboot secureboot   # PK, KEK and db: the Secure Boot keys`,
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
	key.AddCommand(newSecureBootKeyCommand())
	return key
}

func newSecureBootKeyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "secureboot DIR",
		Short: "Write new Secure Boot keys (PK, KEK, db) into a new directory DIR",
		Long: `Secureboot makes the keys of a Secure Boot chain of trust in a new directory DIR (never over an
existing one): for each of PK, KEK and db an RSA 2048 private key X.key (mode 0600) and its
self-signed certificate X.crt, named after DIR, and X.auth, the signed EFI signature list that
systemd-boot enrols from loader/keys/ on a machine in setup mode (PK.auth and KEK.auth signed by PK,
db.auth by KEK). The *.key files stay at the factory; db.crt checks what db.key signs (the boot
loader and unified kernel images). These keys are not the bundle-signing key of kiln key generate.
See docs/security.md.`,
		Example: `  kiln key secureboot secureboot   # secureboot/{PK,KEK,db}.{key,crt,auth}`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if base := filepath.Base(dir); dir == "" || !keyFileName.MatchString(base) {
				return usageError{fmt.Errorf("directory %q: give a new directory such as secureboot (or keys/secureboot): its name, letters, digits, '.', '_' and '-' starting with a letter or digit, names the certificates", dir)}
			}
			if err := secureboot.Generate(cmd.Context(), dir); err != nil {
				return fmt.Errorf("key secureboot: %w", err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "wrote %s: %s\n", dir, strings.Join(secureboot.Files(), " "))
			fmt.Fprintf(out, "the *.key files are private: keep them at the factory, never on an appliance or in version control\n")
			fmt.Fprintf(out, "%s verifies what %s signs; the *.auth files are what systemd-boot enrols from loader/keys/\n",
				secureboot.Cert(dir, secureboot.DB), secureboot.Key(dir, secureboot.DB))
			return nil
		},
	}
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
