package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"
)

// TestExecArgs runs exec's argument parsing as cobra does, with the command
// lines the README shows.
func TestExecArgs(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		wantTarget string
		wantArgv   []string
		wantErr    bool
	}{
		{"dash dash", []string{"node1", "--", "ip", "route"}, "node1", []string{"ip", "route"}, false},
		{"no dash dash", []string{"node1", "ip", "route"}, "node1", []string{"ip", "route"}, false},
		{"command flags stay", []string{"n1p1", "--", "ping", "-c", "1", "10.244.0.1"}, "n1p1", []string{"ping", "-c", "1", "10.244.0.1"}, false},
		{"second dash dash is the command's", []string{"tor", "--", "sh", "-c", "echo --", "--"}, "tor", []string{"sh", "-c", "echo --", "--"}, false},
		{"no command", []string{"node1", "--"}, "", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			c := execCmd(&globalFlags{})
			c.RunE = func(_ *cobra.Command, args []string) error { got = args; return nil }
			c.SetArgs(tc.args)
			if err := c.Execute(); err != nil {
				if !tc.wantErr {
					t.Fatalf("cobra: %v", err)
				}
				return
			}
			target, argv, err := execArgs(got)
			if (err != nil) != tc.wantErr {
				t.Fatalf("execArgs(%q) error %v, want error %v", got, err, tc.wantErr)
			}
			if target != tc.wantTarget {
				t.Errorf("target %q, want %q", target, tc.wantTarget)
			}
			if diff := cmp.Diff(tc.wantArgv, argv); diff != "" {
				t.Errorf("command (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUpAgentArgs: agent flags given to up reach the lab options verbatim.
func TestUpAgentArgs(t *testing.T) {
	g := &globalFlags{name: "wt", runDir: "/run/x"}
	var u upOptions
	c := &cobra.Command{Use: "up", RunE: func(*cobra.Command, []string) error { return nil }}
	u.register(c, 3, 0)
	c.SetArgs([]string{"--nodes", "2", "--agent-arg=--gobgp-api=127.0.0.1:50051", "--agent-arg", "--log-level=debug", "--converge-timeout", "2m"})
	if err := c.Execute(); err != nil {
		t.Fatal(err)
	}
	o, err := u.options(g)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"--gobgp-api=127.0.0.1:50051", "--log-level=debug"}, o.AgentArgs); diff != "" {
		t.Errorf("agent args (-want +got):\n%s", diff)
	}
	if o.Nodes != 2 || o.ConvergeTimeout.Minutes() != 2 {
		t.Errorf("nodes %d, converge timeout %v", o.Nodes, o.ConvergeTimeout)
	}
}
