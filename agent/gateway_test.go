package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The gateway tests run the real gateway on 127.0.0.1 (unprivileged ports) against a small authoritative
// DNS server and HTTP/HTTPS upstreams in the test, with sessions at other loopback addresses (127.0.0.2 is
// a known session, 127.0.0.3 is not).

const (
	gwListen      = "127.0.0.1"
	gwClient      = "127.0.0.2"
	gwStranger    = "127.0.0.3"
	gwSecretValue = "s3cr3t-value-never-logged"
	gwPH          = "tai-placeholder-0123456789abcdef0123456789abcdef"
	gwPH2         = "tai-placeholder-fedcba9876543210fedcba9876543210"
)

// testDNS answers A queries for the names it knows (127.0.0.1) and counts every query it gets.
type testDNS struct {
	pc      net.PacketConn
	queries atomic.Int64
	mu      sync.Mutex
	asked   []string
}

func newTestDNS(t testing.TB) *testDNS {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &testDNS{pc: pc}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			m := append([]byte(nil), buf[:n]...)
			q, err := parseDNSQuery(m)
			if err != nil {
				continue
			}
			d.queries.Add(1)
			d.mu.Lock()
			d.asked = append(d.asked, q.name)
			d.mu.Unlock()
			var reply []byte
			switch {
			case strings.HasSuffix(q.name, ".nx.test"):
				reply = dnsReply(m, q, dnsNXDomain, nil)
			case q.qtype == dnsTypeA:
				reply = dnsReply(m, q, dnsRcodeOK, net.IPv4(127, 0, 0, 1))
			default:
				reply = dnsReply(m, q, dnsRcodeOK, nil)
			}
			_, _ = pc.WriteTo(reply, from)
		}
	}()
	return d
}

// testCA makes a CA and a leaf for names, for the test's upstream servers.
func testCA(t testing.TB, names ...string) (tls.Certificate, []byte) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: randSerial(), Subject: pkix.Name{CommonName: "test upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTmpl := &x509.Certificate{SerialNumber: randSerial(), NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), DNSNames: names, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// echo is what the upstreams answer: the request as they got it.
type echo struct {
	Host   string      `json:"host"`
	Path   string      `json:"path"`
	Query  string      `json:"query"`
	Header http.Header `json:"header"`
	Body   string      `json:"body"`
	TLS    bool        `json:"tls"`
}

func echoHandler(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") == "tai-test" { // an upgraded stream: 101, then the bytes echoed
		if id := r.Header.Get("X-Test-Id"); id != "" {
			upstreamSeen.Store(id, echo{Host: r.Host, Path: r.URL.Path, Header: r.Header, TLS: r.TLS != nil})
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: tai-test\r\nConnection: Upgrade\r\nX-Auth: %s\r\n\r\n",
			r.Header.Get("Authorization"))
		_ = brw.Flush()
		_, _ = io.Copy(c, brw)
		return
	}
	body, _ := io.ReadAll(r.Body)
	e := echo{Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header, Body: string(body), TLS: r.TLS != nil}
	if id := r.Header.Get("X-Test-Id"); id != "" {
		upstreamSeen.Store(id, e)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(e)
}

// upstreamSeen holds what the upstreams got, by the request's X-Test-Id: what a secret's host answers back
// passes through the gateway's scrub on its way to the session.
var upstreamSeen sync.Map

func seenUpstream(t testing.TB, id string) echo {
	t.Helper()
	e, ok := upstreamSeen.Load(id)
	if !ok {
		t.Fatalf("no request %q reached an upstream", id)
	}
	return e.(echo)
}

type gwTest struct {
	t                  testing.TB
	g                  *gateway
	dir, caDir         string
	dns                *testDNS
	plain, secure      *httptest.Server
	upstreamCA         []byte
	dnsAddr, httpAddr  string
	httpsAddr          string
	cancel             context.CancelFunc
	done               chan error
	extraUpstreamPorts sync.Map // a raw port -> the port of the test's server it reaches
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", gwListen+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startGateway runs a gateway whose session 127.0.0.2 has the policy in session (a session file's JSON).
func startGateway(t testing.TB, session map[string]any, secrets map[string]any) *gwTest {
	return startGatewayWith(t, session, secrets, nil)
}

// startGatewayWith lets configure change the gateway before it runs.
func startGatewayWith(t testing.TB, session map[string]any, secrets map[string]any, configure func(*gateway)) *gwTest {
	gt := &gwTest{t: t, dir: t.TempDir(), caDir: filepath.Join(t.TempDir(), "ca"), dns: newTestDNS(t)}
	gt.plain = httptest.NewServer(http.HandlerFunc(echoHandler))
	t.Cleanup(gt.plain.Close)
	cert, caPEM := testCA(t, "allowed.test", "*.allowed.test", "secret.test", "other.test", "*.other.test")
	gt.upstreamCA = caPEM
	gt.secure = httptest.NewUnstartedServer(http.HandlerFunc(echoHandler))
	gt.secure.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	gt.secure.Config.ErrorLog = newProxyLog() // the unverified-upstream case fails a handshake on purpose
	gt.secure.StartTLS()
	t.Cleanup(gt.secure.Close)
	gt.writeJSON("gateway.json", map[string]any{"deployment": "dep1", "owner": "alice", "listen": gwListen,
		"resolver": gt.dns.pc.LocalAddr().String(), "upstream_roots_pem": string(caPEM), "body_limit": 1 << 16})
	if session != nil {
		gt.writeJSON("sessions/"+gwClient+".json", session)
	}
	for name, s := range secrets {
		gt.writeJSON("secrets/"+name+".json", s)
	}
	// the ports are free when picked; another test may take one meanwhile: a start that cannot bind retries
	for attempt := 1; ; attempt++ {
		err := gt.start(configure)
		if err == nil {
			return gt
		}
		if attempt == 5 || !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("the gateway ended before it was ready: %v", err)
		}
		t.Logf("attempt %d: %v", attempt, err)
	}
}

func (gt *gwTest) start(configure func(*gateway)) error {
	t := gt.t
	g := newGateway(gt.dir, gt.caDir)
	g.logf = func(format string, args ...any) { t.Logf("gateway: "+format, args...) }
	g.ports = gwPorts{dns: freePort(t), http: freePort(t), https: freePort(t)}
	plainPort := gt.plain.Listener.Addr().(*net.TCPAddr).Port
	securePort := gt.secure.Listener.Addr().(*net.TCPAddr).Port
	g.upstreamPort = func(p int) int {
		switch p {
		case 80:
			return plainPort
		case 443:
			return securePort
		}
		if v, ok := gt.extraUpstreamPorts.Load(p); ok {
			return v.(int)
		}
		return p
	}
	g.upstreamOK = nil // the test's upstreams are on loopback (configure may put the default back)
	if configure != nil {
		configure(g)
	}
	gt.g = g
	gt.dnsAddr = net.JoinHostPort(gwListen, strconv.Itoa(g.ports.dns))
	gt.httpAddr = net.JoinHostPort(gwListen, strconv.Itoa(g.ports.http))
	gt.httpsAddr = net.JoinHostPort(gwListen, strconv.Itoa(g.ports.https))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(gt.dir, "ready")); err == nil {
			break
		}
		select {
		case err := <-done:
			cancel()
			if err == nil {
				err = errors.New("ended")
			}
			return err
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("the gateway is not ready after 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	gt.cancel, gt.done = cancel, done
	t.Cleanup(gt.stop)
	return nil
}

func (gt *gwTest) stop() {
	if gt.cancel == nil {
		return
	}
	gt.cancel()
	gt.cancel = nil
	select {
	case err := <-gt.done:
		if err != nil {
			gt.t.Errorf("gateway: %v", err)
		}
	case <-time.After(10 * time.Second):
		gt.t.Error("the gateway did not stop within 10 s")
	}
}

// writeJSON writes a file of the gateway's directory as the server does: temp file, then rename.
func (gt *gwTest) writeJSON(rel string, v any) {
	gt.t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		gt.t.Fatal(err)
	}
	path := filepath.Join(gt.dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		gt.t.Fatal(err)
	}
	if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
		gt.t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		gt.t.Fatal(err)
	}
}

