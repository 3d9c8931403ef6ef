package lab

import (
	"fmt"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// simPanels are the figures PlotSim draws against N, one panel each.
var simPanels = []struct {
	title, unit string
	value       func(SimResult) float64
}{
	{"agent CPU per remote pod event", "µs", func(r SimResult) float64 { return r.AgentUsPerEvent }},
	{"agent idle CPU", "%", func(r SimResult) float64 { return r.AgentIdlePct }},
	{"agent RSS", "MiB", func(r SimResult) float64 { return r.AgentRSSMiB }},
	{"reflector RSS", "MiB", func(r SimResult) float64 { return r.RRRSSMiB }},
	{"new block → route, p99", "ms", func(r SimResult) float64 { return r.RouteP99Ms }},
	// Through a relay the back-to-back changes read its window: the
	// panel shows a change alone there (SimResult.PolicyLoneP99Ms).
	{"policy change → kernel, p99 (alone if through a relay)", "ms", func(r SimResult) float64 {
		if r.Relay && r.PolicyLoneP99Ms > 0 {
			return r.PolicyLoneP99Ms
		}
		return r.PolicyP99Ms
	}},
	{"agent restart → Ready", "s", func(r SimResult) float64 { return r.ReadyS }},
	{"etcd CPU under churn", "%", func(r SimResult) float64 { return r.EtcdChurnPct }},
}

// PlotSim draws every panel of simPanels against the simulated node count
// into a PNG at path.
func PlotSim(path string, rs []SimResult) error {
	const cols = 4
	rows := (len(simPanels) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for i, p := range simPanels {
		pl := plot.New()
		pl.Title.Text = p.title
		pl.X.Label.Text = "simulated nodes"
		pl.Y.Label.Text = p.unit
		pl.Y.Min = 0
		pts := make(plotter.XYs, len(rs))
		for j, r := range rs {
			pts[j] = plotter.XY{X: float64(r.Nodes), Y: p.value(r)}
		}
		line, marks, err := plotter.NewLinePoints(pts)
		if err != nil {
			return fmt.Errorf("plotting %s: %w", p.title, err)
		}
		pl.Add(line, marks, plotter.NewGrid())
		plots[i/cols] = append(plots[i/cols], pl)
	}
	for len(plots[rows-1]) < cols {
		plots[rows-1] = append(plots[rows-1], nil)
	}
	img := vgimg.New(vg.Points(float64(cols)*260), vg.Points(float64(rows)*220))
	dc := draw.New(img)
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, t, dc)
	for i := range plots {
		for j, pl := range plots[i] {
			if pl != nil {
				pl.Draw(canvases[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
