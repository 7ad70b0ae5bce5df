// The gateway's proxies: port 80 by Host (each request checked), port 443 by the ClientHello's SNI
// (pass-through, or terminated for a secret's host: gateway_mitm.go), with the connection limits, resets and
// splicing they share.

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"time"
)

// gwConnLimit caps connections at once per source address and in all: one more is reset at once.
type gwConnLimit struct {
	mu               sync.Mutex
	per              map[string]int
	total            int
	perMax, totalMax int
}

func newConnLimit(perMax, totalMax int) *gwConnLimit {
	return &gwConnLimit{per: map[string]int{}, perMax: perMax, totalMax: totalMax}
}

func (l *gwConnLimit) acquire(ip string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.per[ip] >= l.perMax || l.total >= l.totalMax {
		return false
	}
	l.per[ip]++
	l.total++
	return true
}

func (l *gwConnLimit) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.per[ip]--; l.per[ip] <= 0 {
		delete(l.per, ip)
	}
	l.total--
}

func (l *gwConnLimit) wrap(ln net.Listener) net.Listener { return &gwListener{Listener: ln, l: l} }

type gwListener struct {
	net.Listener
	l *gwConnLimit
}

func (ll *gwListener) Accept() (net.Conn, error) {
	for {
		c, err := ll.Listener.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				time.Sleep(10 * time.Millisecond) // EMFILE and the like: no busy loop
			}
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		ip := addrIP(c.RemoteAddr())
		if !ll.l.acquire(ip) {
			resetConn(tc)
			continue
		}
		return &gwConn{TCPConn: tc, release: func() { ll.l.release(ip) }}, nil
	}
}

// gwConn is an accepted connection, counted until closed.
type gwConn struct {
	*net.TCPConn
	once    sync.Once
	release func()
}

func (c *gwConn) Close() error {
	err := c.TCPConn.Close()
	c.once.Do(c.release)
	return err
}

func tcpOf(c net.Conn) *net.TCPConn {
	switch v := c.(type) {
	case *gwConn:
		return v.TCPConn
	case *net.TCPConn:
		return v
	}
	return nil
}

// resetConn closes c with a TCP reset (SO_LINGER 0): a refusal the client sees at once.
func resetConn(c net.Conn) {
	if tc := tcpOf(c); tc != nil {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// acceptLoop serves each accepted connection in its own goroutine until ln closes.
func acceptLoop(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go handle(c)
	}
}

// splice copies both ways until both have ended, passing a half-close on; an error either way closes both.
// The copies are socket to socket (splice(2) on Linux): nothing is buffered in the gateway.
func splice(a, b net.Conn) {
	ta, tb := tcpOf(a), tcpOf(b)
	done := make(chan struct{}, 2)
	var once sync.Once
	closeBoth := func() { once.Do(func() { a.Close(); b.Close() }) }
	cp := func(dst, src net.Conn, tdst, tsrc *net.TCPConn) {
		var err error
		if tdst != nil && tsrc != nil {
			_, err = io.Copy(tdst, tsrc)
		} else {
			_, err = io.Copy(dst, src)
		}
		if err != nil {
			closeBoth()
		} else if tdst != nil {
			_ = tdst.CloseWrite()
		} else if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(b, a, tb, ta)
	go cp(a, b, ta, tb)
	<-done
	<-done
	closeBoth()
}

// dialUpstream resolves host through the gateway's resolver and dials one of its addresses (the gateway's
// own resolution, never the client's).
func (g *gateway) dialUpstream(ctx context.Context, host string, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, gwDialTimeout)
	defer cancel()
	ips, err := g.resolver.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	st := g.state.Load()
	lastErr := fmt.Errorf("no address for %s", host)
	for _, ip := range ips {
		if g.upstreamOK != nil && !g.upstreamOK(ip, st) {
			lastErr = fmt.Errorf("%s resolves to %s, which the gateway does not dial", host, ip)
			continue
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ip.String(), strconv.Itoa(g.upstreamPort(port))))
		if err == nil {
			return c, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// dialUpstreamAddr is an http.Transport's DialContext: addr is host:port of the request's URL (a name the
// handler checked).
func (g *gateway) dialUpstreamAddr(ctx context.Context, _, addr string) (net.Conn, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return nil, err
	}
	return g.dialUpstream(ctx, host, port)
}

// refuseHTTP writes the visible refusal: a status, the X-Tai-Sandbox-Egress header, a body naming the host.
func refuseHTTP(w http.ResponseWriter, status int, host, why string) {
	h := w.Header()
	h.Set("X-Tai-Sandbox-Egress", "refused")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Connection", "close")
	w.WriteHeader(status)
	fmt.Fprintf(w, "tai-sandbox egress gateway: %q refused by this session's egress policy (%s)\n", host, why)
}

type gwReqKey struct{}

// gwReq is what a proxied request carries to the proxy's callbacks.
type gwReq struct {
	st     *gwState
	sess   *gwSession
	client string
	host   string
	port   int
	kind   string
	scrub  []gwPair // a terminated request's: the forms of real values its response must not carry back
}

func newProxyLog() *log.Logger { return log.New(io.Discard, "", 0) }

// serveHTTP is port 80: a server that checks every request's Host (keep-alive included) and forwards it to
// host:80 at the address the gateway resolved.
func (g *gateway) serveHTTP(ln net.Listener) {
	transport := &http.Transport{
		DialContext:           g.dialUpstreamAddr,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       60 * time.Second,
		DisableCompression:    true,
		ExpectContinueTimeout: time.Second,
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			info := pr.In.Context().Value(gwReqKey{}).(*gwReq)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort(info.host, "80")
			pr.Out.Host = pr.In.Host
		},
		Transport:    transport,
		ErrorLog:     newProxyLog(),
		ErrorHandler: g.upstreamError,
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g.handlePlain(w, r, proxy)
		}),
		ReadHeaderTimeout: g.headTimeout,
		MaxHeaderBytes:    gwMaxHead,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          newProxyLog(),
	}
	g.mu.Lock()
	g.plainHTTP, g.plainTr = srv, transport
	g.mu.Unlock()
	_ = srv.Serve(ln)
}

