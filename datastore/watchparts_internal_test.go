package datastore

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWatchParts(t *testing.T) {
	s := &Store{base: "/t/"}
	for _, tc := range []struct {
		name string
		spec WatchSpec
		want []absRange
	}{
		{"middle", WatchSpec{End: "status/", Skip: []KeyRange{{"ipam/blocks/", "resources/"}}},
			[]absRange{{"/t/", "/t/ipam/blocks/"}, {"/t/resources/", "/t/status/"}}},
		{"two, unsorted", WatchSpec{Prefix: "a/", Skip: []KeyRange{{"a/m", "a/n"}, {"a/c", "a/d"}}},
			[]absRange{{"/t/a/", "/t/a/c"}, {"/t/a/d", "/t/a/m"}, {"/t/a/n", "/t/a0"}}},
		{"at the start", WatchSpec{Prefix: "a/", Skip: []KeyRange{{"a/", "a/x"}}},
			[]absRange{{"/t/a/x", "/t/a0"}}},
		{"past the end", WatchSpec{End: "m", Skip: []KeyRange{{"k", "z"}}},
			[]absRange{{"/t/", "/t/k"}}},
		{"overlapping", WatchSpec{End: "z", Skip: []KeyRange{{"b", "d"}, {"c", "e"}}},
			[]absRange{{"/t/", "/t/b"}, {"/t/e", "/t/z"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, s.watchParts(tc.spec), cmp.AllowUnexported(absRange{})); diff != "" {
				t.Errorf("watchParts (-want +got):\n%s", diff)
			}
		})
	}
}
