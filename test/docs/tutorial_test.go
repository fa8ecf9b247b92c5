package docs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The tutorial's conventions (stated on its first page): ```sh blocks run in
// order in one shell, starting in the clone; the first ```text block after
// one (before the next) is what it prints; `…` stands for any text, and a
// line of only `…` for lines left out. A block below a "<!-- not run" comment
// is illustrative and skipped.
const tutorial = "../../docs/tutorial.md"

// step is one ```sh block and the output lines the tutorial shows for it.
type step struct {
	line int // of the opening fence, for messages
	code string
	want []string
}

type fence struct {
	line   int
	info   string
	body   []string
	notRun bool
}

// fences reads the fenced blocks of a Markdown file.
func fences(md string) ([]fence, error) {
	var out []fence
	var cur *fence
	prev := "" // the last non-blank line outside a block
	for i, l := range strings.Split(md, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &fence{line: i + 1, info: strings.TrimSpace(strings.TrimPrefix(l, "```")),
				notRun: strings.HasPrefix(prev, "<!-- not run")}
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, *cur)
			cur, prev = nil, ""
		case cur != nil:
			cur.body = append(cur.body, l)
		case strings.TrimSpace(l) != "":
			prev = strings.TrimSpace(l)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: block never closed", cur.line)
	}
	return out, nil
}

// steps pairs each run block with its output block. Output that no run block
// owns is an error: it would look checked and not be.
func steps(md string) ([]step, error) {
	fs, err := fences(md)
	if err != nil {
		return nil, err
	}
	var out []step
	owner := -1 // the step the next text block belongs to, or -1
	for _, f := range fs {
		switch f.info {
		case "sh":
			owner = -1
			if !f.notRun {
				out = append(out, step{line: f.line, code: strings.Join(f.body, "\n")})
				owner = len(out) - 1
			}
		case "text":
			if owner < 0 {
				return nil, fmt.Errorf("line %d: output block follows no run sh block (or a second one for the same block)", f.line)
			}
			out[owner].want = f.body
			owner = -1
		}
	}
	return out, nil
}

