package ctl

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// table is rows of text cells under a header.
type table struct {
	header []string
	rows   [][]string
}

func newTable(header ...string) *table { return &table{header: header} }

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

// writePlain writes the table the way kubectl does: left-aligned columns
// separated by three spaces.
func (t *table) writePlain(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	for _, r := range append([][]string{t.header}, t.rows...) {
		if _, err := fmt.Fprintln(tw, strings.Join(r, "\t")); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// writeBoxed writes the table in boxes, the way calicoctl prints node status
// and IPAM usage.
func (t *table) writeBoxed(w io.Writer) error {
	widths := make([]int, len(t.header))
	for _, r := range append([][]string{t.header}, t.rows...) {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	rule := func() {
		for _, n := range widths {
			b.WriteString("+" + strings.Repeat("-", n+2))
		}
		b.WriteString("+\n")
	}
	line := func(r []string) {
		for i, n := range widths {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			b.WriteString("| " + c + strings.Repeat(" ", n-utf8.RuneCountInString(c)) + " ")
		}
		b.WriteString("|\n")
	}
	rule()
	line(t.header)
	rule()
	for _, r := range t.rows {
		line(r)
	}
	rule()
	_, err := io.WriteString(w, b.String())
	return err
}