func (g *gateway) handlePlain(w http.ResponseWriter, r *http.Request, proxy *httputil.ReverseProxy) {
	client := hostOfAddr(r.RemoteAddr)
	st := g.state.Load()
	sess := st.sessions[client]
	host := normHost(r.Host)
	why := ""
	switch {
	case sess == nil:
		why = "unknown client"
	case r.Method == http.MethodConnect:
		why = "CONNECT"
	case host == "":
		why = "no Host"
	case isIPLiteral(host):
		why = "IP literal"
	case !sess.allowed(host, 80):
		why = "not allowed"
	}
	if why != "" {
		g.auditf(st, sess, client, "http", host, 80, false, why, "")
		refuseHTTP(w, http.StatusForbidden, host, why)
		return
	}
	g.auditf(st, sess, client, "http", host, 80, true, "allowed", "")
	info := &gwReq{st: st, sess: sess, client: client, host: host, port: 80, kind: "http"}
	proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), gwReqKey{}, info)))
}

// upstreamError is a proxy's failure to reach upstream: 502 and an audit line (the request was allowed).
func (g *gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	info, _ := r.Context().Value(gwReqKey{}).(*gwReq)
	if info != nil && r.Context().Err() == nil {
		g.auditf(info.st, info.sess, info.client, info.kind, info.host, info.port, true, "upstream: "+err.Error(), "")
	}
	w.Header().Set("X-Tai-Sandbox-Egress", "upstream-error")
	w.WriteHeader(http.StatusBadGateway)
	fmt.Fprintf(w, "tai-sandbox egress gateway: upstream failed: %v\n", err)
}

