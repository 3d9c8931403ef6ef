package bgp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// The scale harness (lab/sim) simulates hundreds of nodes in one process.
// Each simulated node holds a real iBGP session with every route reflector
// and advertises its blocks over it, but a full GoBGP server per simulated
// node would cost megabytes and a dozen goroutines each. SimSession is the
// least a BGP speaker must do, built on GoBGP's packet library (this
// package is the one importer of GoBGP): OPEN, KEEPALIVE, UPDATE out;
// whatever the peer sends is read and dropped (its framing checked, its
// UPDATEs not parsed: a simulated node has no kernel to program).

// SimConfig configures one simulated node's side of a session.
type SimConfig struct {
	// ASN is the node's AS (the peer's too: iBGP).
	ASN uint32
	// RouterID is the node's router ID and the next hop of what it
	// advertises.
	RouterID netip.Addr
	// HoldTime proposed in OPEN; the session uses the smaller of it and
	// the peer's. Default 90 s.
	HoldTime time.Duration
	// OnUpdate, when set, is called from the session's reader with the
	// IPv4 prefixes each UPDATE from the peer announces (the harness
	// times a reflector's sending with it); nil leaves UPDATEs unparsed.
	OnUpdate func(announced []netip.Prefix)
}

// SimSession runs BGP on one connection for a simulated node. Announce and
// Withdraw are safe for concurrent use once Established is closed.
type SimSession struct {
	conn        net.Conn
	cfg         SimConfig
	wmu         sync.Mutex
	established chan struct{}
	hold        time.Duration
	updates     atomic.Uint64
}

// Updates is how many UPDATE messages the peer has sent so far.
func (s *SimSession) Updates() uint64 { return s.updates.Load() }

// NewSimSession wraps an open TCP connection to the peer (accepted or
// dialled; the caller chooses which side connects).
func NewSimSession(conn net.Conn, cfg SimConfig) *SimSession {
	if cfg.HoldTime == 0 {
		cfg.HoldTime = 90 * time.Second
	}
	return &SimSession{conn: conn, cfg: cfg, established: make(chan struct{})}
}

// Established is closed when the session is established.
func (s *SimSession) Established() <-chan struct{} { return s.established }

// Run opens the session, keeps it alive and reads (and drops) what the
// peer sends until ctx is done, the peer closes or sends a NOTIFICATION, or
// a hold time passes without a message. It closes the connection.
func (s *SimSession) Run(ctx context.Context) error {
	defer s.conn.Close()
	stop := context.AfterFunc(ctx, func() { s.conn.Close() })
	defer stop()
	if !s.cfg.RouterID.Is4() {
		return fmt.Errorf("sim session: router id %s is not IPv4", s.cfg.RouterID)
	}
	asn16 := uint16(s.cfg.ASN)
	if s.cfg.ASN > 0xffff {
		asn16 = 23456 // AS_TRANS; the 4-octet capability carries the real one
	}
	open, err := gobgp.NewBGPOpenMessage(asn16, uint16(s.cfg.HoldTime/time.Second), s.cfg.RouterID,
		[]gobgp.OptionParameterInterface{gobgp.NewOptionParameterCapability([]gobgp.ParameterCapabilityInterface{
			gobgp.NewCapMultiProtocol(gobgp.RF_IPv4_UC),
			gobgp.NewCapFourOctetASNumber(s.cfg.ASN),
		})})
	if err != nil {
		return fmt.Errorf("sim session: building open: %w", err)
	}
	if err := s.send(open); err != nil {
		return err
	}
	r := bufio.NewReaderSize(s.conn, 64<<10)
	typ, body, err := s.read(r, s.cfg.HoldTime)
	if err != nil {
		return err
	}
	if typ != gobgp.BGP_MSG_OPEN {
		return fmt.Errorf("sim session: peer sent message type %d, want OPEN", typ)
	}
	s.hold = s.cfg.HoldTime
	if len(body) >= 5 {
		if peer := time.Duration(binary.BigEndian.Uint16(body[3:5])) * time.Second; peer < s.hold {
			s.hold = peer
		}
	}
	if err := s.send(gobgp.NewBGPKeepAliveMessage()); err != nil {
		return err
	}
	done := make(chan struct{})
	defer close(done)
	if s.hold > 0 {
		go s.keepalive(done)
	}
	return s.readLoop(r)
}

func (s *SimSession) keepalive(done <-chan struct{}) {
	t := time.NewTicker(s.hold / 3)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			if s.send(gobgp.NewBGPKeepAliveMessage()) != nil {
				return
			}
		}
	}
}

