package fake

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/tabbynet/tabby/dataplane"
)

// Workloads is an in-memory dataplane.Workloads. When it has a Routes table,
// Setup installs each workload's host routes there (protocol 80) and
// Teardown removes them, as the real implementation does in the kernel.
type Workloads struct {
	mu sync.Mutex
	failer
	routes    *Routes
	links     map[string]*workload // by host interface name
	nextIndex int
	ops       []string
}

type workload struct {
	spec   dataplane.WorkloadSpec
	status dataplane.WorkloadStatus
	// prepared: made by Prepare, not yet completed (no addresses).
	prepared bool
}

var _ dataplane.Workloads = (*Workloads)(nil)

// NewWorkloads returns an empty set of workloads whose host routes go into
// routes (nil: no routes are kept).
func NewWorkloads(routes *Routes) *Workloads {
	w := &Workloads{routes: routes, links: map[string]*workload{}, nextIndex: 10}
	w.FailOn = map[string]error{}
	return w
}

// SetFail makes op fail with err from now on; a nil err clears it.
func (w *Workloads) SetFail(op string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	setFail(&w.failer, op, err)
}

// Setup implements dataplane.Workloads. A second Setup with the same spec
// returns the same status and changes nothing; one with a changed spec for
// the same host interface replaces the workload (as a stale link would be).
// On failure nothing of this call remains.
func (w *Workloads) Setup(ctx context.Context, spec dataplane.WorkloadSpec) (_ dataplane.WorkloadStatus, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.fail("Setup", spec.HostIfName); err != nil {
		return dataplane.WorkloadStatus{}, err
	}
	if err := ctx.Err(); err != nil {
		return dataplane.WorkloadStatus{}, err
	}
	if err := spec.Validate(); err != nil {
		return dataplane.WorkloadStatus{}, err
	}
	spec = cloneSpec(spec)
	if old, ok := w.links[spec.HostIfName]; ok {
		if sameSpec(old.spec, spec) && w.checkLocked(old.spec) == nil {
			st := old.status
			st.Existed = true
			return st, nil
		}
		w.removeLocked(spec.HostIfName)
	}
	for host, other := range w.links {
		if other.spec.NetNS == spec.NetNS && other.spec.IfName == spec.IfName {
			return dataplane.WorkloadStatus{}, fmt.Errorf("creating %s in netns %s: interface exists (peer of %s)",
				spec.IfName, spec.NetNS, host)
		}
	}

	st := w.newStatusLocked(spec)
	w.links[spec.HostIfName] = &workload{spec: spec, status: st}
	defer func() {
		if err != nil {
			w.removeLocked(spec.HostIfName)
		}
	}()
	if err := w.hostRoutesLocked(spec); err != nil {
		return dataplane.WorkloadStatus{}, err
	}
	w.ops = append(w.ops, "setup "+spec.HostIfName)
	return st, nil
}

// newStatusLocked numbers a new pair's ends and gives the container end
// its MAC.
func (w *Workloads) newStatusLocked(spec dataplane.WorkloadSpec) dataplane.WorkloadStatus {
	st := dataplane.WorkloadStatus{
		HostIfIndex:      w.nextIndex,
		HostMAC:          dataplane.HostMAC,
		ContainerIfIndex: w.nextIndex + 1,
		ContainerMAC:     spec.MAC,
	}
	w.nextIndex += 2
	if st.ContainerMAC == "" {
		sum := sha1.Sum([]byte(spec.NetNS + "/" + spec.IfName))
		st.ContainerMAC = net.HardwareAddr{0x0a, sum[0], sum[1], sum[2], sum[3], sum[4]}.String()
	} else {
		hw, _ := net.ParseMAC(spec.MAC) // validated
		st.ContainerMAC = hw.String()
	}
	return st
}

func (w *Workloads) hostRoutesLocked(spec dataplane.WorkloadSpec) error {
	if w.routes == nil || spec.SkipHostRoutes {
		return nil
	}
	for _, rt := range dataplane.HostRoutes(spec) {
		if err := w.routes.Replace(rt); err != nil {
			return fmt.Errorf("adding host route %v: %w", rt, err)
		}
	}
	return nil
}

