package testkit

import (
	"time"

	"github.com/tabbynet/tabby/internal/stats"
)

// Quantile is stats.Quantile: the q-quantile of ds by nearest rank.
func Quantile(ds []time.Duration, q float64) time.Duration { return stats.Quantile(ds, q) }
