package testreport

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Main is the command testreport: it returns the exit code (1 when a tier
// failed or on a usage error).
func Main(args []string, stdin io.Reader, stdout io.Writer) (int, error) {
	if len(args) < 1 {
		return 2, errors.New("usage: testreport run TIER RECORD | skip TIER RECORD REASON… | summary RECORD…")
	}
	switch args[0] {
	case "run":
		if len(args) != 3 {
			return 2, errors.New("usage: testreport run TIER RECORD")
		}
		t, err := Read(args[1], stdin, stdout)
		if werr := save(args[2], t); werr != nil {
			err = errors.Join(err, werr)
		}
		if err != nil || !t.OK() {
			return 1, err
		}
		return 0, nil
	case "skip":
		if len(args) < 4 {
			return 2, errors.New("usage: testreport skip TIER RECORD REASON…")
		}
		t := &Tier{Name: args[1], Reason: strings.Join(args[3:], " ")}
		fmt.Fprintf(stdout, "%s tier skipped: %s\n", t.Name, t.Reason)
		if err := save(args[2], t); err != nil {
			return 1, err
		}
		return 0, nil
	case "summary":
		var tiers []*Tier
		for _, p := range args[1:] {
			b, err := os.ReadFile(p)
			if err != nil {
				return 1, err
			}
			var t Tier
			if err := json.Unmarshal(b, &t); err != nil {
				return 1, fmt.Errorf("%s: %w", p, err)
			}
			tiers = append(tiers, &t)
		}
		WriteSummary(stdout, tiers)
		for _, t := range tiers {
			if !t.OK() {
				return 1, nil
			}
		}
		return 0, nil
	}
	return 2, fmt.Errorf("unknown command %q", args[0])
}

func save(path string, t *Tier) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
