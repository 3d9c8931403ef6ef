package agent

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/api"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/dataplane/fake"
)

// staticSource advertises fixed prefixes with communities, the way a
// Service-address source would.
type staticSource []bgp.Advertisement

func (staticSource) Name() string                                        { return "static" }
func (s staticSource) Advertisements(bgp.SourceView) []bgp.Advertisement { return s }

// A source registered with the owner reaches the speaker with its
// communities on the next pass, and the status and waitAdvertised see its
// prefix like any other.
func TestAdvertisementSourceReachesSpeaker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sp := newFakeSpeaker()
	b := newTestBGPOwner(t, sp, fake.NewRoutes())
	svc := netip.MustParsePrefix("10.96.0.10/32")
	ad := bgp.Advertisement{Prefix: svc, Communities: []uint32{64512<<16 | 100}, LargeCommunities: []api.LargeCommunity{{ASN: 64512, Local1: 1, Local2: 2}}}
	b.sources = append(b.sources, staticSource{ad})
	if err := b.pass(ctx); err != nil {
		t.Fatal(err)
	}
	sp.mu.Lock()
	got := sp.ads
	sp.mu.Unlock()
	if diff := cmp.Diff([]bgp.Advertisement{ad}, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("speaker's advertisements (-want +got):\n%s", diff)
	}
	if err := b.waitAdvertised(ctx, svc); err != nil {
		t.Error(err)
	}
	b.mu.Lock()
	adv := b.advertised
	b.mu.Unlock()
	if len(adv) != 1 || adv[0] != svc {
		t.Errorf("advertised %v, want [%v]", adv, svc)
	}
}