func dialerFrom(ip string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
}

// resolverFrom is Go's own DNS client asking the gateway from ip: an independent reader of its answers.
func (gt *gwTest) resolverFrom(ip string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		if strings.HasPrefix(network, "udp") {
			d := net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(ip)}}
			return d.DialContext(ctx, network, gt.dnsAddr)
		}
		return dialerFrom(ip).DialContext(ctx, network, gt.dnsAddr)
	}}
}

// rawDNS sends one query from ip over network and returns the reply's rcode and answer count.
func (gt *gwTest) rawDNS(network, ip, name string, qtype uint16) (int, int) {
	gt.t.Helper()
	q := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	q, err := appendDNSName(q, name)
	if err != nil {
		gt.t.Fatal(err)
	}
	q = binary.BigEndian.AppendUint16(q, qtype)
	q = append(q, 0, 1)
	var c net.Conn
	if network == "udp" {
		d := net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(ip)}}
		c, err = d.Dial("udp", gt.dnsAddr)
	} else {
		c, err = dialerFrom(ip).Dial("tcp", gt.dnsAddr)
		q = append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)
	}
	if err != nil {
		gt.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(q); err != nil {
		gt.t.Fatal(err)
	}
	buf := make([]byte, 2048)
	n, err := io.ReadAtLeast(c, buf, 12)
	if err != nil {
		gt.t.Fatal(err)
	}
	m := buf[:n]
	if network == "tcp" {
		m = m[2:]
	}
	h, err := readDNSHeader(m)
	if err != nil {
		gt.t.Fatal(err)
	}
	if h.id != 0x1234 || h.flags&0x8000 == 0 {
		gt.t.Fatalf("not a reply to the query: %+v", h)
	}
	return int(h.flags & 0xF), int(h.an)
}

func (gt *gwTest) httpClient(ip string, trustGatewayCA bool) *http.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(gt.upstreamCA)
	if trustGatewayCA {
		ca, err := os.ReadFile(filepath.Join(gt.caDir, "ca.pem"))
		if err != nil {
			gt.t.Fatal(err)
		}
		roots.AppendCertsFromPEM(ca)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			to := gt.httpAddr
			if port == "443" {
				to = gt.httpsAddr
			}
			return dialerFrom(ip).DialContext(ctx, network, to)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DisableKeepAlives: true,
	}}
}

func (gt *gwTest) get(c *http.Client, url string, header map[string]string) (*http.Response, echo, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		gt.t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	return gt.do(c, req)
}

func (gt *gwTest) do(c *http.Client, req *http.Request) (*http.Response, echo, error) {
	resp, err := c.Do(req)
	var e echo
	if err != nil {
		return nil, e, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(body, &e); err != nil {
			gt.t.Fatalf("echo: %v: %s", err, body)
		}
	} else {
		e.Body = string(body)
	}
	return resp, e, nil
}

