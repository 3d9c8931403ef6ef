package fake

import (
	"fmt"

	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/tabbynet/tabby/dataplane"
)

// VXLAN is an in-memory dataplane.VXLAN: devices with their spec and
// peers. Underlays maps a local address to its device's MTU (1500 for
// one not listed). The zero value is ready to use.
type VXLAN struct {
	mu sync.Mutex
	failer
	devs map[string]*fakeVXLANDev
	// Foreign are devices of other programs: name → "vni/port/family"
	// (a VXLAN device) or "" (a device of another type).
	Foreign map[string]string
	ops     []string
}

type fakeVXLANDev struct {
	spec  dataplane.VXLANSpec
	peers []dataplane.VXLANPeer
}

var _ dataplane.VXLAN = (*VXLAN)(nil)

// SetFail makes op ("Ensure", "SetPeers", "Remove") fail with err from now
// on; a nil err clears it.
func (v *VXLAN) SetFail(op string, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	setFail(&v.failer, op, err)
}

// Ops returns the state-changing calls so far, oldest first.
func (v *VXLAN) Ops() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.ops)
}

// Ensure implements dataplane.VXLAN.
func (v *VXLAN) Ensure(spec dataplane.VXLANSpec) (dataplane.VXLANStatus, error) {
	if err := spec.Validate(); err != nil {
		return dataplane.VXLANStatus{}, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.fail("Ensure", spec.Name); err != nil {
		return dataplane.VXLANStatus{}, err
	}
	key := fmt.Sprintf("%d/%d/%v", spec.VNI, spec.Port, spec.Local.Is6())
	for name, k := range v.Foreign {
		if name == spec.Name {
			return dataplane.VXLANStatus{}, fmt.Errorf("vxlan device %s: another device has the name: %w", name, dataplane.ErrVXLANClash)
		}
		if k == key {
			return dataplane.VXLANStatus{}, fmt.Errorf("vxlan device %s: device %s already uses VNI %d on port %d: %w", spec.Name, name, spec.VNI, spec.Port, dataplane.ErrVXLANClash)
		}
	}
	if spec.MTU == 0 {
		spec.MTU = 1500 - dataplane.VXLANOverhead(spec.Local.Is6())
	}
	if spec.MAC == nil {
		spec.MAC = dataplane.TunnelMAC("fake/"+spec.Name, spec.Local.Is6())
	}
	if v.devs == nil {
		v.devs = map[string]*fakeVXLANDev{}
	}
	d, ok := v.devs[spec.Name]
	created := !ok || d.spec.VNI != spec.VNI || d.spec.Port != spec.Port || d.spec.Local != spec.Local
	if created {
		d = &fakeVXLANDev{}
		v.devs[spec.Name] = d
	}
	if created || d.spec.MTU != spec.MTU || d.spec.Addr != spec.Addr || d.spec.MAC.String() != spec.MAC.String() {
		v.ops = append(v.ops, "ensure "+spec.Name)
	}
	d.spec = spec
	return v.status(spec.Name, created), nil
}

func (v *VXLAN) status(name string, created bool) dataplane.VXLANStatus {
	d := v.devs[name]
	st := dataplane.VXLANStatus{Name: name, MAC: slices.Clone(d.spec.MAC), MTU: d.spec.MTU, VNI: d.spec.VNI, Port: d.spec.Port, Local: d.spec.Local, Created: created}
	if d.spec.Addr.IsValid() {
		st.Addrs = []netip.Addr{d.spec.Addr}
	}
	return st
}

// SetPeers implements dataplane.VXLAN.
func (v *VXLAN) SetPeers(dev string, peers []dataplane.VXLANPeer) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.fail("SetPeers", dev); err != nil {
		return err
	}
	d, ok := v.devs[dev]
	if !ok {
		return fmt.Errorf("vxlan device %s: %w", dev, dataplane.ErrNoDevice)
	}
	next := dataplane.SortPeers(slices.Clone(peers))
	if !slices.EqualFunc(next, d.peers, func(a, b dataplane.VXLANPeer) bool { return a.String() == b.String() }) {
		v.ops = append(v.ops, "peers "+dev)
	}
	d.peers = next
	return nil
}

// Peers implements dataplane.VXLAN.
func (v *VXLAN) Peers(dev string) ([]dataplane.VXLANPeer, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, ok := v.devs[dev]
	if !ok {
		return nil, fmt.Errorf("vxlan device %s: %w", dev, dataplane.ErrNoDevice)
	}
	return slices.Clone(d.peers), nil
}

// Remove implements dataplane.VXLAN.
func (v *VXLAN) Remove(dev string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.fail("Remove", dev); err != nil {
		return err
	}
	if _, ok := v.devs[dev]; ok {
		delete(v.devs, dev)
		v.ops = append(v.ops, "remove "+dev)
	}
	return nil
}

// Status implements dataplane.VXLAN.
func (v *VXLAN) Status(dev string) (dataplane.VXLANStatus, bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.devs[dev]; !ok {
		return dataplane.VXLANStatus{}, false, nil
	}
	return v.status(dev, false), true, nil
}

// String prints every device and its peers, one line each, sorted:
// "vxlan.tabby vni 4096 port 4789 local 198.18.0.2 mtu 1450 addr 10.244.0.0"
// then "  10.244.1.0 lladdr 66:… dst 198.18.0.3".
func (v *VXLAN) String() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var b strings.Builder
	names := make([]string, 0, len(v.devs))
	for n := range v.devs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		d := v.devs[n]
		fmt.Fprintf(&b, "%s vni %d port %d local %v mtu %d addr %v\n", n, d.spec.VNI, d.spec.Port, d.spec.Local, d.spec.MTU, d.spec.Addr)
		for _, p := range d.peers {
			fmt.Fprintf(&b, "  %v\n", p)
		}
	}
	return b.String()
}
