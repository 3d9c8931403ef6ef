package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"testing"
	"time"
)

// TestServeAnswersHostnameAndPeer: each connection gets one line naming
// the host and the client's address; ending the context stops serving.
func TestServeAnswersHostnameAndPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, addr) }()
	var c net.Conn
	for deadline := time.Now().Add(5 * time.Second); ; {
		if c, err = net.Dial("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if want := host + " " + c.LocalAddr().String() + "\n"; line != want {
		t.Errorf("answer %q, want %q", line, want)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return after cancel")
	}
}
