package dataplane

import (
	"context"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// WatchLinks reports interfaces appearing in a network namespace (""
// is the calling process's): each new link's name is sent on the
// returned channel, which closes when ctx ends or the subscription
// fails. A slow reader misses names rather than stalling netlink: the
// channel holds 16. Host endpoints use it to notice an interface they
// name as soon as it exists.
func WatchLinks(ctx context.Context, netnsPath string) (<-chan string, error) {
	opts := netlink.LinkSubscribeOptions{}
	var h netns.NsHandle
	if netnsPath != "" {
		var err error
		if h, err = netns.GetFromPath(netnsPath); err != nil {
			return nil, fmt.Errorf("opening netns %s: %w", netnsPath, err)
		}
		opts.Namespace = &h
	}
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	err := netlink.LinkSubscribeWithOptions(updates, done, opts)
	if netnsPath != "" {
		_ = h.Close() // the subscription's socket keeps the namespace
	}
	if err != nil {
		return nil, fmt.Errorf("subscribing to link updates: %w", err)
	}
	out := make(chan string, 16)
	go func() {
		defer close(out)
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-updates:
				if !ok {
					return
				}
				if u.Header.Type != unix.RTM_NEWLINK || u.Link == nil {
					continue
				}
				select {
				case out <- u.Link.Attrs().Name:
				default:
				}
			}
		}
	}()
	return out, nil
}
