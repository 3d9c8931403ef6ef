// Package cmdutil holds what every Tabby command's main does the same way:
// run under a context that SIGINT and SIGTERM cancel, print the error and
// exit; take a flag's value from the environment unless the command line
// gives it; split comma-separated lists; build the slog logger of
// --log-level.
package cmdutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
)

// ExitCoder is an error that carries its own exit status; Main exits with
// it and prints nothing (the command already said why).
type ExitCoder interface {
	error
	ExitCode() int
}

// Main runs run under a context cancelled by SIGINT or SIGTERM. On error
// it prints "name: err" to stderr and exits 1 (or the ExitCoder's status).
func Main(name string, run func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err == nil {
		return
	}
	if code, ok := silentExit(err); ok {
		os.Exit(code)
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	os.Exit(1)
}

// silentExit is the status of an error that is an ExitCoder of the
// command's own. A child process's *exec.ExitError also has an ExitCode
// method, but an error wrapping one (a helper command that failed) must
// be printed: exiting silently with the child's status hid why, e.g. an
// interrupted `ip` under tabby-lab.
func silentExit(err error) (int, bool) {
	var ec ExitCoder
	if !errors.As(err, &ec) {
		return 0, false
	}
	if _, child := ec.(*exec.ExitError); child {
		return 0, false
	}
	return ec.ExitCode(), true
}

// SplitList splits a comma-separated list, dropping spaces and empty items
// ("a,,b," is [a b]).
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// List is a comma-separated list flag (with FlagSet.TextVar): each value
// replaces the list, split with SplitList.
type List []string

// MarshalText implements encoding.TextMarshaler.
func (l List) MarshalText() ([]byte, error) { return []byte(strings.Join(l, ",")), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (l *List) UnmarshalText(b []byte) error {
	*l = SplitList(string(b))
	return nil
}

// LogLevel registers --log-level on fs, defaulting to info, and returns
// where it is stored.
func LogLevel(fs *pflag.FlagSet, usage string) *slog.Level {
	lvl := new(slog.Level)
	fs.TextVar(lvl, "log-level", slog.LevelInfo, usage)
	return lvl
}

// NewLogger is the commands' logger: text on w at lvl.
func NewLogger(w io.Writer, lvl slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
}

// Env sets flags from environment variables, the way every command reads
// its environment: a variable that is set and not empty gives its flag's
// value unless the command line gives the flag.
type Env struct {
	// Getenv reads a variable; nil is os.Getenv.
	Getenv func(string) string
	errs   map[string]error
}

// Apply sets each flag of fs named in vars (flag name → variable) from its
// variable. Call it after defining the flags and before parsing, so that
// the command line overrides and the help shows the environment's value.
// A bad value is remembered for Err.
func (e *Env) Apply(fs *pflag.FlagSet, vars map[string]string) {
	getenv := e.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if e.errs == nil {
		e.errs = map[string]error{}
	}
	for flag, name := range vars {
		v := getenv(name)
		if v == "" {
			continue
		}
		f := fs.Lookup(flag)
		if f == nil {
			panic("cmdutil: no flag --" + flag)
		}
		if err := f.Value.Set(v); err != nil {
			e.errs[flag] = fmt.Errorf("%s=%q: %w", name, v, err)
			// Some values (durations, addresses) are zeroed by a failed
			// Set: keep the default.
			_ = f.Value.Set(f.DefValue)
			continue
		}
		f.DefValue = f.Value.String()
	}
}

// Err reports every variable with a bad value whose flag the command line
// did not give, after parsing.
func (e *Env) Err(fs *pflag.FlagSet) error {
	var errs []error
	for _, flag := range slices.Sorted(maps.Keys(e.errs)) {
		if f := fs.Lookup(flag); f != nil && !f.Changed {
			errs = append(errs, e.errs[flag])
		}
	}
	return errors.Join(errs...)
}
