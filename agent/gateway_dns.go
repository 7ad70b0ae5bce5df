// The gateway's DNS: a minimal message parser and writer (RFC 1035), the server a session asks (UDP and TCP)
// and the client the gateway resolves allowed names with.

package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

const (
	dnsTypeA     = 1
	dnsClassIN   = 1
	dnsRcodeOK   = 0
	dnsFormErr   = 1
	dnsServFail  = 2
	dnsNXDomain  = 3
	dnsNotImp    = 4
	dnsRefused   = 5
	dnsAnswerTTL = 5
	dnsMaxUDP    = 512
	dnsMaxName   = 255
)

var errDNSShort = errors.New("dns: message too short")

type dnsHeader struct {
	id, flags, qd, an, ns, ar uint16
}

func readDNSHeader(m []byte) (dnsHeader, error) {
	if len(m) < 12 {
		return dnsHeader{}, errDNSShort
	}
	u := func(i int) uint16 { return binary.BigEndian.Uint16(m[i:]) }
	return dnsHeader{u(0), u(2), u(4), u(6), u(8), u(10)}, nil
}

// readDNSName reads the name at off (following compression pointers, at most 32, never forward past the
// message) and returns it lower-cased without the trailing dot, and the offset after it where it started.
func readDNSName(m []byte, off int) (string, int, error) {
	var b strings.Builder
	next := -1
	hops := 0
	for {
		if off >= len(m) {
			return "", 0, errDNSShort
		}
		l := int(m[off])
		switch {
		case l == 0:
			if next < 0 {
				next = off + 1
			}
			if b.Len() > dnsMaxName {
				return "", 0, errors.New("dns: name too long")
			}
			return strings.ToLower(b.String()), next, nil
		case l&0xC0 == 0xC0:
			if off+1 >= len(m) {
				return "", 0, errDNSShort
			}
			if hops++; hops > 32 {
				return "", 0, errors.New("dns: compression loop")
			}
			if next < 0 {
				next = off + 2
			}
			off = int(binary.BigEndian.Uint16(m[off:]) & 0x3FFF)
		case l&0xC0 != 0:
			return "", 0, errors.New("dns: bad label type")
		default:
			if off+1+l > len(m) {
				return "", 0, errDNSShort
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.Write(m[off+1 : off+1+l])
			if b.Len() > dnsMaxName {
				return "", 0, errors.New("dns: name too long")
			}
			off += 1 + l
		}
	}
}

// appendDNSName writes name (dotted, no trailing dot) uncompressed.
func appendDNSName(b []byte, name string) ([]byte, error) {
	name = strings.TrimSuffix(name, ".")
	if len(name) > 253 {
		return nil, errors.New("dns: name too long")
	}
	if name != "" {
		for _, label := range strings.Split(name, ".") {
			if label == "" || len(label) > 63 {
				return nil, fmt.Errorf("dns: bad label in %q", name)
			}
			b = append(b, byte(len(label)))
			b = append(b, label...)
		}
	}
	return append(b, 0), nil
}

// dnsQuery is a parsed question.
type dnsQuery struct {
	hdr    dnsHeader
	name   string
	qtype  uint16
	qclass uint16
	qend   int // the end of the question in the message
}

func parseDNSQuery(m []byte) (dnsQuery, error) {
	var q dnsQuery
	var err error
	if q.hdr, err = readDNSHeader(m); err != nil {
		return q, err
	}
	if q.hdr.qd != 1 {
		return q, errors.New("dns: not one question")
	}
	var off int
	if q.name, off, err = readDNSName(m, 12); err != nil {
		return q, err
	}
	for i := 12; i < off-1; i += 1 + int(m[i]) {
		if m[i]&0xC0 != 0 {
			return q, errors.New("dns: a compressed question") // the reply copies the question as asked
		}
	}
	if off+4 > len(m) {
		return q, errDNSShort
	}
	q.qtype = binary.BigEndian.Uint16(m[off:])
	q.qclass = binary.BigEndian.Uint16(m[off+2:])
	q.qend = off + 4
	return q, nil
}

// dnsReply answers query m (whose question is q) with rcode and, when a is set, one A record.
func dnsReply(m []byte, q dnsQuery, rcode int, a net.IP) []byte {
	out := make([]byte, 12, 12+q.qend+16)
	binary.BigEndian.PutUint16(out[0:], q.hdr.id)
	// QR, the query's opcode and RD, RA; no AA
	flags := uint16(0x8000) | q.hdr.flags&0x7900 | 0x0080 | uint16(rcode&0xF)
	binary.BigEndian.PutUint16(out[2:], flags)
	if q.qend > 12 {
		binary.BigEndian.PutUint16(out[4:], 1)
		out = append(out, m[12:q.qend]...) // the question as asked (its case kept, for 0x20 clients)
	}
	if a4 := a.To4(); a4 != nil {
		binary.BigEndian.PutUint16(out[6:], 1)
		out = append(out, 0xC0, 12, 0, dnsTypeA, 0, dnsClassIN, 0, 0, 0, dnsAnswerTTL, 0, 4)
		out = append(out, a4...)
	}
	return out
}

// dnsAnswer decides one query from client and returns the reply (nil: no reply at all).
func (g *gateway) dnsAnswer(m []byte, client string) []byte {
	q, err := parseDNSQuery(m)
	if err != nil {
		if len(m) < 12 || q.hdr.flags&0x8000 != 0 {
			return nil // too short to answer, or a response: never answer one
		}
		return dnsReply(m, dnsQuery{hdr: q.hdr}, dnsFormErr, nil)
	}
	if q.hdr.flags&0x8000 != 0 {
		return nil
	}
	st := g.state.Load()
	sess := st.sessions[client]
	if sess == nil {
		if g.dnsDedup.first(client + " refuse " + q.name) {
			g.auditf(st, nil, client, "dns", q.name, 53, false, "unknown client", "")
		}
		return dnsReply(m, q, dnsRefused, nil)
	}
	if opcode := (q.hdr.flags >> 11) & 0xF; opcode != 0 {
		return dnsReply(m, q, dnsNotImp, nil)
	}
	if !sess.nameAllowed(q.name) {
		if g.dnsDedup.first(client + " refuse " + q.name) {
			g.auditf(st, sess, client, "dns", q.name, 53, false, "not allowed", "")
		}
		return dnsReply(m, q, dnsNXDomain, nil)
	}
	if q.qclass != dnsClassIN || q.qtype != dnsTypeA {
		return dnsReply(m, q, dnsRcodeOK, nil) // NOERROR, no data: AAAA, HTTPS (no ECH keys), anything else
	}
	if g.dnsDedup.first(client + " allow " + q.name) {
		g.auditf(st, sess, client, "dns", q.name, 53, true, "allowed", "")
	}
	return dnsReply(m, q, dnsRcodeOK, st.listenIP)
}

func (g *gateway) serveDNSUDP(pc net.PacketConn) {
	buf := make([]byte, 4096)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if reply := g.dnsAnswer(buf[:n], addrIP(from)); reply != nil {
			_, _ = pc.WriteTo(reply, from)
		}
	}
}

