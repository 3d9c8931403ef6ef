package routetable

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/dataplane"
	"github.com/tabbynet/tabby/dataplane/fake"
)

// A tunnel route whose node withdrew its tunnel goes even when the learned
// route that succeeds it cannot be installed (its next hop is behind a
// router): the traffic must not keep following a tunnel nobody answers.
// A route still wanted stays when its own replace fails.
func TestWithdrawnRouteGoesWhenItsSuccessorFails(t *testing.T) {
	kernel := fake.NewRoutes()
	table := New(kernel, 0)
	block := netip.MustParsePrefix("10.244.1.0/26")
	tunnel := dataplane.Route{Dst: block, Dev: "vxlan.tabby", Gateways: []netip.Addr{netip.MustParseAddr("10.244.1.0")}, Onlink: true}
	learned := dataplane.Route{Dst: block, Gateways: []netip.Addr{netip.MustParseAddr("198.18.1.12")}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(table.SetClass(Tunnel, []dataplane.Route{tunnel}))
	must(table.SetClass(Learned, []dataplane.Route{learned}))
	must(table.Apply())
	if got := strings.Join(kernel.Lines(), "\n"); !strings.Contains(got, "dev vxlan.tabby") {
		t.Fatalf("kernel: %s", got)
	}
	unreachable := errors.New("network is unreachable")
	kernel.SetFail("Replace "+block.String(), unreachable)

	// The tunnel's route is still wanted: a failing replace of it (say,
	// after a resync) leaves it.
	table.Resync()
	if err := table.Apply(); err != nil {
		t.Fatalf("apply with nothing to change: %v", err)
	}
	if got := strings.Join(kernel.Lines(), "\n"); !strings.Contains(got, "dev vxlan.tabby") {
		t.Errorf("a wanted route went: %s", got)
	}

	must(table.SetClass(Tunnel, nil))
	if err := table.Apply(); !errors.Is(err, unreachable) {
		t.Errorf("apply = %v, want the learned route's error", err)
	}
	if got := kernel.Lines(); len(got) != 0 {
		t.Errorf("kernel keeps %v after the tunnel was withdrawn, want nothing", got)
	}
	// Once the next hop is reachable the learned route comes.
	kernel.SetFail("Replace "+block.String(), nil)
	must(table.Apply())
	if got := strings.Join(kernel.Lines(), "\n"); !strings.Contains(got, "via 198.18.1.12 proto 81") {
		t.Errorf("kernel after the retry: %s", got)
	}
}
