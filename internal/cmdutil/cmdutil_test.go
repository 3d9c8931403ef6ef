package cmdutil

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

type ownExit struct{ code int }

func (e *ownExit) Error() string { return "exit" }
func (e *ownExit) ExitCode() int { return e.code }

func TestSilentExit(t *testing.T) {
	child := exec.Command("false").Run()
	if child == nil {
		t.Fatal("false succeeded")
	}
	for name, tc := range map[string]struct {
		err  error
		code int
		ok   bool
	}{
		"plain":                   {errors.New("x"), 0, false},
		"own":                     {&ownExit{3}, 3, true},
		"own wrapped":             {fmt.Errorf("a: %w", &ownExit{4}), 4, true},
		"child process's wrapped": {fmt.Errorf("ip netns add: %w", child), 0, false},
	} {
		code, ok := silentExit(tc.err)
		if code != tc.code || ok != tc.ok {
			t.Errorf("%s: silentExit = %d, %v; want %d, %v", name, code, ok, tc.code, tc.ok)
		}
	}
}

func TestSplitList(t *testing.T) {
	for in, want := range map[string][]string{
		"":                  nil,
		",":                 nil,
		"http://a:2379":     {"http://a:2379"},
		" a , ,b,":          {"a", "b"},
		"http://a,http://b": {"http://a", "http://b"},
	} {
		if diff := cmp.Diff(want, SplitList(in)); diff != "" {
			t.Errorf("SplitList(%q) (-want +got):\n%s", in, diff)
		}
	}
}

// The environment gives a flag's value unless the command line does; a bad
// value is an error only when the command line does not override it, and
// every bad value is reported.
func TestEnv(t *testing.T) {
	vars := map[string]string{"X_LIST": "a,,b", "X_ADDR": "198.18.0.1/24", "X_BAD": "soon", "X_LEVEL": "debug", "X_BAD2": "nope", "X_EMPTY": ""}
	tests := []struct {
		name    string
		args    []string
		list    []string
		addr    string
		grace   time.Duration
		level   slog.Level
		empty   string
		wantErr []string
	}{
		{name: "env", list: []string{"a", "b"}, addr: "198.18.0.1/24", grace: time.Second, level: slog.LevelDebug, empty: "def",
			wantErr: []string{`X_BAD="soon"`, `X_BAD2="nope"`}},
		{name: "flags win", args: []string{"--list=c", "--addr=198.18.0.2/24", "--grace=2s", "--other=3", "--log-level=warn"},
			list: []string{"c"}, addr: "198.18.0.2/24", grace: 2 * time.Second, level: slog.LevelWarn, empty: "def"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
			var list []string
			var addr netip.Prefix
			fs.TextVar((*List)(&list), "list", List{"default"}, "")
			fs.TextVar(&addr, "addr", addr, "")
			grace := fs.Duration("grace", time.Second, "")
			other := fs.Int("other", 1, "")
			empty := fs.String("empty", "def", "")
			lvl := LogLevel(fs, "")
			e := Env{Getenv: func(k string) string { return vars[k] }}
			e.Apply(fs, map[string]string{"list": "X_LIST", "addr": "X_ADDR", "grace": "X_BAD", "other": "X_BAD2", "empty": "X_EMPTY", "log-level": "X_LEVEL"})
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got := []any{list, addr.String(), *grace, *lvl, *empty}
			want := []any{tt.list, tt.addr, tt.grace, tt.level, tt.empty}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("values (-want +got):\n%s", diff)
			}
			_ = other
			err := e.Err(fs)
			if len(tt.wantErr) == 0 && err != nil {
				t.Errorf("Err = %v, want nil", err)
			}
			for _, w := range tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Err = %v, want %q", err, w)
				}
			}
		})
	}
}
