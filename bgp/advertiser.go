package bgp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/tabbynet/tabby/api"
)

// Advertisement is one prefix this node originates, with the attributes its
// path carries.
type Advertisement struct {
	Prefix netip.Prefix
	// Communities are standard BGP communities (RFC 1997: high 16 bits
	// the AS, low 16 bits the value) carried on the path.
	Communities []uint32
	// LargeCommunities are RFC 8092 large communities carried on the path.
	LargeCommunities []api.LargeCommunity
	// ExternalOnly sends the path to peers outside the cluster only (a
	// Service prefix, docs/bgp.md "Services"): the speaker tags it with
	// serviceMarker, which the export policy rejects towards cluster peers
	// and strips towards the others.
	ExternalOnly bool
}

// AdvertisementsOf returns one Advertisement without attributes per prefix.
func AdvertisementsOf(prefixes []netip.Prefix) []Advertisement {
	out := make([]Advertisement, 0, len(prefixes))
	for _, p := range prefixes {
		out = append(out, Advertisement{Prefix: p})
	}
	return out
}

// Prefixes returns the prefixes of ads, in order.
func Prefixes(ads []Advertisement) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ads))
	for _, a := range ads {
		out = append(out, a.Prefix)
	}
	return out
}

// sameAttrs reports whether two normalized advertisements carry the same
// attributes.
func sameAttrs(a, b Advertisement) bool {
	return slices.Equal(a.Communities, b.Communities) && slices.Equal(a.LargeCommunities, b.LargeCommunities) && a.ExternalOnly == b.ExternalOnly
}

// MergeAdvertisements returns ads with prefixes masked, sorted by prefix,
// one entry per prefix: the communities of every entry for a prefix,
// sorted and without duplicates, ExternalOnly when every entry is (a
// prefix that is also a pod block still reaches the cluster). It is pure and leaves ads unchanged.
func MergeAdvertisements(ads []Advertisement) []Advertisement {
	sorted := make([]Advertisement, len(ads))
	for i, a := range ads {
		sorted[i] = Advertisement{Prefix: a.Prefix.Masked(), Communities: a.Communities, LargeCommunities: a.LargeCommunities, ExternalOnly: a.ExternalOnly}
	}
	slices.SortFunc(sorted, func(a, b Advertisement) int { return a.Prefix.Compare(b.Prefix) })
	var out []Advertisement
	for i := 0; i < len(sorted); {
		j := i + 1
		for j < len(sorted) && sorted[j].Prefix == sorted[i].Prefix {
			j++
		}
		m := Advertisement{Prefix: sorted[i].Prefix, ExternalOnly: true}
		for _, a := range sorted[i:j] {
			m.ExternalOnly = m.ExternalOnly && a.ExternalOnly
			m.Communities = append(m.Communities, a.Communities...)
			m.LargeCommunities = append(m.LargeCommunities, a.LargeCommunities...)
		}
		slices.Sort(m.Communities)
		m.Communities = slices.Compact(m.Communities)
		slices.SortFunc(m.LargeCommunities, compareLarge)
		m.LargeCommunities = slices.Compact(m.LargeCommunities)
		out = append(out, m)
		i = j
	}
	return out
}

func compareLarge(a, b api.LargeCommunity) int {
	return cmp.Or(cmp.Compare(a.ASN, b.ASN), cmp.Compare(a.Local1, b.Local1), cmp.Compare(a.Local2, b.Local2))
}

// advertiser is the speaker's record of the paths it has put into GoBGP
// (only this speaker originates paths, so it is the actual state); the
// speaker's mu guards it.
type advertiser struct {
	originated map[netip.Prefix]Advertisement
}

