package main

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/spf13/cobra"
)

// Every command's --help shows how it is called and says what it does in
// one line that fits a terminal.
func TestEveryCommandHasAnExampleAndAShortSummary(t *testing.T) {
	var walk func(*cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		n++
		path := c.CommandPath()
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s: no Example", path)
		}
		for _, line := range strings.Split(c.Example, "\n") {
			if !strings.HasPrefix(line, "  kiln ") {
				t.Errorf("%s: example line %q does not start with \"  kiln \"", path, line)
			}
		}
		switch l := utf8.RuneCountInString(c.Short); {
		case l == 0:
			t.Errorf("%s: no Short", path)
		case l >= 80:
			t.Errorf("%s: Short is %d characters, want under 80: %q", path, l, c.Short)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCommand())
	if n < 25 { // kiln, its commands, agent's and release's
		t.Errorf("walked %d commands: the tree is not the one kiln runs", n)
	}
}

// kiln agent is the node's: the factory's help leaves it out, the node
// edition's lists it, and both run it.
func TestAgentIsHiddenFromTheFactoryHelp(t *testing.T) {
	f := &fixture{cache: t.TempDir()}
	out := mustKiln(t, f, "--help")
	if strings.Contains(out, "\n  agent ") {
		t.Errorf("kiln --help lists agent:\n%s", out)
	}
	for _, want := range []string{"\n  build ", "\n  serve ", "Examples:\n  kiln lock appliance.yaml"} {
		if !strings.Contains(out, want) {
			t.Errorf("kiln --help lacks %q:\n%s", want, out)
		}
	}
	if out := mustKiln(t, f, "agent", "release", "--help"); !strings.Contains(out, "confirm") {
		t.Errorf("kiln agent release --help:\n%s", out)
	}
	node := strings.TrimSuffix(kilnBin, "kiln") + "kiln-agent"
	out = run(t, node, "--help")
	if !strings.Contains(out, "\n  agent ") || strings.Contains(out, "kiln build") {
		t.Errorf("kiln-agent --help does not list agent, or shows the factory's examples:\n%s", out)
	}
}

// Exit codes as the README promises: 2 for every way of calling kiln
// wrongly, with a message that says how to call it.
func TestUsageErrorsExit2(t *testing.T) {
	f := &fixture{cache: t.TempDir()}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"nosuch"}, `unknown command "nosuch" for "kiln"`},
		{[]string{"biuld", "x.yaml"}, `did you mean 'kiln build'?`},
		{[]string{"key", "nosuch"}, `unknown command "nosuch" for "kiln key"`},
		{[]string{"agent", "release", "nosuch"}, `unknown command "nosuch" for "kiln agent release"`},
		{[]string{"key", "generate"}, "(usage: kiln key generate NAME)"},
		{[]string{"build"}, "(usage: kiln build RECIPE -o DISK)"},
		{[]string{"build", "appliance.yaml"}, `required flag(s) "output" not set (usage: kiln build RECIPE -o DISK)`},
		{[]string{"inspect", "--nosuch", "disk.raw"}, "unknown flag: --nosuch"},
		{[]string{"inspect", "--format", "yaml", "disk.raw"}, `--format "yaml": want text or json`},
		{[]string{"agent", "reflash", "a", "b"}, "(usage: kiln agent reflash [PAYLOAD])"},
	} {
		out, code := kiln(t, f, tt.args...)
		if code != exitUsage || !strings.Contains(out, tt.want) {
			t.Errorf("kiln %s: exit %d, want %d and %q:\n%s", strings.Join(tt.args, " "), code, exitUsage, tt.want, out)
		}
	}
	// A group alone shows its help; that is no error.
	if out := mustKiln(t, f, "key"); !strings.Contains(out, "generate") {
		t.Errorf("kiln key:\n%s", out)
	}
}
