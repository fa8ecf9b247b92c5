package registry

import (
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-appliance/kiln/systemd/contract/regindex"
)

// indexMode is one way the registry learns a layout at start.
type indexMode struct {
	name     string
	prepare  func(t testing.TB, dir string)
	prebuilt int // Stats().Prebuilt expected for one layout
}

var indexModes = []indexMode{
	{"indexed at start", func(testing.TB, string) {}, 0},
	{"prebuilt index", writePrebuilt, 1},
}

// writePrebuilt writes the factory's index into the layout dir, with the
// code builder/stage.WriteRegistryIndex runs (regindex.Build).
func writePrebuilt(t testing.TB, dir string) {
	t.Helper()
	log, _ := testLogger()
	ix, err := regindex.Build(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	b, err := regindex.Encode(ix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, regindex.FileName), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// resolvedBlobs is every blob ix serves, with its file's path as a request
// gets it (a prebuilt index stores its directory only).
func resolvedBlobs(ix *index) map[string]blobFile {
	m := map[string]blobFile{}
	for d := range ix.blobs {
		m[d], _ = ix.blob(d)
	}
	return m
}

// TestPrebuiltIndexMatchesLayout: a server started from the prebuilt index
// knows exactly what one that indexed the layout at start knows, and has
// read no manifest yet.
func TestPrebuiltIndexMatchesLayout(t *testing.T) {
	f := newFixture(t)
	log, _ := testLogger()
	full := must(New([]string{f.dir}, WithLogger(log)))
	writePrebuilt(t, f.dir)
	pre := must(New([]string{f.dir}, WithLogger(log)))
	if st := pre.Stats(); st.Prebuilt != 1 || st.Damaged != 0 {
		t.Errorf("prebuilt start: %+v", st)
	}
	fs, ps := full.Stats(), pre.Stats()
	ps.Prebuilt = 0
	if fs != ps {
		t.Errorf("stats: indexed at start %+v, prebuilt %+v", fs, ps)
	}
	for _, s := range []*Server{full, pre} {
		for _, r := range s.ix.repos {
			s.ix.members(r) // worked out on request: compared once worked out
		}
	}
	if !reflect.DeepEqual(full.ix.repos, pre.ix.repos) || !reflect.DeepEqual(full.ix.repoList, pre.ix.repoList) {
		t.Errorf("repositories differ")
	}
	if fb, pb := resolvedBlobs(full.ix), resolvedBlobs(pre.ix); !reflect.DeepEqual(fb, pb) {
		t.Errorf("blobs differ:\n%v\n%v", fb, pb)
	}
	if !reflect.DeepEqual(full.ix.referrers, pre.ix.referrers) {
		t.Errorf("referrers differ:\n%v\n%v", full.ix.referrers, pre.ix.referrers)
	}
	for d, fm := range full.ix.manifests {
		pm := pre.ix.manifests[d]
		if pm == nil {
			t.Errorf("manifest %s missing from the prebuilt start", d)
			continue
		}
		if pm.Data != nil {
			t.Errorf("manifest %s read at start", d)
		}
		data, err := pre.ix.bytes(pm)
		if err != nil || string(data) != string(fm.Data) {
			t.Errorf("manifest %s read on request: %v", d, err)
		}
		if pm.MediaType != fm.MediaType || pm.Size != fm.Size || pm.ArtifactType != fm.ArtifactType || pm.Subject != fm.Subject ||
			!reflect.DeepEqual(pm.Annotations, fm.Annotations) || !reflect.DeepEqual(pm.Children, fm.Children) || !reflect.DeepEqual(pm.Blobs, fm.Blobs) {
			t.Errorf("manifest %s differs", d)
		}
	}
	if len(full.ix.manifests) != len(pre.ix.manifests) {
		t.Errorf("%d manifests indexed at start, %d prebuilt", len(full.ix.manifests), len(pre.ix.manifests))
	}
}

// TestPrebuiltDamagedManifest: under a valid prebuilt index a manifest file
// that does not give the indexed bytes is found on its first request and
// answered as a damaged blob is (500, logged), every time; the rest of the
// partition is served.
func TestPrebuiltDamagedManifest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(path string)
	}{
		{"one byte flipped", func(p string) {
			b := must(os.ReadFile(p))
			b[len(b)-2] ^= 1
			os.WriteFile(p, b, 0o644)
		}},
		{"one byte longer", func(p string) { appendTo(p, " ") }},
		{"one byte shorter", func(p string) { os.Truncate(p, must(os.Stat(p)).Size()-1) }},
		{"missing", func(p string) { os.Remove(p) }},
		{"a FIFO", func(p string) { os.Remove(p); syscall.Mkfifo(p, 0o644) }},
		{"a symlink to the same bytes", func(p string) {
			os.Rename(p, p+".real")
			os.Symlink(p+".real", p)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			writePrebuilt(t, f.dir)
			path := f.blobPath(f.appDigest)
			tc.damage(path)
			log, logs := testLogger()
			s, err := New([]string{f.dir}, WithLogger(log))
			if err != nil {
				t.Fatalf("New with a damaged manifest under a prebuilt index: %v (the start reads no manifest)", err)
			}
			base := "http://" + serve(t, s) + "/v2/"
			for _, u := range []string{"quay.io/acme/app/manifests/1.2", "quay.io/acme/app/manifests/" + f.appDigest.String()} {
				for _, method := range []string{"HEAD", "GET", "GET"} {
					resp, body := get(t, method, base+u, nil)
					if resp.StatusCode != http.StatusInternalServerError {
						t.Errorf("%s %s: status %d, want 500", method, u, resp.StatusCode)
					}
					if method == "GET" && (apiErrorCode(body) != codeUnknown || !strings.Contains(string(body), "kiln verify")) {
						t.Errorf("%s %s: body %s, want an UNKNOWN error telling to run kiln verify", method, u, body)
					}
				}
			}
			if n := strings.Count(logs.String(), "blob file damaged"); n < 6 || !strings.Contains(logs.String(), path) {
				t.Errorf("%d damage log lines naming the file, want 6:\n%s", n, logs)
			}
			for _, u := range []string{"docker.io/library/busybox/manifests/1.36", "quay.io/acme/multi/manifests/1.0", "quay.io/acme/pinned/manifests/" + f.pinnedDigest.String()} {
				if resp, _ := get(t, "GET", base+u, nil); resp.StatusCode != 200 {
					t.Errorf("undamaged %s: status %d, want 200", u, resp.StatusCode)
				}
			}
		})
	}
}

