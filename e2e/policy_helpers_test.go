package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/lab"
)

// The policy tests run this test binary inside pod and ToR namespaces as a
// small server or client (TestPolicyHelperProcess, selected by the
// environment). Exit codes of "probe" tell a dropped connection (timeout)
// from other failures.
const (
	policyHelperEnv = "TABBY_E2E_POLICY_HELPER"
	exitBlocked     = 3
	exitRefused     = 4
	probeTimeout    = 1500 * time.Millisecond
)

// TestPolicyHelperProcess is not a test; see policyHelper.
func TestPolicyHelperProcess(t *testing.T) {
	if os.Getenv(policyHelperEnv) != "1" {
		t.Skip("helper process for the policy tests, not a test")
	}
	code, err := policyHelper(flagArgs())
	if err != nil {
		fmt.Fprintln(os.Stderr, "policy helper:", err)
	}
	os.Exit(code)
}

// policyHelper runs one command:
//
//	serve NAME TCPPORTS UDPPORTS   answer "NAME <peer address>" on every port until stdin closes
//	probe tcp|udp ADDR:PORT        print the answer; exit 3 when nothing answers in time
//	udpfrom SRC ADDR:PORT MESSAGE  send one datagram from source address SRC
//	watch ADDR:PORT EVERY          a new TCP connection every EVERY until stdin closes (see connWatch)
func policyHelper(args []string) (int, error) {
	if len(args) == 0 {
		return 1, errors.New("no command")
	}
	switch {
	case args[0] == "serve" && len(args) == 4:
		return serveAll(args[1], args[2], args[3])
	case args[0] == "probe" && len(args) == 3:
		return probe(args[1], args[2])
	case args[0] == "watch" && len(args) == 3:
		every, err := time.ParseDuration(args[2])
		if err != nil {
			return 1, err
		}
		return watchTCP(args[1], every)
	case args[0] == "udpfrom" && len(args) == 4:
		src, err := net.ResolveUDPAddr("udp4", args[1]+":0")
		if err != nil {
			return 1, err
		}
		dst, err := net.ResolveUDPAddr("udp4", args[2])
		if err != nil {
			return 1, err
		}
		c, err := net.DialUDP("udp4", src, dst)
		if err != nil {
			return 1, err
		}
		defer c.Close()
		_, err = c.Write([]byte(args[3]))
		if err != nil {
			return 1, err
		}
		return 0, nil
	}
	return 1, fmt.Errorf("bad arguments %q", args)
}

func ports(list string) []int {
	var out []int
	for _, p := range strings.Split(list, ",") {
		if n, err := strconv.Atoi(p); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// serveAll listens on every TCP and UDP port and answers each connection or
// datagram with the server's name and the peer's address; every datagram is
// also logged to stdout as "udp <peer> <payload>". It ends when stdin
// closes, so that it never outlives the test.
func serveAll(name, tcpPorts, udpPorts string) (int, error) {
	out := make(chan string, 64)
	for _, p := range ports(tcpPorts) {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p)) // both families (explain_test.go probes IPv6 too)
		if err != nil {
			return 1, err
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				peer := c.RemoteAddr().(*net.TCPAddr).IP
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				fmt.Fprintf(c, "%s %s\n", name, peer)
				_ = c.Close()
			}
		}()
	}
	for _, p := range ports(udpPorts) {
		pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", p))
		if err != nil {
			return 1, err
		}
		go func() {
			buf := make([]byte, 1500)
			for {
				n, peer, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				ip := peer.(*net.UDPAddr).IP
				out <- fmt.Sprintf("udp %s %s", ip, buf[:n])
				_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s %s\n", name, ip)), peer)
			}
		}()
	}
	fmt.Println("ready")
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(done) }()
	for {
		select {
		case l := <-out:
			fmt.Println(l)
		case <-done:
			return 0, nil
		}
	}
}

func probe(proto, addr string) (int, error) {
	switch proto {
	case "tcp":
		c, err := net.DialTimeout("tcp", addr, probeTimeout)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return exitBlocked, err
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return exitBlocked, err
			}
			if strings.Contains(err.Error(), "refused") {
				return exitRefused, err
			}
			return 1, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(probeTimeout))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return 1, err
		}
		fmt.Print(line)
		return 0, nil
	case "udp":
		c, err := net.Dial("udp", addr)
		if err != nil {
			return 1, err
		}
		defer c.Close()
		if _, err := c.Write([]byte("ping")); err != nil {
			return 1, err
		}
		_ = c.SetReadDeadline(time.Now().Add(probeTimeout))
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return exitBlocked, err
			}
			return 1, err
		}
		fmt.Print(string(buf[:n]))
		return 0, nil
	}
	return 1, fmt.Errorf("protocol %q", proto)
}

// policyServer is a serveAll process in a namespace.
type policyServer struct {
	cmd   *exec.Cmd
	stdin io.Closer
	lines chan string
}

// startPolicyServer starts serveAll in the namespace of target (a pod,
// "tor", …) and stops it when the test ends.
func startPolicyServer(t *testing.T, l *lab.Lab, target, name string, tcp, udp []int) *policyServer {
	t.Helper()
	return startPolicyServerIn(t, netnsPath(t, l, target), name, tcp, udp)
}

// startPolicyServerIn starts serveAll in the network namespace at path ns
// (a Kubernetes pod's, say) and stops it when the test ends.
func startPolicyServerIn(t *testing.T, ns, name string, tcp, udp []int) *policyServer {
	t.Helper()
	join := func(ps []int) string {
		var s []string
		for _, p := range ps {
			s = append(s, strconv.Itoa(p))
		}
		return strings.Join(s, ",")
	}
	cmd := exec.Command("nsenter", "--net="+ns, "--", os.Args[0], "-test.run=^TestPolicyHelperProcess$", "--", "serve", name, join(tcp), join(udp))
	cmd.Env = append(os.Environ(), policyHelperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &policyServer{cmd: cmd, stdin: stdin, lines: make(chan string, 256)}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	rd := bufio.NewReader(stdout)
	if line, err := rd.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("server %s in %s did not start: %q %v %s", name, ns, line, err, stderr.String())
	}
	go func() {
		defer close(s.lines)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			s.lines <- strings.TrimSpace(line)
		}
	}()
	return s
}

// probeResult is what a probe saw.
type probeResult struct {
	allowed bool
	answer  string // "NAME <peer address>" when allowed
	err     error  // a failure that is neither an answer nor a drop
}

// probeFrom connects from the namespace of target to addr with proto.
func probeFrom(ctx context.Context, t *testing.T, l *lab.Lab, target, proto string, addr netip.AddrPort) probeResult {
	return probeIn(ctx, netnsPath(t, l, target), proto, addr)
}

// probeIn connects from the network namespace at path ns to addr with proto.
func probeIn(ctx context.Context, ns, proto string, addr netip.AddrPort) probeResult {
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+ns, "--", os.Args[0], "-test.run=^TestPolicyHelperProcess$", "--", "probe", proto, addr.String())
	cmd.Env = append(os.Environ(), policyHelperEnv+"=1")
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return probeResult{allowed: true, answer: strings.TrimSpace(string(out))}
	case errors.As(err, &ee) && ee.ExitCode() == exitBlocked:
		return probeResult{}
	case errors.As(err, &ee):
		return probeResult{err: fmt.Errorf("probe exited %d: %s", ee.ExitCode(), ee.Stderr)}
	}
	return probeResult{err: err}
}
