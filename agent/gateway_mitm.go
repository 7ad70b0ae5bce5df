// TLS termination for a secret's hosts: the deployment's CA (created once, race-safe), leaf certificates
// per name, and an HTTP/1.1 server that checks each request's Host against the SNI, swaps this session's
// placeholders for the real values and forwards with verified TLS to the address the gateway resolved.

package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

const gwCAName = "jupyter-tai-sandbox egress CA"

type gwCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey // one key for every leaf (they live in memory only)
	mu      sync.Mutex
	leaves  map[string]*tls.Certificate
}

// loadOrCreateCA reads DIR/ca.key and DIR/ca.pem, creating what is missing. Each file is written to a
// temporary name and link(2)ed into place, which fails if the name exists: two gateways racing both end up
// with the one key and the one certificate that were linked first.
func loadOrCreateCA(dir string) (*gwCA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	keyPath, certPath := filepath.Join(dir, "ca.key"), filepath.Join(dir, "ca.pem")
	if _, err := os.Stat(keyPath); errors.Is(err, os.ErrNotExist) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := linkNew(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, err
		}
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", keyPath)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: not an ECDSA key", keyPath)
	}
	if _, err := os.Stat(certPath); errors.Is(err, os.ErrNotExist) {
		now := time.Now()
		tmpl := &x509.Certificate{
			SerialNumber:          randSerial(),
			Subject:               pkix.Name{CommonName: gwCAName},
			NotBefore:             now.Add(-time.Hour),
			NotAfter:              now.AddDate(10, 0, 0),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLenZero:        true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			return nil, err
		}
		if err := linkNew(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			return nil, err
		}
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	if block, _ = pem.Decode(certPEM); block == nil {
		return nil, fmt.Errorf("%s: no PEM block", certPath)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certPath, err)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("%s is not the certificate of %s", certPath, keyPath)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &gwCA{cert: cert, key: key, leafKey: leafKey, leaves: map[string]*tls.Certificate{}}, nil
}

// linkNew writes data to a temporary file beside path and links it to path; an existing path wins (EEXIST
// is not an error: another gateway got there first).
func linkNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(data); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

func randSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n.Add(n, big.NewInt(1))
}

// leaf is a certificate for name signed by the CA (valid a week; cached, renewed a day before its end).
func (ca *gwCA) leaf(name string) (*tls.Certificate, error) {
	now := time.Now()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok && now.Add(24*time.Hour).Before(c.Leaf.NotAfter) {
		return c, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(),
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{name},
	}
	if len(name) <= 64 {
		tmpl.Subject = pkix.Name{CommonName: name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
	if len(ca.leaves) >= 1024 {
		ca.leaves = map[string]*tls.Certificate{}
	}
	ca.leaves[name] = c
	return c, nil
}

// gwMITM serves HTTP/1.1 on terminated connections.
type gwMITM struct {
	g     *gateway
	conns chan net.Conn
	srv   *http.Server
	proxy *httputil.ReverseProxy
	once  sync.Once
	done  chan struct{}
	slots chan struct{} // one per terminated connection at once
}

type mitmConn struct {
	net.Conn
	info    *gwMITMInfo
	once    sync.Once
	release func()
}

func (c *mitmConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// acquire takes one of the terminated connections' slots (false: none left; the caller resets).
func (m *gwMITM) acquire() bool {
	select {
	case m.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (m *gwMITM) release() { <-m.slots }

type gwMITMInfo struct {
	client, sni string
}

type gwMITMKey struct{}

func newMITM(g *gateway) *gwMITM {
	m := &gwMITM{g: g, conns: make(chan net.Conn), done: make(chan struct{}), slots: make(chan struct{}, gwMaxTerminated)}
	m.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			info := pr.In.Context().Value(gwReqKey{}).(*gwReq)
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = info.host
			pr.Out.Host = pr.In.Host
		},
		Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			info := r.Context().Value(gwReqKey{}).(*gwReq)
			return info.st.transport.RoundTrip(r)
		}),
		ModifyResponse: func(resp *http.Response) error {
			info := resp.Request.Context().Value(gwReqKey{}).(*gwReq)
			return scrubResponse(resp, info.scrub, info.st.cfg.BodyLimit)
		},
		ErrorLog:     newProxyLog(),
		ErrorHandler: g.upstreamError,
	}
	m.srv = &http.Server{
		Handler:           http.HandlerFunc(m.handle),
		ReadHeaderTimeout: g.headTimeout,
		MaxHeaderBytes:    gwMaxHead,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          newProxyLog(),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if mc, ok := c.(*mitmConn); ok {
				return context.WithValue(ctx, gwMITMKey{}, mc.info)
			}
			return ctx
		},
	}
	go func() { _ = m.srv.Serve(m) }()
	return m
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Accept, Close and Addr make gwMITM the listener its server serves: connections come from serve.
func (m *gwMITM) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.done:
		return nil, net.ErrClosed
	}
}

func (m *gwMITM) Close() error {
	m.once.Do(func() { close(m.done) })
	return nil
}

func (m *gwMITM) Addr() net.Addr { return &net.TCPAddr{} }

func (m *gwMITM) close() {
	m.Close()
	_ = m.srv.Close()
}

