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
	// Track, when set, keeps the set of the IPv4 prefixes it takes that
	// the peer announces on the session (announced and not withdrawn
	// since), for Held: the harness knows a reflector has sent a client
	// everything only when the client holds every simulated block, not
	// when the UPDATEs merely stopped (a stalled sender stops them too).
	Track func(netip.Prefix) bool
}

// SimSession runs BGP on one connection for a simulated node. Announce and
// Withdraw are safe for concurrent use once Established is closed.
//
// Its reader and its keepalives are independent: KEEPALIVEs go out from a
// goroutine of their own on a timer (hold/3), whatever the reader is doing,
// and the reader only frames what the peer sends (into one reused buffer;
// UPDATEs are parsed only for OnUpdate). So a simulated node reading a
// reflector's full table on a loaded host still keeps its side of the
// session alive, and when a session ends, SimDrop says which side ended it.
type SimSession struct {
	conn        net.Conn
	cfg         SimConfig
	wmu         sync.Mutex
	established chan struct{}
	hold        time.Duration
	updates     atomic.Uint64
	// upAt is when the session was established (unix ns, 0 before);
	// lastRead when the peer's last message arrived; sinceUp counts the
	// peer's messages after the one that established it.
	upAt, lastRead atomic.Int64
	sinceUp        atomic.Uint64
	keepalives     atomic.Uint64
	drop           atomic.Pointer[SimDrop]
	// held is the set of Track (written by the reader, under heldMu),
	// heldN its size.
	heldMu sync.Mutex
	held   map[uint64]struct{}
	heldN  atomic.Int64
}

// Updates is how many UPDATE messages the peer has sent so far.
func (s *SimSession) Updates() uint64 { return s.updates.Load() }

// Held is how many of the IPv4 prefixes SimConfig.Track takes the peer
// announces on the session now (0 without Track).
func (s *SimSession) Held() int { return int(s.heldN.Load()) }

// EstablishedAt is when the session was established (zero before).
func (s *SimSession) EstablishedAt() time.Time {
	if ns := s.upAt.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// ReceivedSinceEstablished is how many messages (KEEPALIVEs, UPDATEs) the
// peer sent after the KEEPALIVE that established the session: a speaker
// whose sending works sends its table or a KEEPALIVE within hold/3.
func (s *SimSession) ReceivedSinceEstablished() uint64 { return s.sinceUp.Load() }

// NewSimSession wraps an open TCP connection to the peer (accepted or
// dialled; the caller chooses which side connects).
func NewSimSession(conn net.Conn, cfg SimConfig) *SimSession {
	if cfg.HoldTime == 0 {
		cfg.HoldTime = 90 * time.Second
	}
	s := &SimSession{conn: conn, cfg: cfg, established: make(chan struct{}), hold: cfg.HoldTime}
	if cfg.Track != nil {
		s.held = map[uint64]struct{}{}
	}
	return s
}

// Established is closed when the session is established.
func (s *SimSession) Established() <-chan struct{} { return s.established }

// Run opens the session, keeps it alive and reads (and drops) what the
// peer sends until ctx is done, the peer closes or sends a NOTIFICATION, a
// hold time passes without a message, or a write fails. It closes the
// connection. It returns ctx's error when ctx ended it, and otherwise a
// *SimDrop saying why the session ended.
func (s *SimSession) Run(ctx context.Context) error {
	defer s.conn.Close()
	stop := context.AfterFunc(ctx, func() { s.conn.Close() })
	defer stop()
	err := s.run()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if d := s.drop.Load(); d != nil {
		return d // the first failure; a later one is its echo
	}
	return s.dropped(err)
}

func (s *SimSession) run() error {
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
	rd := &simReader{r: bufio.NewReaderSize(s.conn, 64<<10), conn: s.conn}
	typ, body, err := rd.next(s.cfg.HoldTime)
	if err != nil {
		return err
	}
	s.lastRead.Store(time.Now().UnixNano())
	if typ == gobgp.BGP_MSG_NOTIFICATION {
		return notification(body)
	}
	if typ != gobgp.BGP_MSG_OPEN {
		return &simProtocolError{fmt.Sprintf("peer sent message type %d, want OPEN", typ)}
	}
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
	err = s.readLoop(rd)
	// Recorded before the keepalives stop, so that a write failing
	// after the peer closed does not take the blame.
	s.drop.CompareAndSwap(nil, s.dropped(err))
	return err
}

// keepalive sends a KEEPALIVE every hold/3 until done or a write fails
// (which ends the session: send closes the connection).
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
func (s *SimSession) readLoop(rd *simReader) error {
	limit := s.hold
	if limit == 0 {
		limit = 24 * time.Hour
	}
	for {
		typ, body, err := rd.next(limit)
		if err != nil {
			return err
		}
		s.lastRead.Store(time.Now().UnixNano())
		if s.upAt.Load() != 0 {
			s.sinceUp.Add(1)
		}
		switch typ {
		case gobgp.BGP_MSG_KEEPALIVE:
			s.keepalives.Add(1)
			if s.upAt.Load() == 0 {
				s.upAt.Store(time.Now().UnixNano())
				close(s.established)
			}
		case gobgp.BGP_MSG_UPDATE:
			s.updates.Add(1)
			if s.cfg.OnUpdate == nil && s.cfg.Track == nil {
				continue
			}
			in, out := updatePrefixes(body)
			if s.cfg.Track != nil {
				s.track(in, out)
			}
			if s.cfg.OnUpdate != nil && len(in) > 0 {
				s.cfg.OnUpdate(in)
			}
		case gobgp.BGP_MSG_NOTIFICATION:
			return notification(body)
		}
	}
}

// track applies an UPDATE's announced (in) and withdrawn (out) prefixes
// to the held set. Keys are IPv4 address and length in one word: no
// pointer for the collector to follow in a harness holding a thousand
// prefixes on each of two thousand sessions.
func (s *SimSession) track(in, out []netip.Prefix) {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	for _, p := range out {
		delete(s.held, heldKey(p))
	}
	for _, p := range in {
		if s.cfg.Track(p) {
			s.held[heldKey(p)] = struct{}{}
		}
	}
	s.heldN.Store(int64(len(s.held)))
}

func heldKey(p netip.Prefix) uint64 {
	a := p.Addr().As4()
	return uint64(binary.BigEndian.Uint32(a[:]))<<8 | uint64(p.Bits())
}

// Lacks returns up to max of the prefixes of want that the peer does not
// announce on the session now (with SimConfig.Track; none without), for a
// harness to name what a reflector did not send.
func (s *SimSession) Lacks(want []netip.Prefix, max int) []netip.Prefix {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	var out []netip.Prefix
	if s.held == nil {
		return nil
	}
	for _, p := range want {
		if _, ok := s.held[heldKey(p)]; !ok {
			if out = append(out, p); len(out) == max {
				break
			}
		}
	}
	return out
}

// announced returns the IPv4 prefixes an UPDATE's body announces (none if
// it does not parse: the session only observes them).
func announced(body []byte) []netip.Prefix {
	in, _ := updatePrefixes(body)
	return in
}

// updatePrefixes returns the IPv4 prefixes an UPDATE's body announces and
// those it withdraws (none if it does not parse).
func updatePrefixes(body []byte) (in, out []netip.Prefix) {
	h := &gobgp.BGPHeader{Len: uint16(gobgp.BGP_HEADER_LENGTH + len(body)), Type: gobgp.BGP_MSG_UPDATE}
	m, err := gobgp.ParseBGPBody(h, body)
	if err != nil {
		return nil, nil
	}
	u, ok := m.Body.(*gobgp.BGPUpdate)
	if !ok {
		return nil, nil
	}
	return ipv4Prefixes(u.NLRI), ipv4Prefixes(u.WithdrawnRoutes)
}

func ipv4Prefixes(nlri []gobgp.PathNLRI) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range nlri {
		if p, ok := n.NLRI.(*gobgp.IPAddrPrefix); ok {
			out = append(out, p.Prefix.Masked())
		}
	}
	return out
}