func (g *gateway) serveDNSTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go func() {
			defer c.Close()
			client := addrIP(c.RemoteAddr())
			var lb [2]byte
			for {
				_ = c.SetDeadline(time.Now().Add(g.headTimeout))
				if _, err := io.ReadFull(c, lb[:]); err != nil {
					return
				}
				m := make([]byte, binary.BigEndian.Uint16(lb[:]))
				if _, err := io.ReadFull(c, m); err != nil {
					return
				}
				reply := g.dnsAnswer(m, client)
				if reply == nil {
					return
				}
				out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(reply)), uint16(len(reply)))
				if _, err := c.Write(append(out, reply...)); err != nil {
					return
				}
			}
		}()
	}
}

// gwDedup keeps one audit line per client, decision and name and second (a lookup asks A and AAAA, a resolver
// retries); a decision that changes within the second (a live policy change) is a line of its own.
type gwDedup struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

func newDedup() *gwDedup { return &gwDedup{seen: map[string]time.Time{}} }

func (d *gwDedup) first(key string) bool {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if t, ok := d.seen[key]; ok && now.Sub(t) < time.Second {
		return false
	}
	if len(d.seen) >= 4096 {
		for k, t := range d.seen {
			if now.Sub(t) >= time.Second {
				delete(d.seen, k)
			}
		}
		if len(d.seen) >= 4096 {
			d.seen = map[string]time.Time{}
		}
	}
	d.seen[key] = now
	return true
}

