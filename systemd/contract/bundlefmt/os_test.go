package bundlefmt

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract/slot"
)

// osBundle is a delta with an OS section and the filesystem it describes:
// a new slot image of chunks a b c d, its base's of a b e, so the pack is
// c d.
func osBundle(t testing.TB, pub ed25519.PublicKey) (*Manifest, []byte) {
	t.Helper()
	params := slot.Params{Polynomial: 0x3DA3358B4DC173, MinSize: 4 << 10, MaxSize: 64 << 10, AverageBits: 14}
	piece := func(c byte) []byte { return bytes.Repeat([]byte{c}, 8<<10) }
	index := func(pieces ...[]byte) (*slot.Index, []byte) {
		x := &slot.Index{Params: params}
		for _, p := range pieces {
			x.Chunks = append(x.Chunks, slot.Chunk{Digest: sha256.Sum256(p), Size: uint32(len(p))})
			x.Size += int64(len(p))
		}
		var b bytes.Buffer
		if err := x.Encode(&b); err != nil {
			t.Fatal(err)
		}
		return x, b.Bytes()
	}
	x, xb := index(piece('a'), piece('b'), piece('c'), piece('d'))
	_, bb := index(piece('a'), piece('b'), piece('e'))
	pack := append(piece('c'), piece('d')...)
	kernel := []byte("a kernel")

	m := testManifest(t, pub)
	var fs []byte
	for _, content := range [][]byte{xb, bb, pack, kernel} {
		d := fmt.Sprintf("sha256:%x", sha256.Sum256(content))
		m.Files = append(m.Files, File{Path: OSFile(d), Size: int64(len(content)), Digest: d, Offset: int64(len(fs))})
		fs = append(fs, content...)
		fs = append(fs, make([]byte, 4096-len(fs)%4096)...)
	}
	slices.SortFunc(m.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	digest := func(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }
	m.OS = &OS{
		Usr: UsrSlot{
			Index: digest(xb), Size: x.Size,
			Verity: slot.Verity{RootHash: strings.Repeat("ab", 32), Salt: "6b696c6e", UUID: "6b696c6e-736c-6f74-8000-000000000001", DataBlocks: x.Size / slot.VerityBlock},
			Pack:   &PackFile{Digest: digest(pack), Size: int64(len(pack))},
			Bases:  []SlotBase{{ReleaseID: m.AppliesTo[0], Index: digest(bb)}},
		},
		Entry: BootEntry{
			Title: "acme", Version: "1.1.0", UsrFSType: "squashfs", Options: []string{"root=LABEL=root", "rw"},
			Kernel: BootFile{Name: "vmlinuz", Size: int64(len(kernel)), Digest: digest(kernel), OnStick: true},
			Initrd: []BootFile{{Name: "initrd.img", Size: 30 << 20, Digest: digest([]byte("the base's initramfs"))}},
		},
	}
	m.SchemaVersion = OSSchemaVersion
	m.Filesystem = Filesystem{Size: int64(len(fs))}
	var err error
	if m.Filesystem.Metadata, err = m.HashMetadata(bytes.NewReader(fs), 0, nil); err != nil {
		t.Fatal(err)
	}
	return m, fs
}

// A bundle with an OS section goes through every check the node makes, and
// its signed manifest comes back whole.
func TestOSSection(t *testing.T) {
	priv, pub := testKey(t)
	m, fs := osBundle(t, pub)
	env, err := Sign(m, priv)
	if err != nil {
		t.Fatal(err)
	}
	hdr, _ := EncodeHeader(env, HeaderSize(len(env)))
	disk := append(hdr, fs...)
	got, h, _, err := Open(bytes.NewReader(disk), []ed25519.PublicKey{pub})
	if err != nil {
		t.Fatal(err)
	}
	if err := got.CheckFilesystem(bytes.NewReader(disk), h.Size, nil); err != nil {
		t.Fatal(err)
	}
	x, bases, err := got.CheckOS(bytes.NewReader(disk), h.Size)
	if err != nil {
		t.Fatal(err)
	}
	if x.Size != m.OS.Usr.Size || len(x.Chunks) != 4 || len(bases) != 1 || len(bases[0].Chunks) != 3 {
		t.Errorf("CheckOS gave an index of %d bytes, %d chunks, bases %v", x.Size, len(x.Chunks), bases)
	}
	if !reflect.DeepEqual(got.OS, m.OS) {
		t.Errorf("the OS section came back as\n%+v\nwant\n%+v", got.OS, m.OS)
	}
}

// A damaged slot index is named as such, before it is decoded; a pack that
// is not what the bases lack is refused.
func TestCheckOSRefuses(t *testing.T) {
	_, pub := testKey(t)
	m, fs := osBundle(t, pub)
	at := func(d string) int64 {
		i := slices.IndexFunc(m.Files, func(f File) bool { return f.Path == OSFile(d) })
		return m.Files[i].Offset
	}
	for _, tc := range []struct {
		name  string
		spoil func(m *Manifest, fs []byte)
		want  string
	}{
		{"index byte", func(m *Manifest, fs []byte) { fs[at(m.OS.Usr.Index)+40] ^= 1 }, "slot index os/sha256/"},
		{"base index byte", func(m *Manifest, fs []byte) { fs[at(m.OS.Usr.Bases[0].Index)+60] ^= 1 }, "differs from the signed manifest"},
		{"pack for another base", func(m *Manifest, _ []byte) { m.OS.Usr.Bases[0].Index = "" }, "the usr slot pack is 16384 bytes, the chunks its bases lack are 32768"},
		{"image size", func(m *Manifest, _ []byte) { m.OS.Usr.Size += 4096; m.OS.Usr.Verity.DataBlocks++ }, "describes 32768 bytes, the manifest says 36864"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, fs := osBundle(t, pub)
			tc.spoil(m, fs)
			_, _, err := m.CheckOS(bytes.NewReader(fs), 0)
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckOS: %v, want ErrDamaged saying %q", err, tc.want)
			}
		})
	}
	// The pack's bytes themselves: CheckFilesystem names the file.
	bad := slices.Clone(fs)
	bad[at(m.OS.Usr.Pack.Digest)+9000] ^= 1
	if err := m.CheckFilesystem(bytes.NewReader(bad), 0, nil); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), OSFile(m.OS.Usr.Pack.Digest)) {
		t.Errorf("a changed pack byte: %v", err)
	}
}