// readLoop reads until an error; the first KEEPALIVE establishes.
func (s *SimSession) readLoop(r *bufio.Reader) error {
	limit := s.hold
	if limit == 0 {
		limit = 24 * time.Hour
	}
	for {
		typ, body, err := s.read(r, limit)
		if err != nil {
			return err
		}
		switch typ {
		case gobgp.BGP_MSG_KEEPALIVE:
			select {
			case <-s.established:
			default:
				close(s.established)
			}
		case gobgp.BGP_MSG_UPDATE:
			s.updates.Add(1)
			if s.cfg.OnUpdate != nil {
				if ps := announced(body); len(ps) > 0 {
					s.cfg.OnUpdate(ps)
				}
			}
		case gobgp.BGP_MSG_NOTIFICATION:
			code, sub := 0, 0
			if len(body) >= 2 {
				code, sub = int(body[0]), int(body[1])
			}
			return fmt.Errorf("sim session: peer sent notification %d/%d", code, sub)
		}
	}
}

// announced returns the IPv4 prefixes an UPDATE's body announces (none if
// it does not parse: the session only observes them).
func announced(body []byte) []netip.Prefix {
	h := &gobgp.BGPHeader{Len: uint16(gobgp.BGP_HEADER_LENGTH + len(body)), Type: gobgp.BGP_MSG_UPDATE}
	m, err := gobgp.ParseBGPBody(h, body)
	if err != nil {
		return nil
	}
	u, ok := m.Body.(*gobgp.BGPUpdate)
	if !ok {
		return nil
	}
	var out []netip.Prefix
	for _, n := range u.NLRI {
		if p, ok := n.NLRI.(*gobgp.IPAddrPrefix); ok {
			out = append(out, p.Prefix.Masked())
		}
	}
	return out
}

// read reads one message (type and body) within timeout.
func (s *SimSession) read(r *bufio.Reader, timeout time.Duration) (uint8, []byte, error) {
	if err := s.conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return 0, nil, err
	}
	var hdr [gobgp.BGP_HEADER_LENGTH]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, fmt.Errorf("sim session: reading: %w", err)
	}
	n := int(binary.BigEndian.Uint16(hdr[16:18]))
	if n < gobgp.BGP_HEADER_LENGTH || n > 65535 {
		return 0, nil, fmt.Errorf("sim session: bad message length %d", n)
	}
	body := make([]byte, n-gobgp.BGP_HEADER_LENGTH)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, fmt.Errorf("sim session: reading: %w", err)
	}
	return hdr[18], body, nil
}

func (s *SimSession) send(m *gobgp.BGPMessage) error {
	b, err := m.Serialize()
	if err != nil {
		return fmt.Errorf("sim session: serializing: %w", err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.conn.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	if _, err := s.conn.Write(b); err != nil {
		return fmt.Errorf("sim session: writing: %w", err)
	}
	return nil
}

// Announce advertises IPv4 prefixes with the node's router ID as next hop.
func (s *SimSession) Announce(prefixes []netip.Prefix) error {
	nlri, err := simNLRI(prefixes)
	if err != nil || len(nlri) == 0 {
		return err
	}
	nh, err := gobgp.NewPathAttributeNextHop(s.cfg.RouterID)
	if err != nil {
		return fmt.Errorf("sim session: next hop: %w", err)
	}
	attrs := []gobgp.PathAttributeInterface{
		gobgp.NewPathAttributeOrigin(gobgp.BGP_ORIGIN_ATTR_TYPE_IGP),
		gobgp.NewPathAttributeAsPath(nil),
		nh,
		gobgp.NewPathAttributeLocalPref(100),
	}
	return s.send(gobgp.NewBGPUpdateMessage(nil, attrs, nlri))
}

// Withdraw withdraws IPv4 prefixes.
func (s *SimSession) Withdraw(prefixes []netip.Prefix) error {
	nlri, err := simNLRI(prefixes)
	if err != nil || len(nlri) == 0 {
		return err
	}
	return s.send(gobgp.NewBGPUpdateMessage(nlri, nil, nil))
}

func simNLRI(prefixes []netip.Prefix) ([]gobgp.PathNLRI, error) {
	var out []gobgp.PathNLRI
	for _, p := range prefixes {
		if !p.Addr().Is4() {
			return nil, errors.New("sim session: only IPv4 prefixes")
		}
		n, err := gobgp.NewIPAddrPrefix(p.Masked())
		if err != nil {
			return nil, fmt.Errorf("sim session: prefix %s: %w", p, err)
		}
		out = append(out, gobgp.PathNLRI{NLRI: n})
	}
	return out, nil
}