// gwResolver resolves allowed names (A records) through the configured resolver, with a small cache.
type gwResolver struct {
	g       *gateway
	mu      sync.Mutex
	cache   map[string]gwResolved
	flights map[string]*gwFlight // lookups under way
}

type gwResolved struct {
	ips     []net.IP
	expires time.Time
}

func newResolver(g *gateway) *gwResolver {
	return &gwResolver{g: g, cache: map[string]gwResolved{}, flights: map[string]*gwFlight{}}
}

// server is the resolver's address: gateway.json's, else /etc/resolv.conf's first nameserver.
func (r *gwResolver) server(st *gwState) (string, error) {
	if st != nil && st.cfg.Resolver != "" {
		if _, _, err := net.SplitHostPort(st.cfg.Resolver); err != nil {
			return net.JoinHostPort(st.cfg.Resolver, "53"), nil
		}
		return st.cfg.Resolver, nil
	}
	data, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			return net.JoinHostPort(f[1], "53"), nil
		}
	}
	return "", errors.New("no nameserver in /etc/resolv.conf")
}

func (r *gwResolver) flush() {
	r.mu.Lock()
	r.cache = map[string]gwResolved{}
	r.mu.Unlock()
}

// lookup answers from the cache, else asks the resolver; concurrent lookups of one name share one query.
func (r *gwResolver) lookup(ctx context.Context, name string) ([]net.IP, error) {
	now := time.Now()
	r.mu.Lock()
	if c, ok := r.cache[name]; ok && now.Before(c.expires) {
		r.mu.Unlock()
		return c.ips, nil
	}
	f, waiting := r.flights[name]
	if !waiting {
		f = &gwFlight{done: make(chan struct{})}
		r.flights[name] = f
	}
	r.mu.Unlock()
	if !waiting {
		go r.resolve(name, f)
	}
	select {
	case <-f.done:
		return f.ips, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type gwFlight struct {
	done chan struct{}
	ips  []net.IP
	err  error
}

func (r *gwResolver) resolve(name string, f *gwFlight) {
	defer close(f.done)
	ctx, cancel := context.WithTimeout(context.Background(), gwDialTimeout)
	defer cancel()
	server, err := r.server(r.g.state.Load())
	var ttl uint32
	if err == nil {
		f.ips, ttl, err = dnsLookupA(ctx, server, name)
	}
	f.err = err
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.flights, name)
	if err != nil {
		return
	}
	if len(r.cache) >= 4096 {
		r.cache = map[string]gwResolved{}
	}
	r.cache[name] = gwResolved{ips: f.ips, expires: time.Now().Add(time.Duration(min(max(ttl, 1), 60)) * time.Second)}
}

// dnsLookupA asks server for name's A records (UDP, TCP when truncated), at most 3 tries of 2 s.
func dnsLookupA(ctx context.Context, server, name string) ([]net.IP, uint32, error) {
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD, one question
	q, err := appendDNSName(q, name)
	if err != nil {
		return nil, 0, err
	}
	q = append(q, 0, dnsTypeA, 0, dnsClassIN)
	var lastErr error
	for try := 0; try < 3; try++ {
		var resp []byte
		resp, lastErr = dnsExchange(ctx, "udp", server, q)
		if lastErr == nil {
			var tc bool
			ips, ttl, tc, err := parseDNSAnswer(resp, id, name)
			if err == nil && tc {
				if resp, err = dnsExchange(ctx, "tcp", server, q); err == nil {
					ips, ttl, _, err = parseDNSAnswer(resp, id, name)
				}
			}
			if err == nil {
				return ips, ttl, nil
			}
			var nx dnsError
			if errors.As(err, &nx) {
				return nil, 0, err
			}
			lastErr = err
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
	}
	return nil, 0, lastErr
}

type dnsError struct{ msg string }

func (e dnsError) Error() string { return e.msg }

func dnsExchange(ctx context.Context, network, server string, q []byte) ([]byte, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, network, server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	deadline := time.Now().Add(2 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.SetDeadline(deadline)
	if network == "tcp" {
		msg := binary.BigEndian.AppendUint16(nil, uint16(len(q)))
		if _, err := c.Write(append(msg, q...)); err != nil {
			return nil, err
		}
		var lb [2]byte
		if _, err := io.ReadFull(c, lb[:]); err != nil {
			return nil, err
		}
		resp := make([]byte, binary.BigEndian.Uint16(lb[:]))
		_, err := io.ReadFull(c, resp)
		return resp, err
	}
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		if n >= 2 && binary.BigEndian.Uint16(buf) == binary.BigEndian.Uint16(q) {
			return buf[:n], nil
		}
	}
}

// parseDNSAnswer reads a response to the query id for name: its A records (of any name in the answer: the
// chain of CNAMEs a recursive resolver adds) and the smallest TTL; tc when truncated.
func parseDNSAnswer(m []byte, id uint16, name string) ([]net.IP, uint32, bool, error) {
	h, err := readDNSHeader(m)
	if err != nil {
		return nil, 0, false, err
	}
	if h.id != id || h.flags&0x8000 == 0 {
		return nil, 0, false, errors.New("dns: not the answer")
	}
	if h.flags&0x0200 != 0 {
		return nil, 0, true, nil
	}
	switch rc := h.flags & 0xF; rc {
	case dnsRcodeOK:
	case dnsNXDomain:
		return nil, 0, false, dnsError{"no such host " + name}
	default:
		return nil, 0, false, fmt.Errorf("dns: rcode %d for %s", rc, name)
	}
	off := 12
	for i := 0; i < int(h.qd); i++ {
		var qn string
		if qn, off, err = readDNSName(m, off); err != nil {
			return nil, 0, false, err
		}
		if off += 4; off > len(m) {
			return nil, 0, false, errDNSShort
		}
		if qn != strings.ToLower(strings.TrimSuffix(name, ".")) {
			return nil, 0, false, errors.New("dns: answer to another question")
		}
	}
	var ips []net.IP
	ttl := uint32(1 << 31)
	for i := 0; i < int(h.an); i++ {
		if _, off, err = readDNSName(m, off); err != nil {
			return nil, 0, false, err
		}
		if off+10 > len(m) {
			return nil, 0, false, errDNSShort
		}
		typ, class := binary.BigEndian.Uint16(m[off:]), binary.BigEndian.Uint16(m[off+2:])
		rttl, rdlen := binary.BigEndian.Uint32(m[off+4:]), int(binary.BigEndian.Uint16(m[off+8:]))
		off += 10
		if off+rdlen > len(m) {
			return nil, 0, false, errDNSShort
		}
		if typ == dnsTypeA && class == dnsClassIN && rdlen == 4 {
			ips = append(ips, net.IP(append([]byte(nil), m[off:off+4]...)))
			ttl = min(ttl, rttl)
		}
		off += rdlen
	}
	if len(ips) == 0 {
		return nil, 0, false, dnsError{"no address for " + name}
	}
	return ips, ttl, false, nil
}
