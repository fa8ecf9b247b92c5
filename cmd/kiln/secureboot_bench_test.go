//go:build !nodeonly

package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kiln-appliance/kiln/test/fixtures/basedisk"
	"github.com/kiln-appliance/kiln/test/fixtures/images"
	"github.com/kiln-appliance/kiln/test/paired"
)

// Sizes of the benchmark's A/B base, near the e2e A/B base's (Debian 12):
// its /usr squashfs is ~173 MiB in slots of ~1.5 times that, its kernel and
// initramfs ~40 MiB on a 128 MiB ESP. Each of the base's two entries (the
// release's and the first boot's) becomes a UKI holding both, so the ESP
// must hold 80 MiB of them: the fixture's default 64 MiB does not.
const (
	benchUsr    = 173 << 20
	benchSlot   = 256 << 20
	benchKernel = 8 << 20
	benchInitrd = 32 << 20
	benchESP    = 128 << 20
)

// BenchmarkBuildSecureBoot prices signing: the same appliance built on the
// same real-sized A/B base (sbBase with benchOS) with the recipe's
// secureBoot and --secure-boot-key (a signed UKI per entry, systemd-boot
// signed, the keys and loader.conf on the ESP) and without, the two builds
// alternated in pairs (test/paired), one pair per iteration: the ratio is
// sb/plain (time), median and range over b.N pairs, with each side's
// median time. Both build from a warm cache (one untimed build of each
// first). KILN_BENCH_SIZES (MiB of images, comma-separated) overrides the
// appliance's 256 MiB of images; KILN_BENCH_KEEP=1 keeps the fixture.
//
//	go test -tags … -run '^$' -bench BenchmarkBuildSecureBoot -benchtime 3x ./cmd/kiln
func BenchmarkBuildSecureBoot(b *testing.B) {
	d := newBenchDir(b, "kiln-bench-sb-")
	sbBase(b, d.path("base.raw"),
		basedisk.WithPartitions(withESP(benchESP)),
		basedisk.WithABSlotsOS(benchSlot, benchSlot, benchOS()))
	keys := d.path("sb-keys")
	d.kiln(b, []string{"key", "secureboot", keys})
	dbKey := filepath.Join(keys, "db.key")
	for _, mib := range benchSizes(b, 256) {
		layout := fmt.Sprintf("oci-%d", mib)
		imgs, err := images.RandomImages(d.path(layout), 8, mib<<20, 0.3, 1)
		if err != nil {
			b.Fatal(err)
		}
		var list []benchImage
		for _, img := range imgs {
			list = append(list, benchImage{img.Ref, layout, img.Ref})
		}
		plain := d.recipe(b, "1.0.0", list)
		text, err := os.ReadFile(plain)
		if err != nil {
			b.Fatal(err)
		}
		sb := d.path("secureboot/bench.yaml") // a sibling: the same relative paths
		if err := os.MkdirAll(filepath.Dir(sb), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(sb, append(text, "secureBoot:\n  keys: ../sb-keys\n"...), 0o644); err != nil {
			b.Fatal(err)
		}
		disk := d.path("disk.raw")
		// Untimed: the locks and a first build of each (the cache warm for
		// both), the Secure Boot one last so that its disk is checked.
		d.kiln(b, []string{"lock", plain}, []string{"lock", sb},
			[]string{"build", plain, "-o", disk}, []string{"build", sb, "-o", disk, "--secure-boot-key", dbKey})
		fs, _ := espOfDisk(b, disk)
		if ok, err := fs.Exists("EFI/Linux/" + basedisk.ABEntry + ".efi"); err != nil || !ok {
			b.Fatalf("the Secure Boot build wrote no UKI (%v): the benchmark would price nothing", err)
		}
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			build := func(args ...string) func() time.Duration {
				return func() time.Duration {
					os.Remove(disk) // before the clock, as BenchmarkBuild does
					return timed(b, d.env, kilnBin, append([]string{"build"}, args...)...)
				}
			}
			r := paired.Compare(b, b.N, build(plain, "-o", disk), build(sb, "-o", disk, "--secure-boot-key", dbKey))
			tPlain, tSB := paired.MedianDuration(r.Baseline), paired.MedianDuration(r.Candidate)
			paired.Report(b, "sb/plain", r)
			b.ReportMetric(tPlain.Seconds(), "plain-s")
			b.ReportMetric(tSB.Seconds(), "sb-s")
			b.Logf("%d MiB of images on a base of /usr %d MiB, kernel+initramfs %d MiB: plain %.2fs, secure boot %.2fs (medians); sb/plain %s; load average %s",
				mib, benchUsr>>20, (benchKernel+benchInitrd)>>20, tPlain.Seconds(), tSB.Seconds(), r, paired.LoadAverage())
		})
	}
}

// withESP is basedisk.Default with an ESP of size bytes.
func withESP(size int64) []basedisk.Partition {
	ps := slices.Clone(basedisk.Default)
	for i := range ps {
		if ps[i].Name == "EFI-SYSTEM" {
			ps[i].Size = size
		}
	}
	return ps
}

// benchOS is OS 1.0 at the e2e base's sizes, of random bytes: /usr as
// 4 MiB libraries (incompressible, so the squashfs is as large), the
// kernel and the initramfs.
func benchOS() basedisk.OS {
	random := func(seed uint64, n int) []byte {
		b := make([]byte, n)
		rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
		return b
	}
	usr := map[string][]byte{"lib/os-release": []byte("ID=acme\nVERSION_ID=1.0\n")}
	for i := 0; i*4<<20 < benchUsr; i++ {
		usr[fmt.Sprintf("lib/lib%02d.so", i)] = random(uint64(i+1), min(4<<20, benchUsr-i*4<<20))
	}
	return basedisk.OS{
		Version: "1.0",
		Usr:     usr,
		Kernel:  random(100, benchKernel),
		Initrd:  random(101, benchInitrd),
	}
}
