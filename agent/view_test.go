package agent

import (
	"strconv"
	"testing"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/syncer"
	"github.com/tabbynet/tabby/syncer/syncertest"
)

// startView runs a view over src until the test ends and waits for its
// first sync.
func startView(t testing.TB, src syncer.Source) *syncer.Syncer {
	t.Helper()
	return syncertest.Start(t, src, testLogger(), true)
}

// mustRev returns a stored object's revision.
func mustRev(t testing.TB, obj api.Object) int64 {
	t.Helper()
	rev, err := strconv.ParseInt(obj.GetMeta().ResourceVersion, 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q: %v", obj.GetMeta().ResourceVersion, err)
	}
	return rev
}
