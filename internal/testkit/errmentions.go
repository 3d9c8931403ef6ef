package testkit

import (
	"strings"
	"testing"
)

// ErrMentions checks a validation-style error: with no want, err must be
// nil; otherwise err must be non-nil and mention every string of want.
// call names what returned err in the messages ("Validate()").
func ErrMentions(tb testing.TB, call string, err error, want []string) {
	tb.Helper()
	if len(want) == 0 {
		if err != nil {
			tb.Fatalf("%s = %v, want nil", call, err)
		}
		return
	}
	if err == nil {
		tb.Fatalf("%s = nil, want an error mentioning %q", call, want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			tb.Errorf("%s = %v, want it to mention %q", call, err, w)
		}
	}
}
