package stats

import (
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		var ds []time.Duration
		for _, v := range vs {
			ds = append(ds, time.Duration(v)*time.Millisecond)
		}
		return ds
	}
	for _, tc := range []struct {
		ds   []time.Duration
		q    float64
		want time.Duration
	}{
		{nil, 0.5, 0},
		{ms(7), 0.5, 7 * time.Millisecond},
		{ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{ms(4, 1, 3, 2), 0.99, 4 * time.Millisecond},
		{ms(4, 1, 3, 2), 0, 1 * time.Millisecond},
		{ms(5, 1, 4, 2, 3), 0.5, 3 * time.Millisecond},
		{ms(10, 20, 30, 40, 50, 60, 70, 80, 90, 100), 0.9, 90 * time.Millisecond},
	} {
		in := append([]time.Duration(nil), tc.ds...)
		if got := Quantile(tc.ds, tc.q); got != tc.want {
			t.Errorf("Quantile(%v, %v) = %v, want %v", tc.ds, tc.q, got, tc.want)
		}
		for i := range in {
			if in[i] != tc.ds[i] {
				t.Fatalf("Quantile modified its input: %v, was %v", tc.ds, in)
			}
		}
	}
}