// TestPrebuiltFallback: without a prebuilt index this kiln can use, the
// layout is indexed at start (same content served), with a log line saying
// why when there was a file.
func TestPrebuiltFallback(t *testing.T) {
	edit := func(change func(ix *regindex.Index)) func(t testing.TB, dir string) {
		return func(t testing.TB, dir string) {
			writePrebuilt(t, dir)
			p := filepath.Join(dir, regindex.FileName)
			ix := must(regindex.Decode(must(os.ReadFile(p))))
			change(ix)
			os.WriteFile(p, must(regindex.Encode(ix)), 0o644)
		}
	}
	for _, tc := range []struct {
		name    string
		prepare func(t testing.TB, dir string)
		log     string // in the log; "" for none
	}{
		{"no index (older partition, plain layout)", func(testing.TB, string) {}, ""},
		{"unknown version", edit(func(ix *regindex.Index) { ix.SchemaVersion = 99 }), "schema version 99"},
		{"schema 1 (JSON)", func(t testing.TB, dir string) {
			os.WriteFile(filepath.Join(dir, regindex.FileName), []byte("{\"schemaVersion\":1}\n"), 0o644)
		}, "not a kiln registry index"},
		{"truncated", func(t testing.TB, dir string) {
			writePrebuilt(t, dir)
			p := filepath.Join(dir, regindex.FileName)
			b := must(os.ReadFile(p))
			os.WriteFile(p, b[:len(b)-1], 0o644)
		}, "prebuilt registry index damaged"},
		{"trailing bytes", func(t testing.TB, dir string) {
			writePrebuilt(t, dir)
			p := filepath.Join(dir, regindex.FileName)
			os.WriteFile(p, append(must(os.ReadFile(p)), 0), 0o644)
		}, "does not match its contents"},
		{"a bit flipped", func(t testing.TB, dir string) {
			writePrebuilt(t, dir)
			p := filepath.Join(dir, regindex.FileName)
			b := must(os.ReadFile(p))
			b[len(b)-20] ^= 4
			os.WriteFile(p, b, 0o644)
		}, "does not match its contents"},
		{"a symlink", func(t testing.TB, dir string) {
			writePrebuilt(t, dir)
			p := filepath.Join(dir, regindex.FileName)
			os.Rename(p, p+".real")
			os.Symlink(p+".real", p)
		}, "not a regular file"},
		{"names a tag whose manifest it does not hold", edit(func(ix *regindex.Index) {
			ix.Images = append(ix.Images, regindex.IndexedImage{Repository: "quay.io/acme/ghost", Tag: "1", Manifest: len(ix.Manifests)})
		}), "names manifest"},
		{"a manifest references a blob it does not hold", edit(func(ix *regindex.Index) {
			ix.Manifests[0].Layers = append(ix.Manifests[0].Layers, ix.BlobCount())
		}), "which the index does not hold"},
		{"an index references a manifest it does not hold", edit(func(ix *regindex.Index) {
			ix.Manifests[0].Children = []int{len(ix.Manifests)}
		}), "which the index does not hold"},
		{"a subject that is not a digest", edit(func(ix *regindex.Index) {
			ix.Manifests[0].Subject = "sha256:../../etc/passwd"
		}), "out of bounds"},
		{"a media type out of bounds", edit(func(ix *regindex.Index) {
			ix.Manifests[1].MediaType = len(ix.MediaTypes)
		}), "out of bounds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.prepare(t, f.dir)
			log, logs := testLogger()
			s := must(New([]string{f.dir}, WithLogger(log)))
			if st := s.Stats(); st.Prebuilt != 0 || st.Repositories != 4 {
				t.Errorf("stats %+v, want the layout indexed at start (4 repositories, none prebuilt)", st)
			}
			if tc.log != "" && !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log does not say %q:\n%s", tc.log, logs)
			}
			if tc.log == "" && strings.Contains(logs.String(), "prebuilt") {
				t.Errorf("log mentions a prebuilt index that is simply absent:\n%s", logs)
			}
			if _, ok := s.ix.repos["quay.io/acme/ghost"]; ok {
				t.Error("a repository named only by a rejected index is served")
			}
			base := "http://" + serve(t, s) + "/v2/"
			if resp, _ := get(t, "GET", base+"quay.io/acme/app/manifests/1.2", nil); resp.StatusCode != 200 {
				t.Errorf("app:1.2 after falling back: status %d", resp.StatusCode)
			}
		})
	}
}