func hostOfAddr(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// serveTLS is port 443: the SNI decides; a secret's host is terminated (gateway_mitm.go), any other allowed
// name passes through untouched.
func (g *gateway) serveTLS(ln net.Listener) { acceptLoop(ln, g.handleTLS) }

func (g *gateway) handleTLS(c net.Conn) {
	client := addrIP(c.RemoteAddr())
	if g.state.Load().sessions[client] == nil {
		g.auditf(g.state.Load(), nil, client, "tls", "", 443, false, "unknown client", "")
		resetConn(c)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(g.headTimeout))
	raw, hello, err := readClientHello(c)
	st := g.state.Load()
	sess := st.sessions[client]
	host := normHost(hello.sni)
	why := ""
	switch {
	case sess == nil:
		why = "unknown client"
	case err != nil:
		why = "no TLS ClientHello: " + err.Error()
	case host == "":
		why = "no SNI"
	case isIPLiteral(host):
		why = "IP literal"
	case !sess.allowed(host, 443):
		why = "not allowed"
	case hello.ech && !(sess.allowAll && len(sess.deny) == 0):
		why = "encrypted ClientHello (its inner name is hidden)"
	}
	if why != "" {
		g.auditf(st, sess, client, "tls", host, 443, false, why, "")
		resetConn(c)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if subs := st.secretsFor(sess, host); len(subs) > 0 {
		if !g.mitm.acquire() {
			g.auditf(st, sess, client, "tls", host, 443, false, "too many terminated connections", "")
			resetConn(c)
			return
		}
		g.auditf(st, sess, client, "tls", host, 443, true, "terminated (secret host)", "")
		g.mitm.serve(c, raw, host, client)
		return
	}
	g.auditf(st, sess, client, "tls", host, 443, true, "pass-through", "")
	up, err := g.dialUpstream(context.Background(), host, 443)
	if err != nil {
		g.auditf(st, sess, client, "tls", host, 443, true, "upstream: "+err.Error(), "")
		resetConn(c)
		return
	}
	if _, err := up.Write(raw); err != nil {
		up.Close()
		resetConn(c)
		return
	}
	splice(c, up)
}

// tlsHello is what the gateway reads of a ClientHello.
type tlsHello struct {
	sni string
	ech bool // an encrypted_client_hello extension (its real name is inside, hidden)
}

const maxHelloBytes = 64 << 10

// readClientHello reads TLS records until the whole ClientHello handshake message is in (at most 64 KiB),
// returning every byte read (to replay upstream) and its SNI.
func readClientHello(r io.Reader) ([]byte, tlsHello, error) {
	var raw, hs []byte
	var hdr [5]byte
	for {
		if got, err := io.ReadFull(r, hdr[:]); err != nil {
			return append(raw, hdr[:got]...), tlsHello{}, err
		}
		raw = append(raw, hdr[:]...)
		if hdr[0] != 22 {
			return raw, tlsHello{}, errors.New("not a TLS handshake")
		}
		n := int(binary.BigEndian.Uint16(hdr[3:]))
		if n == 0 || n > 1<<14+256 || len(raw)+n > maxHelloBytes {
			return raw, tlsHello{}, errors.New("bad TLS record length")
		}
		start := len(raw)
		raw = append(raw, make([]byte, n)...)
		if got, err := io.ReadFull(r, raw[start:]); err != nil {
			return raw[:start+got], tlsHello{}, err
		}
		hs = append(hs, raw[start:]...)
		if len(hs) >= 4 {
			if hs[0] != 1 {
				return raw, tlsHello{}, errors.New("not a ClientHello")
			}
			want := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
			if want > maxHelloBytes {
				return raw, tlsHello{}, errors.New("ClientHello too large")
			}
			if len(hs) >= 4+want {
				h, err := parseClientHello(hs[4 : 4+want])
				return raw, h, err
			}
		}
	}
}

// parseClientHello reads a ClientHello's body (RFC 8446 4.1.2) for its server_name and encrypted_client_hello
// extensions.
func parseClientHello(b []byte) (tlsHello, error) {
	var h tlsHello
	short := errors.New("short ClientHello")
	if len(b) < 2+32+1 {
		return h, short
	}
	b = b[34:]
	skip := func(lenBytes int) bool {
		if len(b) < lenBytes {
			return false
		}
		n := 0
		for i := 0; i < lenBytes; i++ {
			n = n<<8 | int(b[i])
		}
		if len(b) < lenBytes+n {
			return false
		}
		b = b[lenBytes+n:]
		return true
	}
	if !skip(1) || !skip(2) || !skip(1) { // session id, cipher suites, compression methods
		return h, short
	}
	if len(b) == 0 {
		return h, nil // no extensions
	}
	if len(b) < 2 {
		return h, short
	}
	ext := b[2:]
	if n := int(binary.BigEndian.Uint16(b)); n != len(ext) {
		return h, errors.New("bad extensions length")
	}
	sawSNI := false
	for len(ext) > 0 {
		if len(ext) < 4 {
			return h, short
		}
		typ, n := binary.BigEndian.Uint16(ext), int(binary.BigEndian.Uint16(ext[2:]))
		if len(ext) < 4+n {
			return h, short
		}
		data := ext[4 : 4+n]
		ext = ext[4+n:]
		switch typ {
		case 0: // server_name
			if sawSNI {
				return h, errors.New("two server_name extensions")
			}
			sawSNI = true
			if len(data) < 2 || int(binary.BigEndian.Uint16(data)) != len(data)-2 {
				return h, errors.New("bad server_name")
			}
			list := data[2:]
			for len(list) > 0 {
				if len(list) < 3 {
					return h, errors.New("bad server_name")
				}
				nt, nl := list[0], int(binary.BigEndian.Uint16(list[1:]))
				if len(list) < 3+nl {
					return h, errors.New("bad server_name")
				}
				if nt == 0 {
					if h.sni != "" {
						return h, errors.New("two host names")
					}
					h.sni = string(list[3 : 3+nl])
					if h.sni == "" || len(h.sni) > 253 {
						return h, errors.New("bad host name")
					}
					for _, c := range []byte(h.sni) {
						if c <= ' ' || c >= 0x7f || c == '/' || c == '\\' || c == ':' || c == '%' {
							return h, errors.New("bad host name")
						}
					}
				}
				list = list[3+nl:]
			}
		case 0xfe0d: // encrypted_client_hello
			h.ech = true
		}
	}
	return h, nil
}