// SetAdvertisements implements Speaker. It diffs against the paths it has
// put into GoBGP (originated): reading them back with ListPath would race
// with GoBGP (see readRIB). A path whose attributes changed is sent again:
// GoBGP replaces our earlier path for the prefix.
func (s *speaker) SetAdvertisements(ctx context.Context, ads []Advertisement) error {
	var errs []error
	s.mu.Lock()
	defer s.mu.Unlock()
	var valid []Advertisement
	for _, a := range ads {
		p := a.Prefix
		switch {
		case !p.IsValid() || p.Addr().Is4In6() || p.Addr().Zone() != "":
			errs = append(errs, fmt.Errorf("prefix %v: not an IPv4 or IPv6 prefix", p))
		case p.Addr().Is6() && !s.cfg.RouterID6.IsValid():
			errs = append(errs, fmt.Errorf("prefix %v: the speaker has no IPv6 address to advertise it with", p))
		case p.Addr().Is4() && s.cfg.IPv6Only:
			errs = append(errs, fmt.Errorf("prefix %v: an IPv6-only speaker has no IPv4 next hop to advertise it with", p))
		default:
			valid = append(valid, a)
		}
	}
	desired := map[netip.Prefix]Advertisement{}
	for _, a := range MergeAdvertisements(valid) {
		desired[a.Prefix] = a
	}
	if s.srv == nil || s.stopped {
		return errors.New("speaker not running")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	actual := s.adv.originated
	var add, del []*apiutil.Path
	var added []Advertisement
	for p, a := range desired {
		if old, ok := actual[p]; ok && sameAttrs(old, a) {
			continue
		}
		path, err := s.localPath(a, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		add, added = append(add, path), append(added, a)
	}
	for p, a := range actual {
		if _, ok := desired[p]; !ok {
			path, err := s.localPath(a, true)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			del = append(del, path)
		}
	}
	if len(add) > 0 {
		resps, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: add})
		if err != nil {
			errs = append(errs, fmt.Errorf("advertising %d prefixes: %w", len(add), err))
		}
		for i, a := range added {
			if err == nil && i < len(resps) && resps[i].Error != nil {
				errs = append(errs, fmt.Errorf("advertising %v: %w", a.Prefix, resps[i].Error))
				continue
			}
			if err == nil {
				s.adv.originated[a.Prefix] = a
			}
		}
	}
	if len(del) > 0 {
		if err := s.srv.DeletePath(apiutil.DeletePathRequest{Paths: del}); err != nil {
			errs = append(errs, fmt.Errorf("withdrawing %d prefixes: %w", len(del), err))
		} else {
			for _, path := range del {
				delete(s.adv.originated, path.Nlri.(*gobgp.IPAddrPrefix).Prefix.Masked())
			}
		}
	}
	s.markDirty()
	return errors.Join(errs...)
}

// localPath builds the path we originate for a: origin IGP, next hop our
// router ID (an IPv6 prefix: RouterID6, in MP_REACH_NLRI), a's communities
// and large communities, timestamped now. Called with s.mu held.
func (s *speaker) localPath(a Advertisement, withdraw bool) (*apiutil.Path, error) {
	prefix := a.Prefix
	nlri, err := gobgp.NewIPAddrPrefix(prefix)
	if err != nil {
		return nil, fmt.Errorf("prefix %v: %w", prefix, err)
	}
	family := gobgp.RF_IPv4_UC
	var nh gobgp.PathAttributeInterface
	if prefix.Addr().Is4() {
		nh, err = gobgp.NewPathAttributeNextHop(s.cfg.RouterID)
	} else {
		family = gobgp.RF_IPv6_UC
		nh, err = gobgp.NewPathAttributeMpReachNLRI(family, []gobgp.PathNLRI{{NLRI: nlri}}, s.cfg.RouterID6)
	}
	if err != nil {
		return nil, fmt.Errorf("next hop of %v: %w", prefix, err)
	}
	attrs := []gobgp.PathAttributeInterface{gobgp.NewPathAttributeOrigin(gobgp.BGP_ORIGIN_ATTR_TYPE_IGP), nh}
	if len(a.Communities) > 0 {
		attrs = append(attrs, gobgp.NewPathAttributeCommunities(slices.Clone(a.Communities)))
	}
	largeCs := a.LargeCommunities
	if a.ExternalOnly {
		largeCs = append(slices.Clone(largeCs), serviceMarker)
	}
	if len(largeCs) > 0 {
		large := make([]*gobgp.LargeCommunity, 0, len(largeCs))
		for _, c := range largeCs {
			large = append(large, gobgp.NewLargeCommunity(c.ASN, c.Local1, c.Local2))
		}
		attrs = append(attrs, gobgp.NewPathAttributeLargeCommunities(large))
	}
	return &apiutil.Path{
		Family:     family,
		Nlri:       nlri,
		Attrs:      attrs,
		Withdrawal: withdraw,
		// GoBGP takes Age as the path's timestamp (Unix seconds): unset,
		// `gobgp global rib` shows our routes as originated in 1970.
		Age: time.Now().Unix(),
	}, nil
}
