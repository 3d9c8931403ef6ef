// Command echo is the lab's Service backend (the image
// docker.io/library/tabby-echo that internal/cmd/mkimage builds): it
// accepts TCP connections on -listen and answers each with one line,
// "<hostname> <client address>", then closes it, so that a client learns
// which pod answered and what source address reached it. It exits 0 on
// SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", ":8080", "TCP address to serve")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, *listen); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}

// serve answers connections on addr until ctx ends.
func serve(ctx context.Context, addr string) error {
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "%s %s\n", host, c.RemoteAddr())
		}()
	}
}
