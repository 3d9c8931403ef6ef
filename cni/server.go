package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// readTimeout bounds how long a client may take to send its request.
const readTimeout = 10 * time.Second

// Observer is told about every request the server answered: the command,
// how long it took and the CNI error it returned (a *types.Error), or nil.
type Observer func(cmd string, dur time.Duration, err error)

// Option configures a Server.
type Option func(*Server)

// WithObserver makes the server call o after every request, e.g. to record
// metrics. o must be safe for concurrent use.
func WithObserver(o Observer) Option {
	return func(s *Server) { s.observer = o }
}

// Server is the agent side of the shim protocol: it listens on a unix
// socket and hands each request to a Handler.
type Server struct {
	path     string
	handler  Handler
	log      *slog.Logger
	observer Observer

	locks   KeyedLocks
	ready   chan struct{}
	started sync.Once
}

// NewServer returns a server for the socket at path. A nil log logs nothing.
func NewServer(path string, h Handler, log *slog.Logger, opts ...Option) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{path: path, handler: h, log: log, ready: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Ready is closed once the socket accepts connections.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Run serves until ctx is done, then stops accepting, waits for the requests
// in flight and removes the socket. It replaces a stale socket file, creates
// the parent directory (mode 0700) if needed and makes the socket mode 0600.
// Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	first := false
	s.started.Do(func() { first = true })
	if !first {
		return errors.New("cni server: Run called twice")
	}
	ln, err := s.listen()
	if err != nil {
		return err
	}
	close(s.ready)
	s.log.Info("serving CNI requests", "socket", s.path)

	defer ln.Close() // also removes the socket file
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()

	var wg sync.WaitGroup
	defer wg.Wait()
	backoff := 5 * time.Millisecond
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accepting on %s: %w", s.path, err)
			}
			// Out of file descriptors or similar: wait a little and go on.
			s.log.Warn("accepting CNI connection", "err", err)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		wg.Go(func() { s.serveConn(ctx, conn) })
	}
}

func (s *Server) listen() (*net.UnixListener, error) {
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating socket directory %s: %w", dir, err)
	}
	fi, err := os.Lstat(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("checking socket path %s: %w", s.path, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("socket path %s exists and is not a socket (mode %s)", s.path, fi.Mode())
	default:
		// A socket left over by a previous agent that did not shut down.
		if err := os.Remove(s.path); err != nil {
			return nil, fmt.Errorf("removing stale socket %s: %w", s.path, err)
		}
	}
	return ListenUnixPrivate(s.path)
}

// serveConn answers the one request of conn.
func (s *Server) serveConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	start := time.Now()
	var req Request
	var resp Response
	if err := conn.SetReadDeadline(start.Add(readTimeout)); err != nil {
		s.log.Warn("setting CNI connection deadline", "err", err)
		return
	}
	if err := json.NewDecoder(io.LimitReader(conn, maxMessageSize)).Decode(&req); err != nil {
		resp.Error = types.NewError(types.ErrDecodingFailure, "decoding the request", err.Error())
	} else {
		resp = s.serve(ctx, &req)
	}
	dur := time.Since(start)
	if s.observer != nil {
		var err error
		if resp.Error != nil {
			err = resp.Error
		}
		s.observer(req.Command, dur, err)
	}
	log := s.log.With("cmd", req.Command, "container", req.ContainerID, "dur", dur)
	if resp.Error != nil {
		log.Warn("CNI request failed", "code", resp.Error.Code, "err", resp.Error.Msg, "details", resp.Error.Details)
	} else {
		log.Info("CNI request done")
	}

	payload, err := json.Marshal(&resp)
	if err != nil {
		payload, _ = json.Marshal(&Response{Error: types.NewError(types.ErrInternal, "encoding the response", err.Error())})
	}
	if err := conn.SetWriteDeadline(time.Now().Add(readTimeout)); err != nil {
		log.Warn("setting CNI connection deadline", "err", err)
		return
	}
	if _, err := conn.Write(payload); err != nil {
		// The shim gave up (its deadline passed) or died; it reports that itself.
		log.Warn("sending CNI response", "err", err)
	}
}

// serve parses, serialises and dispatches one request.
func (s *Server) serve(ctx context.Context, req *Request) (resp Response) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("CNI handler panicked", "panic", p, "stack", string(debug.Stack()))
			resp = Response{Error: types.NewError(types.ErrInternal, fmt.Sprintf("tabby-agent failed: %v", p), "")}
		}
	}()
	conf, args, prev, err := parseRequest(req)
	if err != nil {
		return Response{Error: toCNIError(err)}
	}
	deadline := req.Deadline
	if deadline.IsZero() {
		deadline = time.Now().Add(conf.Timeout(req.Command))
	}
	// Finish a little before the shim gives up, so that the agent's own
	// error rather than the shim's bare timeout reaches the runtime.
	deadline = deadline.Add(-max(0, min(500*time.Millisecond, time.Until(deadline)/10)))
	// Requests in flight finish even when the server shuts down.
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()

	switch req.Command {
	case "STATUS":
		return Response{Error: toStatusError(s.handler.Status(ctx, conf))}
	case "GC":
		return Response{Error: toCNIError(s.handler.GC(ctx, conf, conf.ValidAttachments))}
	}

	unlock, err := s.locks.Lock(ctx, req.ContainerID)
	if err != nil {
		return Response{Error: types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("timed out waiting for another operation on container %s", req.ContainerID), err.Error())}
	}
	defer unlock()

	switch req.Command {
	case "ADD":
		res, err := s.handler.Add(ctx, req, conf, args)
		if err != nil {
			return Response{Error: toCNIError(err)}
		}
		if res == nil {
			return Response{Error: types.NewError(types.ErrInternal, "tabby-agent produced no result for ADD", "")}
		}
		out, err := res.GetAsVersion(conf.CNIVersion)
		if err != nil {
			return Response{Error: types.NewError(types.ErrIncompatibleCNIVersion,
				fmt.Sprintf("converting the result to version %s", conf.CNIVersion), err.Error())}
		}
		raw, err := json.Marshal(out)
		if err != nil {
			return Response{Error: types.NewError(types.ErrInternal, "encoding the result", err.Error())}
		}
		return Response{Result: raw}
	case "DEL":
		return Response{Error: toCNIError(s.handler.Del(ctx, req, conf, args))}
	default: // CHECK; parseRequest admits no other command
		return Response{Error: toCNIError(s.handler.Check(ctx, req, conf, args, prev))}
	}
}

// toCNIError maps a handler error to the CNI error the runtime sees: a
// *types.Error anywhere in the chain as is, a deadline as "try again later",
// anything else as an internal error carrying the message.
func toCNIError(err error) *types.Error {
	if err == nil {
		return nil
	}
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "tabby-agent ran out of time for this request")
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// toStatusError is toCNIError for STATUS, whose plain failures mean "cannot
// serve ADD now" (code 50).
func toStatusError(err error) *types.Error {
	var te *types.Error
	if err == nil || errors.As(err, &te) {
		return toCNIError(err)
	}
	return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
}
