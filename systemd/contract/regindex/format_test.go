package regindex

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func sampleIndex() *Index {
	return &Index{
		SchemaVersion: Version,
		Blobs:         strings.Repeat("0a", 32) + strings.Repeat("1b", 32) + strings.Repeat("ff", 32),
		Sizes:         []int64{512, 1 << 40, 0},
		MediaTypes:    []string{"application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json"},
		Manifests: []IndexedManifest{
			{Blob: 0, MediaType: 0, Layers: []int{1, 2}},
			{Blob: 1, MediaType: 1, ArtifactType: "application/spdx+json", Subject: "sha256:" + strings.Repeat("0a", 32),
				Annotations: map[string]string{"z": "last", "a": "first", "org.opencontainers.image.created": "2026-11-24T00:00:00Z"},
				Children:    []int{0}},
		},
		Images: []IndexedImage{{Repository: "quay.io/acme/app", Tag: "1.2", Manifest: 0}, {Repository: "quay.io/acme/multi", Manifest: 1}},
	}
}

// TestRegistryIndexRoundTrip: what is encoded decodes to the same index,
// and the same index always encodes to the same bytes (annotations are a
// map: their order must not leak into a reproducible partition).
func TestRegistryIndexRoundTrip(t *testing.T) {
	ix := sampleIndex()
	b, err := Encode(ix)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "kiln registry index\n") {
		t.Errorf("no magic line: %q", b[:20])
	}
	for i := 0; i < 20; i++ {
		if again, _ := Encode(ix); string(again) != string(b) {
			t.Fatal("the same index encoded to different bytes")
		}
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	ix.Manifests[0].Annotations = nil // absent and empty are the same on the wire
	if !reflect.DeepEqual(got, ix) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, ix)
	}
}

// TestRegistryIndexRejects: what the node must not use is an error that
// says what is wrong, never a panic or an allocation the file cannot back.
// The parser's own checks sit behind the checksum: their cases are sealed
// with a matching one.
func TestRegistryIndexRejects(t *testing.T) {
	good, err := Encode(sampleIndex())
	if err != nil {
		t.Fatal(err)
	}
	other := sampleIndex()
	other.SchemaVersion = 4
	v4, _ := Encode(other)
	magic := len(magicLine)
	payload := good[magic+1+4:] // after the magic, the version (one byte) and the checksum
	sealed := func(p ...byte) []byte { return seal(Version, p) }
	flipped := append([]byte{}, good...)
	flipped[len(flipped)/2] ^= 0x10
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "no magic line"},
		{"schema 1 (JSON)", []byte(`{"schemaVersion":1,"blobs":""}`), "no magic line"},
		{"another version", v4, "schema version 4, this kiln reads 3"},
		{"schema 2 (no checksum)", append([]byte(magicLine), 2, 0), "schema version 2, this kiln reads 3"},
		{"a bit flipped", flipped, "damaged: its checksum does not match its contents"},
		{"truncated", good[:len(good)-3], "damaged: its checksum does not match"},
		{"trailing bytes", append(append([]byte{}, good...), 'x'), "damaged: its checksum does not match"},
		{"no checksum", good[:magic+1+3], "truncated or damaged: a string longer than the file"},
		{"truncated, sealed", sealed(payload[:len(payload)-3]...), "truncated or damaged"},
		{"trailing bytes, sealed", sealed(append(append([]byte{}, payload...), 'x')...), "1 bytes after the last image"},
		// 2^62 blobs in a file of a few bytes.
		{"a count larger than the file", sealed(0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40), "a list longer than the file"},
		{"a varint too long", sealed(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f), "a number"},
		{"damaged magic", append([]byte("kiln registry indeX\n"), good[magic:]...), "no magic line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), FileName) {
				t.Errorf("got %v, want an error naming %s and saying %q", err, FileName, tc.want)
			}
			if strings.HasPrefix(tc.name, "schema 2") || tc.name == "another version" {
				if !errors.Is(err, ErrVersion) {
					t.Errorf("%v is not ErrVersion", err)
				}
			}
		})
	}
	bad := sampleIndex()
	bad.Manifests[0].Layers = []int{-1}
	if _, err := Encode(bad); err == nil {
		t.Error("a negative position was encoded")
	}
	bad = sampleIndex()
	bad.Blobs = bad.Blobs[:64] + strings.Repeat("../", 21) + "x" + bad.Blobs[128:]
	if _, err := Encode(bad); err == nil {
		t.Error("a digest that is not hex was encoded")
	}
}

// TestRegistryIndexEveryBitFlip: each single bit flipped anywhere in an
// index is refused, with an error that says why (issue 26: a version
// without a checksum parsed 169 of 300 flips into an index that dropped
// images without a word).
func TestRegistryIndexEveryBitFlip(t *testing.T) {
	good, err := Encode(sampleIndex())
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]int{}
	for bit := 0; bit < 8*len(good); bit++ {
		data := append([]byte{}, good...)
		data[bit/8] ^= 1 << (bit % 8)
		_, err := Decode(data)
		switch {
		case err == nil:
			t.Fatalf("bit %d of byte %d flipped: decoded without an error", bit%8, bit/8)
		case errors.Is(err, ErrDamaged):
			reasons["damaged"]++
		case errors.Is(err, ErrVersion):
			reasons["version"]++
		case strings.Contains(err.Error(), "no magic line"):
			reasons["magic"]++
		default:
			t.Errorf("bit %d of byte %d flipped: %v, want damaged, another version or no magic line", bit%8, bit/8, err)
		}
	}
	// The magic line's bits, the version's byte, everything after.
	magic := 8 * len(magicLine)
	if want := map[string]int{"magic": magic, "version": 8, "damaged": 8*len(good) - magic - 8}; !reflect.DeepEqual(reasons, want) {
		t.Errorf("flips refused as %v, want %v", reasons, want)
	}
}

// FuzzRegistryIndex: any bytes decode to an index or an error; an index
// decoded encodes again and decodes to the same index. Each input is also
// sealed with a matching checksum, so the parser behind it is fuzzed too.
func FuzzRegistryIndex(f *testing.F) {
	good, err := Encode(sampleIndex())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[len(magicLine)+1+4:]) // the payload, sealed by the target
	f.Add([]byte(magicLine))
	f.Fuzz(func(t *testing.T, data []byte) {
		roundTrip(t, data)
		roundTrip(t, seal(Version, data))
	})
}

// roundTrip: data decodes to an index or an error; an index encodes again
// and decodes to the same index.
func roundTrip(t *testing.T, data []byte) {
	ix, err := Decode(data)
	if err != nil {
		return
	}
	b, err := Encode(ix)
	if err != nil {
		t.Fatalf("decoded index does not encode: %v", err)
	}
	again, err := Decode(b)
	if err != nil {
		t.Fatalf("re-encoded index does not decode: %v", err)
	}
	if !reflect.DeepEqual(again, ix) {
		t.Fatalf("round trip changed the index:\n%+v\n%+v", ix, again)
	}
}