// serve terminates c (whose ClientHello, already read, is hello) with a leaf for sni and hands it to the
// server. The caller holds a slot (acquire); serve gives it back when the connection ends.
func (m *gwMITM) serve(c net.Conn, hello []byte, sni, client string) {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return m.g.ca.leaf(sni)
		},
	}
	tc := tls.Server(&prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello), c)}, cfg)
	_ = c.SetDeadline(time.Now().Add(m.g.headTimeout))
	if err := tc.Handshake(); err != nil {
		c.Close()
		m.release()
		return
	}
	_ = c.SetDeadline(time.Time{})
	mc := &mitmConn{Conn: tc, info: &gwMITMInfo{client: client, sni: sni}, release: m.release}
	select {
	case m.conns <- mc:
	case <-m.done:
		mc.Close()
	}
}

// prefixConn reads what was peeked before the connection's own bytes.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) { return p.r.Read(b) }

func (m *gwMITM) handle(w http.ResponseWriter, r *http.Request) {
	g := m.g
	ci, _ := r.Context().Value(gwMITMKey{}).(*gwMITMInfo)
	if ci == nil {
		refuseHTTP(w, http.StatusForbidden, r.Host, "no connection")
		return
	}
	st := g.state.Load()
	sess := st.sessions[ci.client]
	host := normHost(r.Host)
	why, status := "", http.StatusForbidden
	switch {
	case sess == nil:
		why = "unknown client"
	case host != ci.sni:
		why, status = "Host differs from the SNI "+ci.sni, http.StatusMisdirectedRequest
	case r.Method == http.MethodConnect:
		why = "CONNECT"
	case !sess.allowed(host, 443):
		why = "not allowed"
	}
	if why != "" {
		g.auditf(st, sess, ci.client, "http", host, 443, false, why, "")
		refuseHTTP(w, status, host, why)
		return
	}
	subs := st.secretsFor(sess, host)
	used, made, err := substitute(r, subs, st.cfg.BodyLimit)
	if err != nil {
		g.auditf(st, sess, ci.client, "http", host, 443, false, "request body: "+err.Error(), "")
		refuseHTTP(w, http.StatusBadRequest, host, "request body: "+err.Error())
		return
	}
	for _, name := range used {
		g.auditf(st, sess, ci.client, "substitution", host, 443, true, "placeholder replaced", name)
	}
	// a body the gateway can read back for the secret (scrubResponse); it decodes gzip and deflate too
	r.Header.Set("Accept-Encoding", "identity")
	info := &gwReq{st: st, sess: sess, client: ci.client, host: host, port: 443, kind: "http", scrub: scrubPairs(subs, made)}
	m.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), gwReqKey{}, info)))
}

// substituteBasic replaces placeholders inside HTTP Basic credentials (`Basic base64(user:password)`, what
// git, pip and curl send for a token in a URL or a netrc), re-encoding them.
func substituteBasic(v string, subs []gwSub, mark func(string)) string {
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return v
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return v
	}
	plain, changed := string(raw), false
	for _, s := range subs {
		if strings.Contains(plain, s.placeholder) {
			plain = strings.ReplaceAll(plain, s.placeholder, s.secret.Value)
			mark(s.name)
			changed = true
		}
	}
	if !changed {
		return v
	}
	return scheme + " " + base64.StdEncoding.EncodeToString([]byte(plain))
}

// substitute replaces the placeholders of subs in r: every header value (inside Basic credentials too); the query when the secret allows
// it (the value query-escaped); a body of known length up to limit when the secret allows it. It returns the
// names of the secrets it replaced, each once, and the Basic credentials it made (made, original) so the
// response can be scrubbed of them.
func substitute(r *http.Request, subs []gwSub, limit int64) ([]string, [][2]string, error) {
	if len(subs) == 0 {
		return nil, nil, nil
	}
	var made [][2]string
	usedSet := map[string]bool{}
	var used []string
	mark := func(name string) {
		if !usedSet[name] {
			usedSet[name] = true
			used = append(used, name)
		}
	}
	for _, vs := range r.Header {
		for i, v := range vs {
			for _, s := range subs {
				if strings.Contains(v, s.placeholder) {
					v = strings.ReplaceAll(v, s.placeholder, s.secret.Value)
					mark(s.name)
				}
			}
			nv := substituteBasic(v, subs, mark)
			if nv != v {
				_, after, _ := strings.Cut(nv, " ")
				_, before, _ := strings.Cut(v, " ")
				made = append(made, [2]string{strings.TrimSpace(after), strings.TrimSpace(before)})
			}
			vs[i] = nv
		}
	}
	for _, s := range subs {
		if s.secret.Query && strings.Contains(r.URL.RawQuery, s.placeholder) {
			r.URL.RawQuery = strings.ReplaceAll(r.URL.RawQuery, s.placeholder, url.QueryEscape(s.secret.Value))
			r.RequestURI = ""
			mark(s.name)
		}
	}
	wantBody := false
	for _, s := range subs {
		wantBody = wantBody || s.secret.Body
	}
	if wantBody && r.Body != nil && r.ContentLength > 0 && r.ContentLength <= limit {
		body, err := io.ReadAll(io.LimitReader(r.Body, r.ContentLength+1))
		if err != nil {
			return nil, nil, err
		}
		if int64(len(body)) != r.ContentLength {
			return nil, nil, errors.New("not the length it declared")
		}
		for _, s := range subs {
			if s.secret.Body && bytes.Contains(body, []byte(s.placeholder)) {
				body = bytes.ReplaceAll(body, []byte(s.placeholder), []byte(s.secret.Value))
				mark(s.name)
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	return used, made, nil
}