// simReader frames the peer's messages into one reused buffer (a body is
// valid until the next call), arming the read deadline at most once a
// second: the hold timer then fires between limit-1s and limit after the
// last message, without a timer update per message of a full table.
type simReader struct {
	r       *bufio.Reader
	conn    net.Conn
	buf     []byte
	armedAt time.Time
}

// next reads one message (type and body); nothing for limit is an error
// wrapping os.ErrDeadlineExceeded.
func (rd *simReader) next(limit time.Duration) (uint8, []byte, error) {
	if now := time.Now(); now.Sub(rd.armedAt) >= time.Second || limit < 2*time.Second {
		if err := rd.conn.SetReadDeadline(now.Add(limit)); err != nil {
			return 0, nil, err
		}
		rd.armedAt = now
	}
	var hdr [gobgp.BGP_HEADER_LENGTH]byte
	if _, err := io.ReadFull(rd.r, hdr[:]); err != nil {
		return 0, nil, fmt.Errorf("sim session: reading: %w", err)
	}
	n := int(binary.BigEndian.Uint16(hdr[16:18]))
	if n < gobgp.BGP_HEADER_LENGTH || n > 65535 {
		return 0, nil, &simProtocolError{fmt.Sprintf("bad message length %d", n)}
	}
	if cap(rd.buf) < n-gobgp.BGP_HEADER_LENGTH {
		rd.buf = make([]byte, n-gobgp.BGP_HEADER_LENGTH, max(4096, n-gobgp.BGP_HEADER_LENGTH))
	}
	body := rd.buf[:n-gobgp.BGP_HEADER_LENGTH]
	if _, err := io.ReadFull(rd.r, body); err != nil {
		return 0, nil, fmt.Errorf("sim session: reading: %w", err)
	}
	return hdr[18], body, nil
}

// send writes one message. A failed write ends the session (a partial
// write leaves the stream unframed): the drop is recorded and the
// connection closed, which ends the reader.
func (s *SimSession) send(m *gobgp.BGPMessage) error {
	b, err := m.Serialize()
	if err != nil {
		return fmt.Errorf("sim session: serializing: %w", err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	// As long as the peer's hold time: a peer that reads nothing for
	// that long has let its own hold timer expire anyway.
	err = s.conn.SetWriteDeadline(time.Now().Add(s.cfg.HoldTime))
	if err == nil {
		_, err = s.conn.Write(b)
	}
	if err != nil {
		err = fmt.Errorf("sim session: writing: %w", err)
		d := s.dropped(err)
		if d.Cause != SimPeerClosed {
			d.Side, d.Cause = SimSideLocal, SimWriteFailed
		}
		s.drop.CompareAndSwap(nil, d)
		s.conn.Close()
		return err
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