// lineMatcher turns a shown output line into a pattern for a whole actual
// line: `…` is any text, a run of spaces any run of spaces (tables keep their
// alignment on the page when a column is abridged).
func lineMatcher(shown string) *regexp.Regexp {
	parts := strings.Split(shown, "…")
	for i, p := range parts {
		parts[i] = spaces.ReplaceAllString(regexp.QuoteMeta(p), " +")
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$")
}

var spaces = regexp.MustCompile(` +`)

// missing returns the first shown line that the actual output lacks, with
// the shown lines in order; "" when all are there.
func missing(shown []string, actual string) string {
	lines := strings.Split(actual, "\n")
	at := 0
	for _, s := range shown {
		s = strings.TrimRight(s, " ")
		if s == "" || s == "…" {
			continue
		}
		re := lineMatcher(s)
		for ; at < len(lines) && !re.MatchString(strings.TrimRight(lines[at], " ")); at++ {
		}
		if at == len(lines) {
			return s
		}
		at++
	}
	return ""
}

func TestLineMatching(t *testing.T) {
	for _, c := range []struct {
		shown  []string
		actual string
		ok     bool
	}{
		{[]string{"wrote a (1 MiB)"}, "progress\nwrote a (1 MiB)\n", true},
		{[]string{"wrote a (1 MiB)"}, "wrote a (1 MiB), more\n", false},              // whole lines only
		{[]string{"wrote a (… MiB)"}, "wrote a (12.5 MiB)\n", true},                  // … is any text
		{[]string{"wrote a (… MiB)"}, "wrote b (12.5 MiB)\n", false},                 // the rest is literal
		{[]string{"x.*y"}, "xzzy\n", false},                                          // no regexp in the shown text
		{[]string{"a  sha256:…     1 MiB  yes"}, "a  sha256:0123  1 MiB  yes", true}, // spaces flexible
		{[]string{"a  sha256:…     1 MiB  yes"}, "a  sha256:0123  1 MiB  no", false},
		{[]string{"one", "…", "two"}, "one\nskipped\ntwo\n", true},
		{[]string{"two", "one"}, "one\ntwo\n", false}, // in order
		{[]string{"one", ""}, "one\n", true},
	} {
		if got := missing(c.shown, c.actual) == ""; got != c.ok {
			t.Errorf("shown %q in %q: match %v, want %v", c.shown, c.actual, got, c.ok)
		}
	}
}

func TestStepsRefuseUnownedOutput(t *testing.T) {
	for _, md := range []string{
		"```text\nx\n```\n",
		"<!-- not run -->\n```sh\nfalse\n```\n```text\nx\n```\n",
		"```sh\ntrue\n```\n```text\nx\n```\n```text\ny\n```\n",
	} {
		if _, err := steps(md); err == nil {
			t.Errorf("%q: no error for output no run block owns", md)
		}
	}
}

// TestTutorial runs docs/tutorial.md with a kiln built from this tree. It
// needs what make test's deps install (skopeo, mksquashfs, …) and root, as
// the cmd/kiln tests do.
func TestTutorial(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole tutorial")
	}
	md, err := os.ReadFile(tutorial)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := steps(string(md))
	if err != nil {
		t.Fatalf("%s: %v", tutorial, err)
	}
	if len(ss) < 10 {
		t.Fatalf("%s: %d run blocks: the conventions changed?", tutorial, len(ss))
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := buildKiln(t, root)
	home := t.TempDir()

	// One script, one shell: a marker line before each block says whose
	// output follows.
	marker := fmt.Sprintf("==== docs-test step %d ====", time.Now().UnixNano())
	var script strings.Builder
	script.WriteString("exec 2>&1\nset -euo pipefail\n")
	for i, s := range ss {
		fmt.Fprintf(&script, "echo '%s %d'\n%s\n", marker, i, s.code)
	}
	fmt.Fprintf(&script, "echo '%s end'\n", marker)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = root
	cmd.Env = tutorialEnv(t, bin, home)
	out, runErr := cmd.CombinedOutput()

	outputs := map[int]string{}
	last := -1
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	var cur strings.Builder
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, marker+" "); ok {
			if last >= 0 {
				outputs[last] = cur.String()
			}
			cur.Reset()
			last = -2 // "end"
			fmt.Sscan(rest, &last)
			continue
		}
		cur.WriteString(l + "\n")
	}
	if last >= 0 {
		outputs[last] = cur.String()
	}
	if runErr != nil {
		if last >= 0 {
			t.Fatalf("%s:%d: the block failed (%v):\n%s\n--- its output:\n%s", tutorial, ss[last].line, runErr, ss[last].code, outputs[last])
		}
		t.Fatalf("the tutorial's script failed (%v):\n%s", runErr, out)
	}
	for i, s := range ss {
		if m := missing(s.want, outputs[i]); m != "" {
			t.Errorf("%s:%d: the output lacks (in order)\n  %s\n--- the block:\n%s\n--- its output:\n%s", tutorial, s.line, m, s.code, outputs[i])
		}
	}
}

// buildKiln builds kiln and kiln-agent side by side, as make build does
// (kiln takes the agent beside it; the agent stripped), stamped so that they
// say which commit.
func buildKiln(t *testing.T, root string) string {
	t.Helper()
	bin := t.TempDir()
	commit := "unknown"
	if c, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(c))
	}
	const tags = "containers_image_openpgp,exclude_graphdriver_btrfs"
	ldflags := "-X github.com/kiln-appliance/kiln/internal/version.version=docs-test -X github.com/kiln-appliance/kiln/internal/version.commit=" + commit
	for _, b := range []struct{ name, tags, ldflags string }{
		{"kiln", tags, ldflags},
		{"kiln-agent", tags + ",nodeonly", "-s -w " + ldflags}, // stripped, as on the image partition
	} {
		build := exec.Command("go", "build", "-tags", b.tags, "-trimpath", "-ldflags", b.ldflags, "-o", filepath.Join(bin, b.name), "./cmd/kiln")
		build.Dir = root
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.name, err, out)
		}
	}
	return bin
}

// tutorialEnv is the reader's shell: kiln on the PATH, a home of its own
// (the tutorial works in ~/first-appliance, kiln caches in ~/.cache/kiln),
// but Go's caches and settings where they were, so go run does not rebuild
// the world.
func tutorialEnv(t *testing.T, bin, home string) []string {
	t.Helper()
	keep := map[string]bool{}
	var env []string
	for _, v := range []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOENV"} {
		out, err := exec.Command("go", "env", v).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", v, err)
		}
		env = append(env, v+"="+strings.TrimSpace(string(out)))
		keep[v] = true
	}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case keep[k], k == "HOME", k == "XDG_CACHE_HOME", k == "XDG_CONFIG_HOME":
		case k == "PATH":
			env = append(env, "PATH="+bin+string(os.PathListSeparator)+v)
		default:
			env = append(env, kv)
		}
	}
	return append(env, "HOME="+home)
}
