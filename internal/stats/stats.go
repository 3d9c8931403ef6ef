// Package stats holds the few order statistics that benchmarks, bench
// commands and tests share.
package stats

import (
	"slices"
	"time"
)

// Quantile is the q-quantile (0 ≤ q ≤ 1) of ds by nearest rank: the value
// of rank round(q·n) in sorted order, at least the first (the median of
// 1,2,3,4 is 2, its 0.99-quantile 4). It is 0 for no values and does not
// modify ds.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