// Prepare implements dataplane.Workloads: a new pair, without addresses,
// when neither end exists. An injected failure of "Setup" fails it when it
// would create one (the kernel work of Setup starts here), as does one of
// "Prepare" always.
func (w *Workloads) Prepare(ctx context.Context, spec dataplane.WorkloadSpec) (dataplane.Prepared, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.fail("Prepare", spec.HostIfName); err != nil {
		return dataplane.Prepared{}, err
	}
	if err := ctx.Err(); err != nil {
		return dataplane.Prepared{}, err
	}
	if err := spec.ValidateLinks(); err != nil {
		return dataplane.Prepared{}, err
	}
	if _, ok := w.links[spec.HostIfName]; ok {
		return dataplane.Prepared{}, nil
	}
	for _, other := range w.links {
		if other.spec.NetNS == spec.NetNS && other.spec.IfName == spec.IfName {
			return dataplane.Prepared{}, nil
		}
	}
	if err := w.fail("Setup", spec.HostIfName); err != nil {
		return dataplane.Prepared{}, err
	}
	spec = cloneSpec(spec)
	spec.Addrs = nil
	st := w.newStatusLocked(spec)
	w.links[spec.HostIfName] = &workload{spec: spec, status: st, prepared: true}
	w.ops = append(w.ops, "prepare "+spec.HostIfName)
	return dataplane.Prepared{Created: true, HostIfIndex: st.HostIfIndex, ContainerIfIndex: st.ContainerIfIndex, ContainerMAC: st.ContainerMAC}, nil
}

// Complete implements dataplane.Workloads. Injected failures of "Complete"
// and "Setup" fail it, and the prepared pair is removed.
func (w *Workloads) Complete(ctx context.Context, spec dataplane.WorkloadSpec, p dataplane.Prepared) (_ dataplane.WorkloadStatus, err error) {
	if !p.Created {
		return w.Setup(ctx, spec)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	defer func() {
		if err != nil {
			w.removeLocked(spec.HostIfName)
		}
	}()
	for _, op := range []string{"Complete", "Setup"} {
		if err := w.fail(op, spec.HostIfName); err != nil {
			return dataplane.WorkloadStatus{}, err
		}
	}
	if err := ctx.Err(); err != nil {
		return dataplane.WorkloadStatus{}, err
	}
	if err := spec.Validate(); err != nil {
		return dataplane.WorkloadStatus{}, err
	}
	wl, ok := w.links[spec.HostIfName]
	switch {
	case !ok:
		return dataplane.WorkloadStatus{}, fmt.Errorf("completing %s: the link is gone", spec.HostIfName)
	case !wl.prepared || wl.status.HostIfIndex != p.HostIfIndex:
		return dataplane.WorkloadStatus{}, fmt.Errorf("completing %s: not the pair Prepare made", spec.HostIfName)
	case wl.spec.NetNS != spec.NetNS || wl.spec.IfName != spec.IfName || wl.spec.EffectiveMTU() != spec.EffectiveMTU() || normMAC(wl.spec.MAC) != normMAC(spec.MAC):
		return dataplane.WorkloadStatus{}, fmt.Errorf("completing %s: the spec's links differ from Prepare's", spec.HostIfName)
	}
	wl.spec, wl.prepared = cloneSpec(spec), false
	if err := w.hostRoutesLocked(spec); err != nil {
		return dataplane.WorkloadStatus{}, err
	}
	w.ops = append(w.ops, "setup "+spec.HostIfName)
	return wl.status, nil
}

// Teardown implements dataplane.Workloads; a missing workload is success.
func (w *Workloads) Teardown(ctx context.Context, spec dataplane.WorkloadSpec) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.fail("Teardown", spec.HostIfName); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if spec.HostIfName == "" {
		return errors.New("tearing down workload: host interface name is empty")
	}
	if _, ok := w.links[spec.HostIfName]; ok {
		w.ops = append(w.ops, "teardown "+spec.HostIfName)
	}
	w.removeLocked(spec.HostIfName)
	return nil
}