// auditLines waits for the sealed audit files to hold a line matching want, and returns every line.
func (gt *gwTest) auditLines(want func(gwAuditRecord) bool) []gwAuditRecord {
	gt.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var out []gwAuditRecord
		found := false
		paths, _ := filepath.Glob(filepath.Join(gt.dir, "audit", "*.jsonl"))
		sort.Strings(paths)
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			if strings.Contains(string(data), gwSecretValue) {
				gt.t.Fatalf("the secret's value is in the audit file %s", p)
			}
			for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
				var r gwAuditRecord
				if err := json.Unmarshal([]byte(line), &r); err != nil {
					gt.t.Fatalf("audit line %q: %v", line, err)
				}
				out = append(out, r)
				found = found || want(r)
			}
		}
		if found {
			return out
		}
		if time.Now().After(deadline) {
			gt.t.Fatalf("no audit line as wanted among %+v", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || err != nil && strings.Contains(err.Error(), "connection reset")
}

var basicSession = map[string]any{"session": "sbx-1", "allow": []string{"allowed.test", "*.allowed.test", "other.test",
	"secret.test", "secret2.test"}, "deny": []string{"bad.allowed.test"}}

func TestGatewayDNS(t *testing.T) {
	gt := startGateway(t, basicSession, nil)
	r := gt.resolverFrom(gwClient)
	ctx := context.Background()
	for _, name := range []string{"allowed.test", "www.allowed.test", "a.b.allowed.test", "ALLOWED.Test", "other.test."} {
		ips, err := r.LookupIP(ctx, "ip", name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(ips) != 1 || !ips[0].Equal(net.ParseIP(gwListen)) {
			t.Fatalf("%s: %v, want only the gateway's address", name, ips)
		}
	}
	for _, name := range []string{"evil.test", "x.evil.test", "bad.allowed.test", "allowed.test.evil.test",
		"notallowed.test", "exfiltrated-data.attacker.test", "127.0.0.1.nip.test"} {
		_, err := r.LookupIP(ctx, "ip", name)
		var de *net.DNSError
		if !errors.As(err, &de) || !de.IsNotFound {
			t.Fatalf("%s: %v, want NXDOMAIN", name, err)
		}
	}
	if rc, an := gt.rawDNS("udp", gwClient, "allowed.test", 28); rc != dnsRcodeOK || an != 0 {
		t.Fatalf("AAAA: rcode %d, %d answers; want NOERROR and none", rc, an)
	}
	if rc, an := gt.rawDNS("tcp", gwClient, "www.allowed.test", dnsTypeA); rc != dnsRcodeOK || an != 1 {
		t.Fatalf("A over TCP: rcode %d, %d answers", rc, an)
	}
	if rc, _ := gt.rawDNS("tcp", gwClient, "evil.test", dnsTypeA); rc != dnsNXDomain {
		t.Fatalf("unlisted over TCP: rcode %d", rc)
	}
	for _, network := range []string{"udp", "tcp"} {
		if rc, an := gt.rawDNS(network, gwStranger, "allowed.test", dnsTypeA); rc != dnsRefused || an != 0 {
			t.Fatalf("unknown client over %s: rcode %d, %d answers; want REFUSED", network, rc, an)
		}
	}
	if n := gt.dns.queries.Load(); n != 0 {
		t.Fatalf("the upstream resolver got %d queries (%v); a session's DNS never reaches it", n, gt.dns.asked)
	}
	lines := gt.auditLines(func(r gwAuditRecord) bool { return r.Kind == "dns" && r.Host == "evil.test" })
	var allowed, refused bool
	for _, l := range lines {
		if l.Kind == "dns" && l.Host == "allowed.test" && l.Decision == "allow" && l.Session == "sbx-1" &&
			l.Client == gwClient && l.Deployment == "dep1" && l.Owner == "alice" {
			allowed = true
		}
		if l.Kind == "dns" && l.Host == "evil.test" && l.Decision == "refuse" {
			refused = true
		}
	}
	if !allowed || !refused {
		t.Fatalf("audit lines: %+v", lines)
	}
}

func TestGatewayHTTP(t *testing.T) {
	gt := startGateway(t, basicSession, nil)
	c := gt.httpClient(gwClient, false)
	resp, e, err := gt.get(c, "http://www.allowed.test/hello?x=1", nil)
	if err != nil || resp.StatusCode != 200 || e.Host != "www.allowed.test" || e.Path != "/hello" || e.Query != "x=1" {
		t.Fatalf("allowed: %v %+v %+v", err, resp, e)
	}
	if e.Header.Get("X-Forwarded-For") != "" {
		t.Fatalf("the gateway added X-Forwarded-For: %v", e.Header)
	}
	for _, host := range []string{"evil.test", "bad.allowed.test", "127.0.0.1", "[::1]", "2130706433", "127.1"} {
		resp, e, err := gt.get(c, "http://allowed.test/", map[string]string{"Host": host})
		if err != nil || resp.StatusCode != 403 || resp.Header.Get("X-Tai-Sandbox-Egress") != "refused" ||
			!strings.Contains(e.Body, "egress policy") {
			t.Fatalf("Host %s: %v %+v %q", host, err, resp, e.Body)
		}
	}
	resp, _, err = gt.get(gt.httpClient(gwStranger, false), "http://allowed.test/", nil)
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("unknown client: %v %+v", err, resp)
	}
	// one connection, a second request (keep-alive) to another host: each request is checked
	conn, err := dialerFrom(gwClient).Dial("tcp", gt.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i, tc := range []struct{ head, want string }{
		{"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "200"},
		{"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", "403"},
	} {
		if _, err := conn.Write([]byte(tc.head)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !strings.HasPrefix(resp.Status, tc.want) {
			t.Fatalf("request %d: %s, want %s", i, resp.Status, tc.want)
		}
	}
	// absolute form naming another host than Host: the absolute URI's host is the one checked and sent
	for _, head := range []string{
		"GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n",
		"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n",
	} {
		conn, err := dialerFrom(gwClient).Dial("tcp", gt.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write([]byte(head))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil || resp.StatusCode == 200 {
			t.Fatalf("%q: %v %v", head, err, resp)
		}
	}
	gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "http" && r.Host == "evil.test" && r.Decision == "refuse" && r.Port == 80
	})
	gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "http" && r.Host == "www.allowed.test" && r.Decision == "allow"
	})
	if n := gt.dns.queries.Load(); n == 0 {
		t.Fatal("the gateway did not resolve the allowed names itself")
	}
	gt.dns.mu.Lock()
	for _, name := range gt.dns.asked {
		if name != "allowed.test" && name != "www.allowed.test" {
			t.Errorf("the gateway resolved %q", name)
		}
	}
	gt.dns.mu.Unlock()
}

// tlsDial is a TLS client of the gateway's port 443 from ip, trusting roots.
func (gt *gwTest) tlsDial(ip, sni string, roots []byte) (*tls.Conn, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	raw, err := dialerFrom(ip).Dial("tcp", gt.httpsAddr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, &tls.Config{ServerName: sni, RootCAs: pool, InsecureSkipVerify: sni == ""})
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	return c, nil
}

// withExtension appends an extension to a one-record ClientHello, fixing its three lengths.
func withExtension(t *testing.T, hello []byte, typ uint16, data []byte) []byte {
	body := hello[9:]
	off := 34
	off += 1 + int(body[off])
	off += 2 + int(binary.BigEndian.Uint16(body[off:]))
	off += 1 + int(body[off])
	if len(hello) != 5+int(binary.BigEndian.Uint16(hello[3:])) || off+2 > len(body) {
		t.Fatal("not a one-record ClientHello with extensions")
	}
	ext := binary.BigEndian.AppendUint16(nil, typ)
	ext = binary.BigEndian.AppendUint16(ext, uint16(len(data)))
	ext = append(ext, data...)
	out := append(append([]byte(nil), hello...), ext...)
	binary.BigEndian.PutUint16(out[3:], binary.BigEndian.Uint16(hello[3:])+uint16(len(ext)))
	hsLen := int(hello[6])<<16 | int(hello[7])<<8 | int(hello[8]) + len(ext)
	out[6], out[7], out[8] = byte(hsLen>>16), byte(hsLen>>8), byte(hsLen)
	extLen := 9 + off
	binary.BigEndian.PutUint16(out[extLen:], binary.BigEndian.Uint16(hello[extLen:])+uint16(len(ext)))
	if h, err := parseClientHello(out[9:]); err != nil || !h.ech || h.sni != "other.test" {
		t.Fatalf("the made ClientHello: %+v %v", h, err)
	}
	return out
}

func TestGatewayTLSPassThrough(t *testing.T) {
	gt := startGateway(t, basicSession, nil)
	// only the upstream's CA is trusted: the handshake reaching the upstream's own certificate is the proof
	// the gateway passed the bytes through
	c := gt.httpClient(gwClient, false)
	resp, e, err := gt.get(c, "https://other.test/p", map[string]string{"Authorization": "Bearer " + gwPH})
	if err != nil || resp.StatusCode != 200 || !e.TLS || e.Host != "other.test" || e.Header.Get("Authorization") != "Bearer "+gwPH {
		t.Fatalf("pass-through: %v %+v %+v", err, resp, e)
	}
	for _, sni := range []string{"evil.test", "bad.allowed.test", ""} {
		_, err := gt.tlsDial(gwClient, sni, gt.upstreamCA)
		if !isReset(err) {
			t.Fatalf("SNI %q: %v, want a reset", sni, err)
		}
	}
	if _, err := gt.tlsDial(gwStranger, "other.test", gt.upstreamCA); !isReset(err) {
		t.Fatalf("unknown client: %v, want a reset", err)
	}
	// an IP literal as the SNI (Go's client never sends one: a ClientHello made for a name, the name swapped)
	hello := bytes.Replace(realClientHello("a.b.c.d"), []byte("a.b.c.d"), []byte("1.2.3.4"), 1)
	conn, err := dialerFrom(gwClient).Dial("tcp", gt.httpsAddr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write(hello)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 10)); !isReset(err) {
		t.Fatalf("an IP literal SNI: %v, want a reset", err)
	}
	conn.Close()
	// an encrypted_client_hello extension (its inner name would be hidden): reset under an allow-list
	conn, err = dialerFrom(gwClient).Dial("tcp", gt.httpsAddr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write(withExtension(t, realClientHello("other.test"), 0xfe0d, []byte{0}))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 10)); !isReset(err) {
		t.Fatalf("an ECH ClientHello: %v, want a reset", err)
	}
	conn.Close()
	// not TLS at all on 443
	conn, err = dialerFrom(gwClient).Dial("tcp", gt.httpsAddr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 10)); !isReset(err) {
		t.Fatalf("plain HTTP on 443: %v, want a reset", err)
	}
	conn.Close()
	gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "tls" && r.Host == "evil.test" && r.Decision == "refuse" && r.Port == 443
	})
	gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "tls" && r.Host == "1.2.3.4" && r.Reason == "IP literal"
	})
	gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "tls" && r.Host == "other.test" && strings.HasPrefix(r.Reason, "encrypted ClientHello")
	})
	gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "tls" && r.Host == "other.test" && r.Decision == "allow" && r.Reason == "pass-through"
	})
}