func TestValidateOSRefuses(t *testing.T) {
	_, pub := testKey(t)
	for _, tc := range []struct {
		name  string
		spoil func(*Manifest)
		want  string
	}{
		{"schema 2", func(m *Manifest) { m.SchemaVersion = 2 }, "schema 2 has no os section"},
		{"uki not a file", func(m *Manifest) {
			m.OS.UKIs = []UKIFile{{Slot: "b", ImagesRootHash: strings.Repeat("a", 64), Digest: "sha256:" + strings.Repeat("2", 64), Size: 9}}
		}, "unified kernel image for slot b sha256:2222"},
		{"uki slot", func(m *Manifest) {
			m.OS.UKIs = []UKIFile{{Slot: "c", ImagesRootHash: strings.Repeat("a", 64), Digest: m.OS.Usr.Index}}
		}, `slot "c"`},
		{"index not a file", func(m *Manifest) { m.OS.Usr.Index = "sha256:" + strings.Repeat("0", 64) }, "is not a file of the bundle"},
		{"index not a digest", func(m *Manifest) { m.OS.Usr.Index = "usr.index" }, "is not a sha256 digest"},
		{"pack size", func(m *Manifest) { m.OS.Usr.Pack.Size-- }, "usr slot pack"},
		{"empty pack listed", func(m *Manifest) { m.OS.Usr.Pack.Size = 0 }, "an empty pack is left out"},
		{"verity blocks", func(m *Manifest) { m.OS.Usr.Verity.DataBlocks-- }, "they must agree"},
		{"verity salt", func(m *Manifest) { m.OS.Usr.Verity.Salt = "xyz" }, "salt"},
		{"bases", func(m *Manifest) { m.OS.Usr.Bases = nil }, "are not the releases the bundle applies to"},
		{"other base", func(m *Manifest) { m.OS.Usr.Bases[0].Version = "0.9.0" }, "are not the releases the bundle applies to"},
		{"usrhash in options", func(m *Manifest) { m.OS.Entry.Options = append(m.OS.Entry.Options, "usrhash=00") }, `options name "usrhash=00"`},
		{"option with a space", func(m *Manifest) { m.OS.Entry.Options[0] = "a b" }, "holds a space"},
		{"fs type", func(m *Manifest) { m.OS.Entry.UsrFSType = "Squash FS" }, "usr filesystem type"},
		{"no version", func(m *Manifest) { m.OS.Entry.Version = "" }, "no version"},
		{"kernel path", func(m *Manifest) { m.OS.Entry.Kernel.Name = "../vmlinuz" }, "want a plain file name"},
		{"kernel missing", func(m *Manifest) { m.OS.Entry.Kernel.Digest = "sha256:" + strings.Repeat("1", 64) }, "boot file vmlinuz"},
		{"full without initrd", func(m *Manifest) {
			m.Kind, m.AppliesTo, m.OS.Usr.Bases = KindFull, nil, nil
			for i := range m.Blobs {
				m.Blobs[i].OnStick = true
			}
			m.Space.CopyBytes = 1600
		}, "a full bundle must carry boot file initrd.img"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := osBundle(t, pub)
			if err := m.Validate(); err != nil {
				t.Fatalf("unspoilt: %v", err)
			}
			tc.spoil(m)
			err := m.Validate()
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %v, want ErrDamaged saying %q", err, tc.want)
			}
		})
	}
}

// A manifest without an OS section is written as schema 2 and reads as
// before schema 3, with no trace of the section: what kiln writes for a
// base without slots is what it wrote before.
func TestNoOSSectionIsSchema2(t *testing.T) {
	_, pub := testKey(t)
	m := testManifest(t, pub)
	m.SchemaVersion = NoOSSchemaVersion
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(`"os"`)) {
		t.Errorf("a manifest without OS section names one:\n%s", b)
	}
	if err := m.Validate(); err != nil {
		t.Error(err)
	}
}

// Decode never panics, and what it accepts survives Validate and a second
// encoding.
func FuzzDecode(f *testing.F) {
	pub, _, _ := ed25519.GenerateKey(nil)
	m, _ := osBundle(f, pub)
	b, _ := m.Encode()
	f.Add(b)
	m.OS = nil
	b, _ = m.Encode()
	f.Add(b)
	f.Add([]byte(`{"schemaVersion":3,"os":{"usr":{"bases":[{}]}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		m.Validate()
		if _, err := m.Encode(); err != nil {
			t.Fatalf("a decoded manifest does not encode: %v", err)
		}
	})
}