// Check implements dataplane.Workloads.
func (w *Workloads) Check(ctx context.Context, spec dataplane.WorkloadSpec) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.fail("Check", spec.HostIfName); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.checkLocked(spec)
}

func (w *Workloads) checkLocked(spec dataplane.WorkloadSpec) error {
	wl, ok := w.links[spec.HostIfName]
	if !ok {
		return fmt.Errorf("host interface %s does not exist", spec.HostIfName)
	}
	var errs []error
	have := wl.spec
	if have.NetNS != spec.NetNS || have.IfName != spec.IfName {
		errs = append(errs, fmt.Errorf("peer of %s is %s in %s, want %s in %s",
			spec.HostIfName, have.IfName, have.NetNS, spec.IfName, spec.NetNS))
	}
	if have.EffectiveMTU() != spec.EffectiveMTU() {
		errs = append(errs, fmt.Errorf("mtu of %s is %d, want %d", spec.IfName, have.EffectiveMTU(), spec.EffectiveMTU()))
	}
	if spec.MAC != "" {
		if hw, err := net.ParseMAC(spec.MAC); err != nil || hw.String() != wl.status.ContainerMAC {
			errs = append(errs, fmt.Errorf("mac of %s is %s, want %s", spec.IfName, wl.status.ContainerMAC, spec.MAC))
		}
	}
	if !slices.Equal(sortedPrefixes(have.Addrs), sortedPrefixes(spec.Addrs)) {
		errs = append(errs, fmt.Errorf("addresses of %s are %v, want %v", spec.IfName, have.Addrs, spec.Addrs))
	}
	if w.routes != nil {
		w.routes.mu.Lock()
		for _, want := range dataplane.HostRoutes(spec) {
			if got, ok := w.routes.routes[want.Dst]; !ok || !want.Satisfies(got) {
				errs = append(errs, fmt.Errorf("host route %v missing", want))
			}
		}
		w.routes.mu.Unlock()
	}
	return errors.Join(errs...)
}

// RemoveLink deletes a workload's host interface (and so its routes) behind
// the back of the caller, as an administrator or a crash would.
func (w *Workloads) RemoveLink(hostIfName string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removeLocked(hostIfName)
}

func (w *Workloads) removeLocked(host string) {
	delete(w.links, host)
	if w.routes != nil {
		w.routes.removeDev(host)
	}
}

// Specs returns the specs of the workloads that are set up, sorted by host
// interface name.
func (w *Workloads) Specs() []dataplane.WorkloadSpec {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]dataplane.WorkloadSpec, 0, len(w.links))
	for _, wl := range w.links {
		out = append(out, cloneSpec(wl.spec))
	}
	slices.SortFunc(out, func(a, b dataplane.WorkloadSpec) int {
		return strings.Compare(a.HostIfName, b.HostIfName)
	})
	return out
}

// Ops returns the Setup, Prepare, Complete and Teardown calls that changed
// state, oldest first, as "setup <host if>" (a Setup or a Complete),
// "prepare <host if>" and "teardown <host if>".
func (w *Workloads) Ops() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.ops)
}

// Lines returns one line per workload, sorted:
// "cali0123456789a <-> eth0 netns /run/netns/p1 10.244.0.5/32 mtu 1500".
func (w *Workloads) Lines() []string {
	specs := w.Specs()
	lines := make([]string, len(specs))
	for i, s := range specs {
		lines[i] = fmt.Sprintf("%s <-> %s netns %s", s.HostIfName, s.IfName, s.NetNS)
		for _, a := range sortedPrefixes(s.Addrs) {
			lines[i] += " " + a.String()
		}
		lines[i] += fmt.Sprintf(" mtu %d", s.EffectiveMTU())
		if s.MAC != "" {
			lines[i] += " mac " + normMAC(s.MAC)
		}
	}
	return lines
}

// String prints the workloads as Lines, one per line.
func (w *Workloads) String() string {
	return joinLines(w.Lines())
}
