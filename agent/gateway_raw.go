// Raw TCP ports of the gateway: every port a session's `name:port` entry names (never 53, 80, 443). The
// target is the session's one entry for the port, or, when it has several (or a wildcard), the SNI of the
// TLS ClientHello the stream starts with.

package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// syncRawPorts listens on every raw port the sessions name and closes the listeners of ports no session
// names any more (their connections go on). A port that cannot be bound is retried every 10 s.
func (g *gateway) syncRawPorts(st *gwState) {
	if st == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for port, ln := range g.raw {
		if !st.rawPorts[port] {
			ln.Close()
			delete(g.raw, port)
		}
	}
	now := time.Now()
	for port := range st.rawPorts {
		if g.raw[port] != nil || now.Before(g.rawRetry[port]) {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(st.listenIP.String(), strconv.Itoa(port)))
		if err != nil {
			g.rawRetry[port] = now.Add(10 * time.Second)
			g.logf("raw port %d: %v (retrying in 10 s)", port, err)
			continue
		}
		delete(g.rawRetry, port)
		ln = g.conns.wrap(ln)
		g.raw[port] = ln
		g.goServe(func() { acceptLoop(ln, func(c net.Conn) { g.handleRaw(c, port) }) })
	}
}

// rawEntries are the session's allow entries for port.
func (s *gwSession) rawEntries(port int) []gwEntry {
	var out []gwEntry
	for _, e := range s.allow {
		if e.port == port {
			out = append(out, e)
		}
	}
	return out
}

func (g *gateway) handleRaw(c net.Conn, port int) {
	client := addrIP(c.RemoteAddr())
	st := g.state.Load()
	sess := st.sessions[client]
	refuse := func(st *gwState, sess *gwSession, host, why string) {
		g.auditf(st, sess, client, "tcp", host, port, false, why, "")
		resetConn(c)
	}
	if sess == nil {
		refuse(st, nil, "", "unknown client")
		return
	}
	entries := sess.rawEntries(port)
	if len(entries) == 0 {
		refuse(st, sess, "", "no entry for the port")
		return
	}
	if len(entries) == 1 && !entries[0].wildcard && !entries[0].any {
		g.rawSingle(c, st, sess, client, entries[0].name, port)
		return
	}
	// several entries (or a wildcard): the ClientHello's SNI names the target
	_ = c.SetReadDeadline(time.Now().Add(g.headTimeout))
	raw, hello, err := readClientHello(c)
	st = g.state.Load()
	if sess = st.sessions[client]; sess == nil {
		refuse(st, nil, "", "unknown client")
		return
	}
	host := normHost(hello.sni)
	switch {
	case err != nil:
		refuse(st, sess, "", "several entries for the port and no TLS ClientHello")
		return
	case host == "" || isIPLiteral(host):
		refuse(st, sess, host, "several entries for the port and no SNI")
		return
	case hello.ech:
		refuse(st, sess, host, "encrypted ClientHello (its inner name is hidden)")
		return
	case !sess.allowed(host, port):
		refuse(st, sess, host, "not allowed")
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	up, err := g.dialUpstream(context.Background(), host, port)
	if err != nil {
		g.auditf(st, sess, client, "tcp", host, port, true, "upstream: "+err.Error(), "")
		resetConn(c)
		return
	}
	g.auditf(st, sess, client, "tcp", host, port, true, "by SNI", "")
	if _, err := up.Write(raw); err != nil {
		up.Close()
		resetConn(c)
		return
	}
	splice(c, up)
}

// rawSingle connects the session's one entry for the port at once (a protocol whose server speaks first
// works), and checks the client's first bytes: a TLS ClientHello naming another host than the entry is
// refused (fronting), anything else goes through.
func (g *gateway) rawSingle(c net.Conn, st *gwState, sess *gwSession, client, target string, port int) {
	if !sess.allowed(target, port) {
		g.auditf(st, sess, client, "tcp", target, port, false, "not allowed", "")
		resetConn(c)
		return
	}
	up, err := g.dialUpstream(context.Background(), target, port)
	if err != nil {
		g.auditf(st, sess, client, "tcp", target, port, true, "upstream: "+err.Error(), "")
		resetConn(c)
		return
	}
	g.auditf(st, sess, client, "tcp", target, port, true, "the port's entry", "")
	var once sync.Once
	closeBoth := func() { once.Do(func() { c.Close(); up.Close() }) }
	tc, tup := tcpOf(c), tcpOf(up)
	upDone := make(chan struct{})
	go func() {
		defer close(upDone)
		if _, err := io.Copy(tc, tup); err != nil {
			closeBoth()
		} else {
			_ = tc.CloseWrite()
		}
	}()
	var first [1]byte
	n, err := c.Read(first[:])
	if n == 1 {
		head := first[:]
		if first[0] == 22 { // a TLS handshake record: read the ClientHello (bounded) and check its SNI
			_ = c.SetReadDeadline(time.Now().Add(g.headTimeout))
			raw, hello, herr := readClientHello(io.MultiReader(bytes.NewReader(first[:]), c))
			_ = c.SetReadDeadline(time.Time{})
			head = raw
			sni := normHost(hello.sni)
			if herr == nil && (hello.ech || sni != "" && sni != target) {
				g.auditf(st, sess, client, "tcp", sni, port, false, "SNI differs from the port's entry "+target, "")
				resetConn(c)
				closeBoth()
				<-upDone
				return
			}
			if herr != nil && len(raw) < 5 {
				closeBoth()
				<-upDone
				return
			}
		}
		if _, err := up.Write(head); err != nil {
			closeBoth()
			<-upDone
			return
		}
		_, err = io.Copy(tup, tc)
	}
	if err != nil && err != io.EOF {
		closeBoth()
	} else {
		_ = tup.CloseWrite()
	}
	<-upDone
	closeBoth()
}