// TestPrebuiltMissingRepoFile: an index naming a repo:tag whose manifest
// file is not on the partition serves the name (the index says so) and
// answers its manifest as damaged, never as content.
func TestPrebuiltMissingRepoFile(t *testing.T) {
	f := newFixture(t)
	writePrebuilt(t, f.dir)
	os.Remove(f.blobPath(f.pinnedDigest))
	log, logs := testLogger()
	base := "http://" + serve(t, must(New([]string{f.dir}, WithLogger(log)))) + "/v2/"
	if resp, _ := get(t, "GET", base+"quay.io/acme/pinned/manifests/"+f.pinnedDigest.String(), nil); resp.StatusCode != 500 {
		t.Errorf("manifest file missing: status %d, want 500", resp.StatusCode)
	}
	if !strings.Contains(logs.String(), f.blobPath(f.pinnedDigest)) {
		t.Errorf("missing manifest file not logged:\n%s", logs)
	}
}

// TestPrebuiltEveryBitFlip: the factory's index of a real layout with any
// single bit flipped is refused, the start says so in one line and indexes
// the layout itself (issue 26: 169 of 300 flips used to serve fewer
// images without a word). Every bit goes through loadPrebuilt; a sample of
// them through a whole start that then serves the same as the layout.
func TestPrebuiltEveryBitFlip(t *testing.T) {
	f := newFixture(t)
	writePrebuilt(t, f.dir)
	p := filepath.Join(f.dir, regindex.FileName)
	good := must(os.ReadFile(p))
	log, _ := testLogger()
	want := must(New([]string{f.dir}, WithLogger(log))).Stats()
	want.Prebuilt = 0
	// Each bit flipped in place and back (rewriting the file each time would
	// wait on ext4's flush of a truncated file).
	wf := must(os.OpenFile(p, os.O_WRONLY, 0))
	defer wf.Close()
	for bit := 0; bit < 8*len(good); bit++ {
		if _, err := wf.WriteAt([]byte{good[bit/8] ^ 1<<(bit%8)}, int64(bit/8)); err != nil {
			t.Fatal(err)
		}
		log, logs := testLogger()
		l := newLoader(log)
		if l.loadPrebuilt(f.dir) {
			t.Fatalf("bit %d of byte %d flipped: the index was used", bit%8, bit/8)
		}
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], "prebuilt registry index") || !strings.Contains(lines[0], p) {
			t.Fatalf("bit %d of byte %d flipped: want one line naming the index, got:\n%s", bit%8, bit/8, logs)
		}
		if bit%97 == 0 {
			s := must(New([]string{f.dir}, WithLogger(log)))
			if got := s.Stats(); got != want {
				t.Errorf("bit %d of byte %d flipped: serving %+v, want the layout's %+v", bit%8, bit/8, got, want)
			}
		}
		if _, err := wf.WriteAt(good[bit/8:bit/8+1], int64(bit/8)); err != nil {
			t.Fatal(err)
		}
	}
}
