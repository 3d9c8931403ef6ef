package lab

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tabbynet/tabby/cni"
	"github.com/tabbynet/tabby/internal/stats"
)

// CNIBenchStats summarises one plugin's pods of a run: quantiles by
// nearest rank.
type CNIBenchStats struct {
	Pods                   int
	AddP50, AddP90, AddP99 time.Duration
	DelP50, DelP90, DelP99 time.Duration
	ExecP50                time.Duration
	// CPUP50 is the median CPU an ADD cost (CNIBenchPod.CPU).
	CPUP50, PluginCPUP50 time.Duration
	// AgentP50 and AgentIPAMP50 are the agent's own figures (tabby only).
	AgentP50, AgentIPAMP50 time.Duration
	// AgentStepsP50 are the medians of the agent's steps (tabby only).
	AgentStepsP50 map[string]time.Duration
}

// Stats summarises the run's pods of the plugin.
func (r CNIBenchRun) Stats(plugin string) CNIBenchStats {
	var add, del, ex, ag, agIPAM, cpu, pcpu []time.Duration
	steps := map[string][]time.Duration{}
	for _, p := range r.Pods {
		if p.Plugin != plugin {
			continue
		}
		add, del, ex = append(add, p.Add), append(del, p.Del), append(ex, p.Exec)
		cpu, pcpu = append(cpu, p.CPU), append(pcpu, p.PluginCPU)
		if p.Agent > 0 {
			ag, agIPAM = append(ag, p.Agent), append(agIPAM, p.AgentIPAM)
		}
		for step, d := range p.AgentSteps {
			steps[step] = append(steps[step], d)
		}
	}
	var stepsP50 map[string]time.Duration
	for step, ds := range steps {
		if stepsP50 == nil {
			stepsP50 = map[string]time.Duration{}
		}
		stepsP50[step] = stats.Quantile(ds, 0.5)
	}
	return CNIBenchStats{AgentStepsP50: stepsP50,
		Pods:   len(add),
		AddP50: stats.Quantile(add, 0.5), AddP90: stats.Quantile(add, 0.9), AddP99: stats.Quantile(add, 0.99),
		DelP50: stats.Quantile(del, 0.5), DelP90: stats.Quantile(del, 0.9), DelP99: stats.Quantile(del, 0.99),
		ExecP50: stats.Quantile(ex, 0.5), CPUP50: stats.Quantile(cpu, 0.5), PluginCPUP50: stats.Quantile(pcpu, 0.5), AgentP50: stats.Quantile(ag, 0.5), AgentIPAMP50: stats.Quantile(agIPAM, 0.5),
	}
}

// CNIBenchRatios are tabby's figures over the reference's in one run.
type CNIBenchRatios struct {
	AddP50, AddP90, AddP99, DelP50 float64
	// CPU is of the median CPU per ADD.
	CPU float64
}

// Ratios are run r's tabby / ptp+host-local ratios.
func (rep *CNIBenchReport) Ratios(r int) CNIBenchRatios {
	t, ref := rep.Runs[r].Stats(CNIBenchTabby), rep.Runs[r].Stats(CNIBenchRef)
	div := func(a, b time.Duration) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	return CNIBenchRatios{AddP50: div(t.AddP50, ref.AddP50), AddP90: div(t.AddP90, ref.AddP90),
		AddP99: div(t.AddP99, ref.AddP99), DelP50: div(t.DelP50, ref.DelP50), CPU: div(t.CPUP50, ref.CPUP50)}
}

// MedianRatios are the medians over the runs of each ratio.
func (rep *CNIBenchReport) MedianRatios() CNIBenchRatios {
	var a50, a90, a99, d50, cpu []float64
	for r, run := range rep.Runs {
		if run.Incomplete && rep.complete() > 0 {
			continue
		}
		x := rep.Ratios(r)
		a50, a90, a99, d50 = append(a50, x.AddP50), append(a90, x.AddP90), append(a99, x.AddP99), append(d50, x.DelP50)
		cpu = append(cpu, x.CPU)
	}
	return CNIBenchRatios{AddP50: median(a50), AddP90: median(a90), AddP99: median(a99), DelP50: median(d50), CPU: median(cpu)}
}

