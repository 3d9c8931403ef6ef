package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"time"
)

// pprofHandler serves Go's runtime profiles under /debug/pprof/ on a mux
// of its own (not http.DefaultServeMux, and not the status API's: the
// profiles stay off unless --debug-pprof asks for them).
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// servePprof serves pprofHandler on addr (loopback: Config.Validate) until
// ctx ends.
func servePprof(ctx context.Context, addr netip.AddrPort, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		return fmt.Errorf("debug pprof listen %s: %w", addr, err)
	}
	log.Info("serving pprof profiles", "address", addr.String())
	// No WriteTimeout: a CPU profile answers after its ?seconds= window.
	srv := &http.Server{Handler: pprofHandler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
