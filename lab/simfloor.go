package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/syncer"
)

// The sim's floor is a bare etcd watcher (datastore.Store.FloorWatch) in
// a process of its own beside the real agents: the agents' client
// configuration watching the ranges their views watch, counting events and
// nothing else. Its CPU per churn event, taken exactly as the agents' is,
// is the reference their per-event figure is reported against
// (docs/scale.md, "Per remote pod event against a bare watcher").

// floorKey is the floor's key in the usage snapshots.
const floorKey = "floor"

// RunFloorWatch runs a bare watcher of what an agent's view watches on etcd
// at endpoints until ctx ends (`tabby-lab floor-watch`, started by the
// sim).
func RunFloorWatch(ctx context.Context, endpoints []string) error {
	s, err := datastore.New(ctx, datastore.Config{Endpoints: endpoints})
	if err != nil {
		return err
	}
	defer s.Close()
	// A failed watch (etcd busy at 1,000 nodes) is watched again: the
	// floor's process must outlive the run, as an agent does.
	for {
		err := s.FloorWatch(ctx, syncer.WatchSpec(), 0, datastore.FloorClient, func(int, int64) {})
		if ctx.Err() != nil {
			return nil
		}
		fmt.Fprintf(os.Stderr, "floor watch: %v; watching again\n", err)
		sleepCtx(ctx, time.Second)
	}
}

// startFloor starts the floor in the first client node's namespace, with
// the endpoints the agents have.
func (r *simRun) startFloor() error {
	st := r.l.State()
	eps := st.EtcdEndpoints()
	if st.EtcdProxy != nil {
		eps = []string{st.EtcdProxyURL()}
	}
	argv := []string{st.LabBinary, "floor-watch"}
	for _, e := range eps {
		argv = append(argv, "--etcd", e)
	}
	p, done, err := r.l.StartDetached(floorKey, st.Node(r.clients[0]).NetNS, argv, filepath.Join(r.l.Dir(), "floor-watch.log"), PIDFile(r.l.Dir(), "floor-watch"))
	if err != nil {
		return err
	}
	r.floor, r.floorDone = p, done
	// Recorded, so that `tabby-lab down` stops it after a sim that was
	// killed (or a panic) rather than stopped.
	return r.l.Update(func(s *State) error { s.FloorWatch = p; return nil })
}

// stopFloor stops the floor, if it runs.
func (r *simRun) stopFloor() error {
	if r.floor == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := r.floor.Stop(ctx, syscall.SIGTERM, 5*time.Second, r.floorDone); err != nil {
		return fmt.Errorf("stopping the floor watcher: %w", err)
	}
	return r.l.Update(func(s *State) error { s.FloorWatch = nil; return nil })
}
