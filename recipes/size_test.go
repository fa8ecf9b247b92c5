package recipes

import (
	"math"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestParseSize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want Size
	}{
		{"auto", Size{Auto: true}},
		{"fit", Size{Auto: true}},
		{"1", Size{Bytes: 1}},
		{"1048576", Size{Bytes: 1 << 20}},
		{"512B", Size{Bytes: 512}},
		{"4K", Size{Bytes: 4096}},
		{"4KiB", Size{Bytes: 4096}},
		{"4KB", Size{Bytes: 4000}},
		{"8M", Size{Bytes: 8 << 20}},
		{"8MB", Size{Bytes: 8e6}},
		{"16G", Size{Bytes: 16 << 30}},
		{"16GiB", Size{Bytes: 16 << 30}},
		{"16GB", Size{Bytes: 16e9}},
		{"2T", Size{Bytes: 2 << 40}},
		{"2TiB", Size{Bytes: 2 << 40}},
		{"2TB", Size{Bytes: 2e12}},
		{"512 MiB", Size{Bytes: 512 << 20}},
		{" 8GiB ", Size{Bytes: 8 << 30}},
		{"8388607TiB", Size{Bytes: 8388607 << 40}},
		{"9223372036854775807", Size{Bytes: math.MaxInt64}},
	} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	// Messages for these are pinned with positions in TestLoadErrors.
	for _, in := range []string{"", "0", "0GiB", "-1", "-1G", "1.5G", "8gib", "8PB", "8 G i B", "Auto", "big",
		"8388608TiB", "9223372036854775808", "99999999999999999999999", "0x10", "1e9", "+5G", "GiB"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %+v, want an error", in, got)
		}
	}
}

func TestSizeString(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   Size
		want string
	}{
		{Size{}, ""},
		{Size{Auto: true}, "auto"},
		{Size{Bytes: 1}, "1B"},
		{Size{Bytes: 1023}, "1023B"},
		{Size{Bytes: 1024}, "1KiB"},
		{Size{Bytes: 1000}, "1KB"},
		{Size{Bytes: 1536 << 20}, "1536MiB"},
		{Size{Bytes: 8 << 30}, "8GiB"},
		{Size{Bytes: 16e9}, "16GB"},
		{Size{Bytes: 3 << 40}, "3TiB"},
		{Size{Bytes: math.MaxInt64}, "9223372036854775807B"},
	} {
		if got := c.in.String(); got != c.want {
			t.Errorf("%+v.String() = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestSizeYAMLRoundTrip marshals sizes with yaml.v3 and reads them back,
// through both yaml.Unmarshal and Load's decoder.
func TestSizeYAMLRoundTrip(t *testing.T) {
	t.Parallel()
	for _, s := range []Size{{Auto: true}, {Bytes: 1}, {Bytes: 1000}, {Bytes: 4096}, {Bytes: 1536 << 20}, {Bytes: 16e9}, {Bytes: 5 << 40}, {Bytes: math.MaxInt64}} {
		out, err := yaml.Marshal(Disk{Size: s})
		if err != nil {
			t.Fatal(err)
		}
		var back Disk
		if err := yaml.Unmarshal(out, &back); err != nil || back.Size != s {
			t.Errorf("%+v → %q → %+v, %v", s, out, back.Size, err)
		}
		// (imagePartition.size: a disk's size must be whole sectors)
		r, err := Parse("r.yaml", []byte(head+oneImage+"imagePartition:\n  "+string(out)))
		if err != nil || r.ImagePartition.Size != s {
			t.Errorf("%+v → %q → Load %+v, %v", s, out, r, err)
		}
	}
	// Unset marshals as null, which reads back as unset.
	out, err := yaml.Marshal(Disk{})
	if err != nil || string(out) != "size: null\n" {
		t.Errorf("zero Size marshals as %q, %v", out, err)
	}
	// A plain YAML integer is bytes.
	var d Disk
	if err := yaml.Unmarshal([]byte("size: 4096\n"), &d); err != nil || d.Size != (Size{Bytes: 4096}) {
		t.Errorf("size: 4096 → %+v, %v", d.Size, err)
	}
}