// complete counts the runs that did not stop early.
func (rep *CNIBenchReport) complete() int {
	n := 0
	for _, run := range rep.Runs {
		if !run.Incomplete {
			n++
		}
	}
	return n
}

func (rep *CNIBenchReport) ratioLine(r int) string {
	t, ref, x := rep.Runs[r].Stats(CNIBenchTabby), rep.Runs[r].Stats(CNIBenchRef), rep.Ratios(r)
	return fmt.Sprintf("ADD p50 %s %s, %s %s: %.2f×", CNIBenchTabby, msec(t.AddP50), CNIBenchRef, msec(ref.AddP50), x.AddP50)
}

// Table prints every run's figures per plugin, the ratios and their
// medians over the runs.
func (rep *CNIBenchReport) Table() string {
	var b strings.Builder
	pods := 0
	if len(rep.Runs) > 0 {
		pods = rep.Runs[0].Stats(CNIBenchTabby).Pods
	}
	fsync := "the lab's etcd fsyncs, its data on " + rep.EtcdFS
	if rep.EtcdFS == "tmpfs" {
		fsync = "WARNING: the lab's etcd data is on tmpfs, where fsync costs nothing: use --run-dir on a disk"
	}
	fmt.Fprintf(&b, "CNI ADD+DEL on %s of lab %q, %d pods per plugin per run, interleaved: %s (pool %s; %s) against %s (%s)\n\n",
		rep.Node, rep.Lab, pods, CNIBenchTabby, rep.Pool, fsync, CNIBenchRef, rep.RefSubnet)
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "run\tload\tplugin\tADD p50\tp90\tp99\tDEL p50\tp90\tp99\texec p50\tagent p50\tagent ipam p50\tADD cpu p50\tplugin cpu p50\t")
	for r, run := range rep.Runs {
		load := fmt.Sprintf("%.1f→%.1f", run.LoadStart, run.LoadEnd)
		if run.Incomplete {
			load += " (stopped early)"
		}
		for _, name := range []string{CNIBenchTabby, CNIBenchRef} {
			s := run.Stats(name)
			agent, agentIPAM := "-", "-"
			if s.AgentP50 > 0 {
				agent, agentIPAM = msec(s.AgentP50), msec(s.AgentIPAMP50)
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r+1, load, name,
				msec(s.AddP50), msec(s.AddP90), msec(s.AddP99), msec(s.DelP50), msec(s.DelP90), msec(s.DelP99), msec(s.ExecP50), agent, agentIPAM,
				msec(s.CPUP50), msec(s.PluginCPUP50))
			load = ""
		}
		x := rep.Ratios(r)
		fmt.Fprintf(w, "%d\t\t%s / ref\t%.2f\t%.2f\t%.2f\t%.2f\t\t\t\t\t\t%.2f\t\t\n", r+1, CNIBenchTabby, x.AddP50, x.AddP90, x.AddP99, x.DelP50, x.CPU)
	}
	w.Flush()
	for r, run := range rep.Runs {
		if line := stepsLine(run.Stats(CNIBenchTabby).AgentStepsP50); line != "" {
			if r == 0 {
				fmt.Fprintf(&b, "\n%s's ADD steps as its agent timed them, p50 in ms (concurrent: docs/agent.md):\n", CNIBenchTabby)
			}
			fmt.Fprintf(&b, "  run %d: %s\n", r+1, line)
		}
	}
	m := rep.MedianRatios()
	runs := rep.complete()
	if runs == 0 {
		runs = len(rep.Runs)
	}
	fmt.Fprintf(&b, "\nmedian over %d runs of %s / %s: ADD p50 %.2f×, p90 %.2f×, p99 %.2f×; DEL p50 %.2f×; CPU per ADD (plugins, agent, etcd) p50 %.2f×\n",
		runs, CNIBenchTabby, CNIBenchRef, m.AddP50, m.AddP90, m.AddP99, m.DelP50, m.CPU)
	return b.String()
}

// stepsLine prints the steps' medians in the plan's order ("" for none).
func stepsLine(p50 map[string]time.Duration) string {
	var parts []string
	for _, step := range cni.AddSteps {
		if d, ok := p50[step]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", step, float64(d)/float64(time.Millisecond)))
		}
	}
	return strings.Join(parts, ", ")
}

// msec prints a duration in milliseconds with one decimal.
func msec(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