func TestGatewayPolicyChangeApplies(t *testing.T) {
	gt := startGateway(t, basicSession, nil)
	c := gt.httpClient(gwClient, false)
	if resp, _, err := gt.get(c, "http://allowed.test/", nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("before: %v %v", err, resp)
	}
	r := gt.resolverFrom(gwClient)
	if _, err := r.LookupIP(context.Background(), "ip", "allowed.test"); err != nil {
		t.Fatalf("before: DNS: %v", err)
	}
	gt.writeJSON("sessions/"+gwClient+".json", map[string]any{"session": "sbx-1", "allow": []string{"other.test"}})
	changed := time.Now()
	for {
		resp, _, err := gt.get(c, "http://allowed.test/", nil)
		if err == nil && resp.StatusCode == 403 {
			break
		}
		if time.Since(changed) > time.Second {
			t.Fatalf("the new policy did not apply within 1 s: %v %v", err, resp)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := r.LookupIP(context.Background(), "ip", "allowed.test"); err == nil {
		t.Fatal("DNS still answers the name the new policy removed")
	}
	// the refusal is audited even within the second of the allowed answer's line
	gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "dns" && r.Host == "allowed.test" && r.Decision == "refuse"
	})
	if resp, _, err := gt.get(c, "http://other.test/", nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the new policy's name: %v %v", err, resp)
	}
	// the session file removed: the client is unknown
	if err := os.Remove(filepath.Join(gt.dir, "sessions", gwClient+".json")); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	for {
		if rc, _ := gt.rawDNS("udp", gwClient, "other.test", dnsTypeA); rc == dnsRefused {
			break
		}
		if time.Since(removed) > time.Second {
			t.Fatal("a removed session file still answers after 1 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var secretFiles = map[string]any{
	"tok":  map[string]any{"value": gwSecretValue, "hosts": []string{"secret.test"}, "query": true, "body": true},
	"tok2": map[string]any{"value": gwSecretValue + "-2", "hosts": []string{"secret.test", "secret2.test"}},
}

var secretSession = map[string]any{"session": "sbx-1", "allow": []string{"allowed.test", "other.test", "secret.test",
	"secret2.test"}, "secrets": map[string]string{gwPH: "tok", gwPH2: "tok2"}}

func TestGatewaySecretSubstitution(t *testing.T) {
	gt := startGateway(t, secretSession, secretFiles)
	c := gt.httpClient(gwClient, true)
	req, _ := http.NewRequest("POST", "https://secret.test/v1/x?key="+gwPH+"&k2="+gwPH2,
		strings.NewReader(`{"token":"`+gwPH+`","t2":"`+gwPH2+`"}`))
	req.Header.Set("Authorization", "Bearer "+gwPH)
	req.Header.Set("X-Other", gwPH2)
	req.Header.Set("X-Basic", "Basic "+base64.StdEncoding.EncodeToString([]byte("x-access-token:"+gwPH)))
	req.Header.Set("X-Test-Id", "substitution")
	resp, back, err := gt.do(c, req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("terminated: %v %+v %+v", err, resp, back)
	}
	// what the session reads back (the upstream echoes the request) holds the placeholders, never a value
	if back.Header.Get("Authorization") != "Bearer "+gwPH || back.Query != "key="+gwPH+"&k2="+gwPH2 ||
		back.Body != `{"token":"`+gwPH+`","t2":"`+gwPH2+`"}` || back.Header.Get("X-Other") != gwPH2 ||
		back.Header.Get("X-Basic") != "Basic "+base64.StdEncoding.EncodeToString([]byte("x-access-token:"+gwPH)) {
		t.Fatalf("the echo came back unscrubbed: %+v", back)
	}
	e := seenUpstream(t, "substitution")
	if !e.TLS || e.Host != "secret.test" {
		t.Fatalf("the upstream saw %+v", e)
	}
	if got := e.Header.Get("Authorization"); got != "Bearer "+gwSecretValue {
		t.Fatalf("header: %q", got)
	}
	if got := e.Header.Get("X-Basic"); got != "Basic "+base64.StdEncoding.EncodeToString([]byte("x-access-token:"+gwSecretValue)) {
		t.Fatalf("Basic credentials: %q", got)
	}
	if got := e.Header.Get("X-Other"); got != gwSecretValue+"-2" {
		t.Fatalf("the second secret's header: %q", got)
	}
	if e.Query != "key="+gwSecretValue+"&k2="+gwPH2 {
		t.Fatalf("query (the first secret allows it, the second does not): %q", e.Query)
	}
	if e.Body != `{"token":"`+gwSecretValue+`","t2":"`+gwPH2+`"}` {
		t.Fatalf("body: %q", e.Body)
	}
	// a body without a known length (chunked) passes through unchanged
	req, _ = http.NewRequest("POST", "https://secret.test/", io.MultiReader(strings.NewReader(gwPH)))
	req.ContentLength = -1
	if resp, e, err := gt.do(c, req); err != nil || resp.StatusCode != 200 || e.Body != gwPH {
		t.Fatalf("streamed body: %v %+v %q", err, resp, e.Body)
	}
	// a body over body_limit passes through unchanged
	big := strings.Repeat("a", 1<<16) + gwPH
	req, _ = http.NewRequest("POST", "https://secret.test/", strings.NewReader(big))
	if resp, e, err := gt.do(c, req); err != nil || resp.StatusCode != 200 || e.Body != big {
		t.Fatalf("large body: %v %+v %d", err, resp, len(e.Body))
	}
	// toward another allowed host, the placeholder stays a placeholder (pass-through)
	resp, e, err = gt.get(c, "https://other.test/?key="+gwPH, map[string]string{"Authorization": "Bearer " + gwPH})
	if err != nil || resp.StatusCode != 200 || e.Header.Get("Authorization") != "Bearer "+gwPH || e.Query != "key="+gwPH {
		t.Fatalf("other host: %v %+v %+v", err, resp, e)
	}
	resp, e, err = gt.get(c, "http://allowed.test/", map[string]string{"Authorization": "Bearer " + gwPH})
	if err != nil || resp.StatusCode != 200 || e.Header.Get("Authorization") != "Bearer "+gwPH {
		t.Fatalf("port 80: %v %+v %+v", err, resp, e)
	}
	// Host != SNI on a terminated connection: 421
	resp, e, err = gt.get(c, "https://secret.test/", map[string]string{"Host": "other.test", "Authorization": gwPH})
	if err != nil || resp.StatusCode != http.StatusMisdirectedRequest || resp.Header.Get("X-Tai-Sandbox-Egress") != "refused" {
		t.Fatalf("Host != SNI: %v %+v %q", err, resp, e.Body)
	}
	// an upstream whose certificate does not verify (it does not name secret2.test): 502, never sent
	resp, e, err = gt.get(c, "https://secret2.test/", map[string]string{"Authorization": gwPH2})
	if err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("unverified upstream: %v %+v %q", err, resp, e.Body)
	}
	lines := gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "substitution" && r.Secret == "tok" && r.Host == "secret.test" && r.Decision == "allow"
	})
	var tok2, misdirected, upstream bool
	for _, l := range lines {
		tok2 = tok2 || l.Kind == "substitution" && l.Secret == "tok2"
		misdirected = misdirected || l.Kind == "http" && l.Decision == "refuse" && strings.Contains(l.Reason, "SNI")
		upstream = upstream || l.Host == "secret2.test" && strings.HasPrefix(l.Reason, "upstream: ")
	}
	if !tok2 || !misdirected {
		t.Fatalf("audit: %+v", lines)
	}
	gt.auditLines(func(r gwAuditRecord) bool {
		return r.Host == "secret2.test" && strings.HasPrefix(r.Reason, "upstream: ")
	})
	_ = upstream
	// rotation: the server rewrites the secret's file; new requests get the new value
	gt.writeJSON("secrets/tok.json", map[string]any{"value": "rotated-value", "hosts": []string{"secret.test"}})
	rotated := time.Now()
	for {
		id := fmt.Sprintf("rotation-%d", time.Now().UnixNano())
		_, back, err := gt.get(c, "https://secret.test/", map[string]string{"Authorization": gwPH, "X-Test-Id": id})
		if err == nil && seenUpstream(t, id).Header.Get("Authorization") == "rotated-value" {
			if back.Header.Get("Authorization") != gwPH {
				t.Fatalf("the rotated value came back: %+v", back)
			}
			break
		}
		if time.Since(rotated) > time.Second {
			t.Fatalf("rotation did not apply within 1 s: %v %+v", err, e)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestGatewayCARace(t *testing.T) {
	for round := 0; round < 10; round++ {
		dir := filepath.Join(t.TempDir(), "ca")
		cas := make([]*gwCA, 4)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i := range cas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cas[i], errs[i] = loadOrCreateCA(dir)
			}()
		}
		wg.Wait()
		for i := range cas {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if !cas[i].cert.Equal(cas[0].cert) || !cas[i].key.Equal(cas[0].key) {
				t.Fatalf("round %d: gateway %d has another CA", round, i)
			}
		}
		again, err := loadOrCreateCA(dir)
		if err != nil || !again.cert.Equal(cas[0].cert) {
			t.Fatalf("a later start: %v", err)
		}
		entries, _ := os.ReadDir(dir)
		if len(entries) != 2 {
			t.Fatalf("the CA directory holds %d files (temporaries left?)", len(entries))
		}
		c := cas[0].cert
		if !c.IsCA || c.Subject.CommonName != gwCAName || c.NotAfter.Before(time.Now().AddDate(9, 11, 0)) {
			t.Fatalf("CA certificate: %+v", c.Subject)
		}
		if info, _ := os.Stat(filepath.Join(dir, "ca.key")); info.Mode().Perm() != 0o600 {
			t.Fatalf("ca.key mode %v", info.Mode())
		}
	}
}

func TestGatewayAuditBound(t *testing.T) {
	dir := t.TempDir()
	a, err := openAudit(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	a.bound = 2000
	rec := gwAuditRecord{Kind: "dns", Host: strings.Repeat("h", 100), Decision: "refuse"}
	for i := 0; i < 40; i++ {
		a.write(rec)
	}
	a.seal()
	sealed, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(sealed) != 1 {
		t.Fatalf("sealed files: %v", sealed)
	}
	data, _ := os.ReadFile(sealed[0])
	if len(data) > 2000 || strings.Count(string(data), "\n") < 5 {
		t.Fatalf("%d bytes sealed", len(data))
	}
	if part, _ := os.Stat(filepath.Join(dir, "current.part")); part.Size() != 0 {
		t.Fatalf("current.part holds %d bytes after sealing", part.Size())
	}
	a.write(rec) // still over the bound: dropped
	a.seal()
	if again, _ := filepath.Glob(filepath.Join(dir, "*.jsonl")); len(again) != 1 {
		t.Fatalf("a line was written over the bound: %v", again)
	}
	os.Remove(sealed[0]) // the server read it
	a.seal()
	a.seal()
	after, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(after) != 1 {
		t.Fatalf("sealed after the server read: %v", after)
	}
	data, _ = os.ReadFile(after[0])
	var dropped struct {
		Kind  string `json:"kind"`
		Count int    `json:"count"`
	}
	if err := json.Unmarshal(data, &dropped); err != nil || dropped.Kind != "audit-dropped" || dropped.Count < 20 {
		t.Fatalf("the dropped line: %s %v", data, err)
	}
	name := filepath.Base(after[0])
	if len(name) != len("00000000000000000000.jsonl") {
		t.Fatalf("sealed name %q", name)
	}
}

func TestGatewayEntries(t *testing.T) {
	s, err := parseSessionFile("10.0.0.2", []byte(`{"session":"s","allow":["Example.com.","*.svc.test","db.test:5432",
		"*.raw.test:7000"],"deny":["x.svc.test","db.test:22"]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host string
		port int
		want bool
	}{
		{"example.com", 443, true}, {"example.com", 80, true}, {"example.com", 22, false},
		{"www.example.com", 443, false}, {"svc.test", 443, false}, {"a.svc.test", 443, true},
		{"a.b.svc.test", 80, true}, {"x.svc.test", 443, false}, {"y.x.svc.test", 443, true},
		{"db.test", 5432, true}, {"db.test", 443, false}, {"a.raw.test", 7000, true}, {"raw.test", 7000, false},
		{"1.2.3.4", 443, false}, {"xsvc.test", 443, false},
	} {
		if got := s.allowed(tc.host, tc.port); got != tc.want {
			t.Errorf("%s:%d allowed %v, want %v", tc.host, tc.port, got, tc.want)
		}
	}
	if !s.nameAllowed("db.test") || s.nameAllowed("x.svc.test") || !s.nameAllowed("q.raw.test") {
		t.Error("nameAllowed")
	}
	for _, bad := range []string{`{"allow":["1.2.3.4"]}`, `{"allow":["a.test:0"]}`, `{"allow":["a*.test"]}`,
		`{"deny":["[::1]"]}`, `{"allow":[""]}`} {
		if _, err := parseSessionFile("10.0.0.2", []byte(bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
	all, _ := parseSessionFile("10.0.0.2", []byte(`{"allow":null,"deny":["*.bad.test"]}`))
	if !all.allowed("any.test", 443) || all.allowed("any.test", 22) || all.allowed("x.bad.test", 80) {
		t.Error("allow null")
	}
	for _, h := range []string{"1.2.3.4", "[::1]", "::1", "127.1", "0x7f.1", "10.0.0.1.", "2130706433"} {
		if !isIPLiteral(h) {
			t.Errorf("%s is not an IP literal?", h)
		}
	}
	for _, h := range []string{"example.com", "1.2.3.example", "a1", "x.0a"} {
		if isIPLiteral(h) {
			t.Errorf("%s is an IP literal?", h)
		}
	}
	if got := fmt.Sprint(normHost("Example.COM.:8080")); got != "example.com" {
		t.Errorf("normHost: %q", got)
	}
}

// rawUpstream is a TCP server that speaks first ("hello <port>\n"), then echoes, and ends its side when the
// client ends its own.
func rawUpstream(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	go acceptLoop(ln, func(c net.Conn) {
		defer c.Close()
		fmt.Fprintf(c, "hello %d\n", port)
		_, _ = io.Copy(c, c)
		_ = c.(*net.TCPConn).CloseWrite()
	})
	return port
}

func TestGatewayRawPorts(t *testing.T) {
	pSingle, pTLS, pMulti, pGone := freePort(t), freePort(t), freePort(t), freePort(t)
	session := map[string]any{"session": "sbx-1", "allow": []string{
		fmt.Sprintf("db.allowed.test:%d", pSingle),
		fmt.Sprintf("other.test:%d", pTLS),
		fmt.Sprintf("*.other.test:%d", pMulti), fmt.Sprintf("allowed.test:%d", pMulti),
		fmt.Sprintf("gone.test:%d", pGone),
	}}
	gt := startGateway(t, session, nil)
	echoPort := rawUpstream(t)
	securePort := gt.secure.Listener.Addr().(*net.TCPAddr).Port
	for _, p := range []int{pSingle, pGone} {
		gt.extraUpstreamPorts.Store(p, echoPort)
	}
	for _, p := range []int{pTLS, pMulti} {
		gt.extraUpstreamPorts.Store(p, securePort)
	}
	addr := func(p int) string { return net.JoinHostPort(gwListen, strconv.Itoa(p)) }
	// the single entry: connected at once (the server speaks first), echoed, half-close passed on
	c, err := dialerFrom(gwClient).Dial("tcp", addr(pSingle))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || line != fmt.Sprintf("hello %d\n", echoPort) {
		t.Fatalf("banner: %q %v", line, err)
	}
	_, _ = c.Write([]byte("ping"))
	_ = c.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "ping" {
		t.Fatalf("echo after half-close: %q %v", rest, err)
	}
	c.Close()
	if rc, an := gt.rawDNS("udp", gwClient, "db.allowed.test", dnsTypeA); rc != dnsRcodeOK || an != 1 {
		t.Fatalf("DNS for a raw entry's name: %d %d", rc, an)
	}
	// an unknown client: reset
	c, err = dialerFrom(gwStranger).Dial("tcp", addr(pSingle))
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if !isReset(err) {
		t.Fatalf("unknown client: %v", err)
	}
	tlsTo := func(port int, sni string) error {
		raw, err := dialerFrom(gwClient).Dial("tcp", addr(port))
		if err != nil {
			return err
		}
		defer raw.Close()
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(gt.upstreamCA)
		tc := tls.Client(raw, &tls.Config{ServerName: sni, RootCAs: pool})
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		return tc.Handshake()
	}
	// one entry, TLS: its own name passes, another SNI (fronting) is reset
	if err := tlsTo(pTLS, "other.test"); err != nil {
		t.Fatalf("TLS to the entry: %v", err)
	}
	if err := tlsTo(pTLS, "allowed.test"); !isReset(err) {
		t.Fatalf("TLS naming another host: %v, want a reset", err)
	}
	// several entries: the SNI picks one; another name or no TLS is reset
	for _, sni := range []string{"a.other.test", "allowed.test"} {
		if err := tlsTo(pMulti, sni); err != nil {
			t.Fatalf("SNI %s among several entries: %v", sni, err)
		}
	}
	if err := tlsTo(pMulti, "evil.test"); !isReset(err) {
		t.Fatalf("an SNI no entry names: %v, want a reset", err)
	}
	c, _ = dialerFrom(gwClient).Dial("tcp", addr(pMulti))
	_, _ = c.Write([]byte("plain bytes, no ClientHello\n"))
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("no TLS among several entries: %v", err)
	}
	c.Close()
	gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "tcp" && r.Host == "allowed.test" && r.Decision == "refuse" && r.Port == pTLS
	})
	// a port no session names any more: its listener closes within 1 s
	session["allow"] = []string{fmt.Sprintf("db.allowed.test:%d", pSingle)}
	gt.writeJSON("sessions/"+gwClient+".json", session)
	changed := time.Now()
	for {
		c, err := net.Dial("tcp", addr(pGone))
		if err != nil {
			break
		}
		c.Close()
		if time.Since(changed) > time.Second {
			t.Fatal("the raw port still listens 1 s after no session names it")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestGatewayConnectionCap(t *testing.T) {
	gt := startGatewayWith(t, basicSession, nil, func(g *gateway) { g.conns = newConnLimit(4, 100) })
	var held []net.Conn
	for i := 0; i < 4; i++ {
		c, err := dialerFrom(gwClient).Dial("tcp", gt.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// the fifth at once from the same address: reset, not left hanging
	// (on loopback the reset may beat connect(2) itself)
	start := time.Now()
	c, err := dialerFrom(gwClient).Dial("tcp", gt.httpAddr)
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if !isReset(err) || time.Since(start) > 2*time.Second {
		t.Fatalf("over the cap: %v after %v, want a reset at once", err, time.Since(start))
	}
	held[0].Close()
	deadline := time.Now().Add(2 * time.Second)
	for {
		resp, _, err := gt.get(gt.httpClient(gwClient, false), "http://allowed.test/", nil)
		if err == nil && resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a connection closed did not free its slot: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range held[1:] {
		c.Close()
	}
}

func TestGatewayHeadTimeouts(t *testing.T) {
	gt := startGatewayWith(t, basicSession, secretFiles, func(g *gateway) { g.headTimeout = 300 * time.Millisecond })
	for _, tc := range []struct {
		name, addr string
		send       string
	}{
		{"443 silent", gt.httpsAddr, ""},
		{"443 half a ClientHello", gt.httpsAddr, "\x16\x03\x01\x02\x00\x01\x00\x01"},
		{"80 silent", gt.httpAddr, ""},
		{"80 half a head", gt.httpAddr, "GET / HTTP/1.1\r\nHost: allowed.test\r\n"},
		{"53/tcp silent", gt.dnsAddr, ""},
	} {
		c, err := dialerFrom(gwClient).Dial("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte(tc.send))
		start := time.Now()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadAll(c)
		c.Close()
		if elapsed := time.Since(start); elapsed > 2*time.Second || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s: still open after %v (%v)", tc.name, elapsed, err)
		}
	}
}

// TestGatewayNoGoroutineLeak runs each kind of connection, then checks the gateway's goroutines go back to
// what they were (idle upstream connections closed), and that a stopped gateway leaves none of its own.
func TestGatewayNoGoroutineLeak(t *testing.T) {
	gt := startGateway(t, secretSession, secretFiles)
	time.Sleep(100 * time.Millisecond)
	base := runtime.NumGoroutine()
	c := gt.httpClient(gwClient, true)
	for i := 0; i < 20; i++ {
		_, _, _ = gt.get(c, "http://allowed.test/", nil)
		_, _, _ = gt.get(c, "http://evil.test/", nil)
		_, _, _ = gt.get(c, "https://other.test/", nil)
		_, _, _ = gt.get(c, "https://secret.test/", map[string]string{"Authorization": gwPH})
		_, _ = gt.tlsDial(gwClient, "evil.test", gt.upstreamCA)
		gt.rawDNS("tcp", gwClient, "allowed.test", dnsTypeA)
	}
	c.CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	for {
		gt.g.mu.Lock()
		plainTr := gt.g.plainTr
		gt.g.mu.Unlock()
		plainTr.CloseIdleConnections()
		gt.g.state.Load().transport.CloseIdleConnections()
		n := runtime.NumGoroutine()
		if n <= base+2 {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the connections:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestGatewayUpstreamRefusedAddresses(t *testing.T) {
	listen := net.ParseIP("10.9.0.2")
	st := &gwState{listenIP: listen}
	for _, tc := range []struct {
		ip   string
		want bool
	}{
		{"127.0.0.1", false}, {"0.0.0.0", false}, {"169.254.169.254", false}, {"224.0.0.1", false},
		{"10.9.0.2", false}, {"93.184.216.34", true}, {"10.9.0.3", true},
	} {
		if got := defaultUpstreamOK(net.ParseIP(tc.ip), st); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.ip, got, tc.want)
		}
	}
	// the default check in place: the test's upstreams are on loopback, so an allowed name fails visibly
	gt := startGatewayWith(t, basicSession, nil, func(g *gateway) { g.upstreamOK = defaultUpstreamOK })
	resp, e, err := gt.get(gt.httpClient(gwClient, false), "http://allowed.test/", nil)
	if err != nil || resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Tai-Sandbox-Egress") != "upstream-error" ||
		!strings.Contains(e.Body, "does not dial") {
		t.Fatalf("port 80 to a loopback address: %v %+v %q", err, resp, e.Body)
	}
	if _, err := gt.tlsDial(gwClient, "other.test", gt.upstreamCA); !isReset(err) {
		t.Fatalf("443 to a loopback address: %v, want a reset", err)
	}
	lines := gt.auditLines(func(r gwAuditRecord) bool {
		return r.Kind == "tls" && r.Host == "other.test" && r.Decision == "allow" && strings.HasPrefix(r.Reason, "upstream: ")
	})
	found := false
	for _, l := range lines {
		found = found || l.Kind == "http" && l.Host == "allowed.test" && strings.HasPrefix(l.Reason, "upstream: ")
	}
	if !found {
		t.Fatalf("no upstream line for port 80: %+v", lines)
	}
}

// TestGatewayWaitsForConfig starts a gateway before its gateway.json exists: it writes `ready` only once the
// file is there, and removes it when it stops.
func TestGatewayWaitsForConfig(t *testing.T) {
	dir := t.TempDir()
	g := newGateway(dir, filepath.Join(t.TempDir(), "ca"))
	g.logf = func(string, ...any) {}
	g.ports = gwPorts{dns: freePort(t), http: freePort(t), https: freePort(t)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.run(ctx) }()
	time.Sleep(600 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
		t.Fatal("ready without a gateway.json")
	}
	data, _ := json.Marshal(map[string]any{"listen": gwListen})
	if err := os.WriteFile(filepath.Join(dir, "gateway.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if pid, err := os.ReadFile(filepath.Join(dir, "ready")); err == nil {
			if strings.TrimSpace(string(pid)) != strconv.Itoa(os.Getpid()) {
				t.Fatalf("ready holds %q", pid)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready 5 s after gateway.json appeared")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := g.state.Load(); st.cfg.BodyLimit != gwDefaultBodyLimit {
		t.Fatalf("body_limit default: %d", st.cfg.BodyLimit)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
		t.Fatal("ready left after a clean stop")
	}
	if _, err := os.Stat(filepath.Join(dir, "audit")); err != nil {
		t.Fatalf("audit directory: %v", err)
	}
}

// TestGatewayUpgrade carries an upgraded stream (what a WebSocket is) through port 80 and through a
// terminated connection (its request's placeholder replaced first).
func TestGatewayUpgrade(t *testing.T) {
	gt := startGateway(t, secretSession, secretFiles)
	ca, err := os.ReadFile(filepath.Join(gt.caDir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, host, want string
		tls              bool
	}{
		{"port 80", "allowed.test", gwPH, false},
		{"terminated", "secret.test", gwSecretValue, true}, // the upstream gets the value; the session reads the placeholder back
	} {
		addr := gt.httpAddr
		if tc.tls {
			addr = gt.httpsAddr
		}
		conn, err := dialerFrom(gwClient).Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if tc.tls {
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(ca)
			conn = tls.Client(conn, &tls.Config{ServerName: tc.host, RootCAs: pool})
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		id := "upgrade-" + tc.name
		fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: tai-test\r\nAuthorization: %s\r\nX-Test-Id: %s\r\n\r\n",
			tc.host, gwPH, id)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("X-Auth") != gwPH {
			t.Fatalf("%s: %v %+v", tc.name, err, resp)
		}
		if got := seenUpstream(t, id).Header.Get("Authorization"); got != tc.want {
			t.Fatalf("%s: the upstream got %q", tc.name, got)
		}
		for _, msg := range []string{"ping", "pong"} {
			_, _ = conn.Write([]byte(msg))
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
				t.Fatalf("%s: echoed %q %v", tc.name, got, err)
			}
		}
		conn.Close()
	}
}

// TestGatewayResolverSharesLookups: many connections to one name at once make one upstream query, and the
// answer is cached.
func TestGatewayResolverSharesLookups(t *testing.T) {
	gt := startGateway(t, basicSession, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ips, err := gt.g.resolver.lookup(context.Background(), "www.allowed.test")
			if err == nil && (len(ips) != 1 || !ips[0].Equal(net.IPv4(127, 0, 0, 1))) {
				err = fmt.Errorf("%v", ips)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := gt.dns.queries.Load(); n != 1 {
		t.Fatalf("%d upstream queries for one name", n)
	}
	if _, err := gt.g.resolver.lookup(context.Background(), "x.nx.test"); err == nil {
		t.Fatal("NXDOMAIN upstream resolved")
	}
}
