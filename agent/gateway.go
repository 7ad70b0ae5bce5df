// The egress gateway (`tai-agent gateway`): the one way out of an owner's filtered network. It answers DNS
// for the names a session may reach with its own address, then proxies HTTP by Host, TLS by SNI and listed
// raw TCP ports to the address it resolved itself. Its configuration is a directory of JSON files the server
// writes (atomically) and the gateway polls. See GATEWAY.md.

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	gwPollEvery        = 250 * time.Millisecond
	gwHeadTimeout      = 10 * time.Second // to read a request head or a ClientHello
	gwDialTimeout      = 10 * time.Second
	gwMaxHead          = 64 << 10
	gwDefaultBodyLimit = 1 << 20
	gwMaxConfigFile    = 1 << 20 // a session or secret file larger than this is ignored (refused)
	gwMaxPerClient     = 512     // connections at once from one source address; more are reset
	gwMaxConns         = 4096    // connections at once in all (a 256 MiB container)
	gwMaxTerminated    = 1024    // terminated TLS connections at once (each holds TLS and HTTP buffers)
	gwMemoryLimit      = 192 << 20
	gwMaxEntries       = 4096 // entries of one session file
)

// gwPorts are the ports the gateway listens on (tests use unprivileged ones).
type gwPorts struct{ dns, http, https int }

// gatewayConfig is gateway.json.
type gatewayConfig struct {
	Deployment       string `json:"deployment"`
	Owner            string `json:"owner"`
	Listen           string `json:"listen"`
	Resolver         string `json:"resolver"`
	UpstreamRootsPEM string `json:"upstream_roots_pem"`
	BodyLimit        int64  `json:"body_limit"`
}

// gwEntry is one policy entry: `name`, `*.name`, `*`, each optionally `:port`.
type gwEntry struct {
	name     string // without "*." for a wildcard; "" for `*`
	wildcard bool
	any      bool
	port     int // 0: ports 80 and 443
}

func parseEntry(s string) (gwEntry, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	var e gwEntry
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := strconv.Atoi(s[i+1:])
		if err != nil || p < 1 || p > 65535 {
			return e, fmt.Errorf("entry %q: bad port", s)
		}
		e.port = p
		s = s[:i]
	}
	s = strings.TrimSuffix(s, ".")
	switch {
	case s == "*":
		e.any = true
		return e, nil
	case strings.HasPrefix(s, "*."):
		e.wildcard = true
		s = s[2:]
	}
	if s == "" || strings.ContainsAny(s, "*/ \t") || isIPLiteral(s) {
		return e, fmt.Errorf("entry %q: not a host name", s)
	}
	e.name = s
	return e, nil
}

func (e gwEntry) matchName(host string) bool {
	switch {
	case e.any:
		return true
	case e.wildcard:
		return len(host) > len(e.name)+1 && strings.HasSuffix(host, e.name) && host[len(host)-len(e.name)-1] == '.'
	}
	return host == e.name
}

// ports an entry opens: a plain entry 80 and 443, a `:port` entry that port.
func (e gwEntry) matchPort(port int) bool {
	if e.port == 0 {
		return port == 80 || port == 443
	}
	return e.port == port
}

func parseEntries(list []string) ([]gwEntry, error) {
	if len(list) > gwMaxEntries {
		return nil, fmt.Errorf("%d entries (at most %d)", len(list), gwMaxEntries)
	}
	out := make([]gwEntry, 0, len(list))
	for _, s := range list {
		e, err := parseEntry(s)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// gwSession is one session file: the policy for one client address.
type gwSession struct {
	ip       string
	id       string
	allowAll bool // "allow": null: any name on 80 and 443
	allow    []gwEntry
	deny     []gwEntry
	secrets  map[string]string // placeholder -> secret name
}

type sessionFile struct {
	Session string            `json:"session"`
	Allow   *[]string         `json:"allow"`
	Deny    []string          `json:"deny"`
	Secrets map[string]string `json:"secrets"`
}

func parseSessionFile(ip string, data []byte) (*gwSession, error) {
	var f sessionFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	s := &gwSession{ip: ip, id: f.Session, secrets: map[string]string{}}
	var err error
	if f.Allow == nil {
		s.allowAll = true
	} else if s.allow, err = parseEntries(*f.Allow); err != nil {
		return nil, fmt.Errorf("allow: %w", err)
	}
	if s.deny, err = parseEntries(f.Deny); err != nil {
		return nil, fmt.Errorf("deny: %w", err)
	}
	for ph, name := range f.Secrets {
		if len(ph) < 16 || name == "" {
			return nil, fmt.Errorf("secrets: placeholder %q too short or no name", ph)
		}
		s.secrets[ph] = name
	}
	return s, nil
}

func (s *gwSession) denied(host string, port int) bool {
	for _, e := range s.deny {
		if e.matchName(host) && (e.port == 0 || e.port == port) {
			return true
		}
	}
	return false
}

// allowed says whether the session may reach host:port (host normalized, not an IP literal).
func (s *gwSession) allowed(host string, port int) bool {
	if host == "" || isIPLiteral(host) || s.denied(host, port) {
		return false
	}
	if s.allowAll {
		return port == 80 || port == 443
	}
	for _, e := range s.allow {
		if e.matchName(host) && e.matchPort(port) {
			return true
		}
	}
	return false
}

// nameAllowed is the DNS question: may the session reach this name on some port.
func (s *gwSession) nameAllowed(host string) bool {
	if host == "" || isIPLiteral(host) {
		return false
	}
	if s.allowAll {
		return s.allowed(host, 80) || s.allowed(host, 443)
	}
	for _, e := range s.allow {
		if !e.matchName(host) {
			continue
		}
		if e.port == 0 && (s.allowed(host, 80) || s.allowed(host, 443)) || e.port != 0 && s.allowed(host, e.port) {
			return true
		}
	}
	return false
}

// rawPorts are the ports of the session's `name:port` entries (not 53, 80, 443).
func (s *gwSession) rawPorts() []int {
	var out []int
	for _, e := range s.allow {
		if e.port != 0 && e.port != 53 && e.port != 80 && e.port != 443 {
			out = append(out, e.port)
		}
	}
	return out
}

// gwSecret is one secrets file.
type gwSecret struct {
	Value string   `json:"value"`
	Hosts []string `json:"hosts"`
	Query bool     `json:"query"`
	Body  bool     `json:"body"`
	hosts []gwEntry
}

func parseSecretFile(data []byte) (*gwSecret, error) {
	var s gwSecret
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, err
	}
	var err error
	if s.hosts, err = parseEntries(s.Hosts); err != nil {
		return nil, err
	}
	for _, e := range s.hosts {
		if e.any || e.port != 0 {
			return nil, errors.New("a secret's hosts are names or *.names, without ports")
		}
	}
	return &s, nil
}

func (s *gwSecret) forHost(host string) bool {
	for _, e := range s.hosts {
		if e.matchName(host) {
			return true
		}
	}
	return false
}

// gwState is one consistent view of the configuration: connections and queries load it once per decision.
type gwState struct {
	cfg       gatewayConfig
	listenIP  net.IP
	sessions  map[string]*gwSession // by client address
	secrets   map[string]*gwSecret  // by secret name
	rawPorts  map[int]bool
	transport *http.Transport // upstream HTTPS for terminated TLS (its roots: cfg.UpstreamRootsPEM)
}

// secretsFor lists the session's secrets whose hosts include host, with their placeholders.
func (st *gwState) secretsFor(sess *gwSession, host string) []gwSub {
	var out []gwSub
	for ph, name := range sess.secrets {
		sec := st.secrets[name]
		if sec != nil && sec.forHost(host) {
			out = append(out, gwSub{placeholder: ph, name: name, secret: sec})
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i].placeholder) > len(out[j].placeholder) })
	return out
}

type gwSub struct {
	placeholder string
	name        string
	secret      *gwSecret
}

// fileSig tells a changed file: a rename gives a new inode.
type fileSig struct {
	ino   uint64
	size  int64
	mtime int64
}

type gateway struct {
	dir, caDir string
	ports      gwPorts
	pollEvery  time.Duration
	// headTimeout bounds reading a request head, a ClientHello, a DNS message over TCP
	headTimeout time.Duration
	// upstreamPort maps the port the gateway dials upstream (tests: 443 -> a test server's port)
	upstreamPort func(int) int
	// upstreamOK says whether the gateway may dial a resolved address (default: not loopback, unspecified,
	// multicast, link-local, nor its own address)
	upstreamOK func(ip net.IP, st *gwState) bool
	logf       func(format string, args ...any)

	state    atomic.Pointer[gwState]
	sigs     map[string]fileSig
	sessions map[string]*gwSession
	secrets  map[string]*gwSecret
	cfgSig   fileSig
	rootsPEM string

	audit    *gwAudit
	ca       *gwCA
	resolver *gwResolver
	conns    *gwConnLimit
	dnsDedup *gwDedup

	mu        sync.Mutex
	listeners []net.Listener
	udp       net.PacketConn
	raw       map[int]net.Listener
	rawRetry  map[int]time.Time
	wg        sync.WaitGroup
	mitm      *gwMITM
	plainHTTP *http.Server
	plainTr   *http.Transport
}

func newGateway(dir, caDir string) *gateway {
	g := &gateway{
		dir: dir, caDir: caDir,
		ports:        gwPorts{dns: 53, http: 80, https: 443},
		pollEvery:    gwPollEvery,
		headTimeout:  gwHeadTimeout,
		upstreamPort: func(p int) int { return p },
		sigs:         map[string]fileSig{},
		sessions:     map[string]*gwSession{},
		secrets:      map[string]*gwSecret{},
		raw:          map[int]net.Listener{},
		rawRetry:     map[int]time.Time{},
		conns:        newConnLimit(gwMaxPerClient, gwMaxConns),
		dnsDedup:     newDedup(),
		logf: func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "tai-agent gateway: "+format+"\n", args...)
		},
	}
	g.upstreamOK = defaultUpstreamOK
	g.resolver = newResolver(g)
	return g
}

func defaultUpstreamOK(ip net.IP, st *gwState) bool {
	if ip.IsLoopback() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() {
		return false
	}
	return st == nil || !ip.Equal(st.listenIP)
}

// gatewayMain is `tai-agent gateway --dir DIR --ca DIR`.
func gatewayMain(args []string) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	dir := fs.String("dir", "/run/tai-gateway", "the configuration directory the server writes")
	caDir := fs.String("ca", "/var/lib/tai-gateway/ca", "the CA's directory (ca.pem, ca.key; created if missing)")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: tai-agent gateway [--dir DIR] [--ca DIR]")
		return 64
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-sigs; cancel() }()
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(gwMemoryLimit) // collect harder before the container's limit, not after
	}
	g := newGateway(*dir, *caDir)
	if err := g.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "tai-agent gateway:", err)
		return 70
	}
	return 0
}

// run waits for gateway.json, creates or loads the CA, listens, writes `ready`, then polls the directory
// until ctx ends.
func (g *gateway) run(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Join(g.dir, "audit"), 0o700); err != nil {
		return err
	}
	var err error
	if g.ca, err = loadOrCreateCA(g.caDir); err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	g.mitm = newMITM(g)
	defer g.mitm.close() // also when ctx ends before gateway.json came
	for {
		if err := g.poll(); err == nil && g.state.Load() != nil {
			break
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			g.logf("gateway.json: %v", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(g.pollEvery):
		}
	}
	st := g.state.Load()
	g.audit, err = openAudit(filepath.Join(g.dir, "audit"))
	if err != nil {
		return err
	}
	defer g.audit.close()
	if err := g.listen(st); err != nil {
		g.closeListeners()
		return err
	}
	defer g.closeListeners()
	g.syncRawPorts(st)
	ready := filepath.Join(g.dir, "ready")
	if err := writeFileAtomic(ready, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(ready) // a clean stop: no stale `ready` for the next gateway's server to trust
	tick := time.NewTicker(g.pollEvery)
	defer tick.Stop()
	seal := time.NewTicker(time.Second)
	defer seal.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-seal.C:
			g.audit.seal()
		case <-tick.C:
			// a lasting problem (a missing gateway.json) is said once, not every 250 ms
			if err := g.poll(); err != nil && err.Error() != lastErr {
				g.logf("%v", err)
				lastErr = err.Error()
			} else if err == nil {
				lastErr = ""
			}
			g.syncRawPorts(g.state.Load())
		}
	}
}

func (g *gateway) listen(st *gwState) error {
	ip := st.listenIP.String()
	udp, err := net.ListenPacket("udp", net.JoinHostPort(ip, strconv.Itoa(g.ports.dns)))
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.udp = udp
	g.mu.Unlock()
	g.goServe(func() { g.serveDNSUDP(udp) })
	for _, l := range []struct {
		port  int
		serve func(net.Listener)
	}{{g.ports.dns, g.serveDNSTCP}, {g.ports.http, g.serveHTTP}, {g.ports.https, g.serveTLS}} {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(l.port)))
		if err != nil {
			return err
		}
		ln = g.conns.wrap(ln)
		g.mu.Lock()
		g.listeners = append(g.listeners, ln)
		g.mu.Unlock()
		serve := l.serve
		g.goServe(func() { serve(ln) })
	}
	return nil
}

func (g *gateway) goServe(f func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
}

func (g *gateway) closeListeners() {
	g.mu.Lock()
	if g.udp != nil {
		g.udp.Close()
	}
	for _, ln := range g.listeners {
		ln.Close()
	}
	for p, ln := range g.raw {
		ln.Close()
		delete(g.raw, p)
	}
	g.mu.Unlock()
	g.mu.Lock()
	plain, plainTr := g.plainHTTP, g.plainTr
	g.mu.Unlock()
	if plain != nil {
		plain.Close()
	}
	g.mitm.close()
	g.wg.Wait()
	if plainTr != nil {
		plainTr.CloseIdleConnections()
	}
	if st := g.state.Load(); st != nil && st.transport != nil {
		st.transport.CloseIdleConnections()
	}
}

// poll reads what changed in the directory and publishes a new state when anything did.
func (g *gateway) poll() error {
	changed := false
	var firstErr error
	note := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	cfgPath := filepath.Join(g.dir, "gateway.json")
	sig, err := statSig(cfgPath)
	if err != nil {
		if g.state.Load() == nil {
			return err
		}
		note(fmt.Errorf("gateway.json: %w (keeping the last one)", err))
	}
	cfg := gatewayConfig{}
	if old := g.state.Load(); old != nil {
		cfg = old.cfg
	}
	if err == nil && sig != g.cfgSig {
		data, err := readBounded(cfgPath)
		var c gatewayConfig
		if err == nil {
			err = json.Unmarshal(data, &c)
		}
		if err == nil && net.ParseIP(c.Listen) == nil {
			err = fmt.Errorf("listen %q is not an IP address", c.Listen)
		}
		if err != nil {
			if g.state.Load() == nil {
				return fmt.Errorf("gateway.json: %w", err)
			}
			note(fmt.Errorf("gateway.json: %w (keeping the last one)", err))
		} else {
			if old := g.state.Load(); old != nil && c.Listen != old.cfg.Listen {
				note(fmt.Errorf("gateway.json: listen changed to %s: a restart applies it", c.Listen))
				c.Listen = old.cfg.Listen
			}
			if c.BodyLimit <= 0 {
				c.BodyLimit = gwDefaultBodyLimit
			}
			cfg = c
			g.cfgSig = sig
			changed = true
		}
	}
	changed = g.pollDir("sessions", func(name string, data []byte) error {
		ip := strings.TrimSuffix(name, ".json")
		if net.ParseIP(ip) == nil {
			return fmt.Errorf("sessions/%s: not named by an IP address", name)
		}
		s, err := parseSessionFile(ip, data)
		if err != nil {
			delete(g.sessions, ip)
			return fmt.Errorf("sessions/%s: %w (the client is refused)", name, err)
		}
		g.sessions[ip] = s
		return nil
	}, func(name string) { delete(g.sessions, strings.TrimSuffix(name, ".json")) }, note) || changed
	changed = g.pollDir("secrets", func(name string, data []byte) error {
		s, err := parseSecretFile(data)
		key := strings.TrimSuffix(name, ".json")
		if err != nil {
			delete(g.secrets, key)
			return fmt.Errorf("secrets/%s: %w (not substituted)", name, err)
		}
		g.secrets[key] = s
		return nil
	}, func(name string) { delete(g.secrets, strings.TrimSuffix(name, ".json")) }, note) || changed
	if !changed {
		return firstErr
	}
	st := &gwState{cfg: cfg, listenIP: net.ParseIP(cfg.Listen), sessions: make(map[string]*gwSession, len(g.sessions)),
		secrets: make(map[string]*gwSecret, len(g.secrets)), rawPorts: map[int]bool{}}
	for k, v := range g.sessions {
		st.sessions[k] = v
		for _, p := range v.rawPorts() {
			st.rawPorts[p] = true
		}
	}
	for k, v := range g.secrets {
		st.secrets[k] = v
	}
	old := g.state.Load()
	if old != nil && old.transport != nil && cfg.UpstreamRootsPEM == g.rootsPEM {
		st.transport = old.transport
	} else {
		t, err := g.newUpstreamTransport(cfg.UpstreamRootsPEM)
		if err != nil {
			note(fmt.Errorf("upstream_roots_pem: %w (using the system pool)", err))
		}
		if old != nil && old.transport != nil {
			old.transport.CloseIdleConnections()
		}
		st.transport = t
		g.rootsPEM = cfg.UpstreamRootsPEM
	}
	if old != nil && old.cfg.Resolver != cfg.Resolver {
		g.resolver.flush() // names resolved through the old resolver are not kept
	}
	g.state.Store(st)
	return firstErr
}

// pollDir reloads the changed *.json files of one subdirectory; it says whether anything changed.
func (g *gateway) pollDir(sub string, load func(name string, data []byte) error, drop func(name string),
	note func(error)) bool {
	dir := filepath.Join(g.dir, sub)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		note(err)
		return false
	}
	changed := false
	seen := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") || !e.Type().IsRegular() {
			continue
		}
		key := sub + "/" + name
		seen[key] = true
		sig, err := statSig(filepath.Join(dir, name))
		if err != nil {
			continue // gone meanwhile: the next poll drops it
		}
		if old, ok := g.sigs[key]; ok && old == sig {
			continue
		}
		g.sigs[key] = sig
		changed = true
		data, err := readBounded(filepath.Join(dir, name))
		if err == nil {
			err = load(name, data)
		} else {
			drop(name)
		}
		note(err)
	}
	for key := range g.sigs {
		if strings.HasPrefix(key, sub+"/") && !seen[key] {
			delete(g.sigs, key)
			drop(strings.TrimPrefix(key, sub+"/"))
			changed = true
		}
	}
	return changed
}

func statSig(path string) (fileSig, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return fileSig{}, os.ErrNotExist
		}
		return fileSig{}, err
	}
	return fileSig{ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, gwMaxConfigFile+1))
	if err == nil && len(data) > gwMaxConfigFile {
		err = fmt.Errorf("%s: larger than %d bytes", path, gwMaxConfigFile)
	}
	return data, err
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := fmt.Sprintf("%s.tmp-%d", path, os.Getpid())
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// newUpstreamTransport is the HTTPS client of terminated TLS: verified against the system pool and pem's
// certificates too, dialing the address the gateway resolves.
func (g *gateway) newUpstreamTransport(pem string) (*http.Transport, error) {
	var roots *x509.CertPool // nil: the system pool
	var err error
	if strings.TrimSpace(pem) != "" {
		if roots, err = x509.SystemCertPool(); err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		err = nil
		if !roots.AppendCertsFromPEM([]byte(pem)) {
			roots, err = nil, errors.New("no certificate in the PEM")
		}
	}
	return &http.Transport{
		DialContext:            g.dialUpstreamAddr,
		TLSClientConfig:        &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    gwDialTimeout,
		MaxIdleConnsPerHost:    16,
		IdleConnTimeout:        60 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
		DisableCompression:     true,
	}, err
}

// isIPLiteral refuses what any resolver or client could read as an address: an IPv4 or IPv6 literal,
// bracketed or not, and names whose last label is numeric (inet_aton's `127.1`, `0x7f.1`).
func isIPLiteral(host string) bool {
	h := strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if i := strings.IndexByte(h, '%'); i >= 0 {
		h = h[:i]
	}
	if net.ParseIP(h) != nil {
		return true
	}
	last := h[strings.LastIndexByte(h, '.')+1:]
	if last == "" {
		return false
	}
	if strings.HasPrefix(last, "0x") {
		return true
	}
	for _, c := range last {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// normHost is a Host or SNI as the policy matches it: the port stripped, lower case, no trailing dot.
func normHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

func addrIP(a net.Addr) string {
	switch v := a.(type) {
	case *net.TCPAddr:
		return v.IP.String()
	case *net.UDPAddr:
		return v.IP.String()
	}
	h, _, _ := net.SplitHostPort(a.String())
	return h
}

// audit writes one decision.
func (g *gateway) auditf(st *gwState, sess *gwSession, client, kind, host string, port int, allow bool, reason, secret string) {
	if g.audit == nil {
		return
	}
	rec := gwAuditRecord{Time: time.Now().UTC().Format(time.RFC3339Nano), Client: client, Kind: kind, Host: host,
		Port: port, Decision: "refuse", Reason: reason, Secret: secret}
	if st != nil {
		rec.Deployment, rec.Owner = st.cfg.Deployment, st.cfg.Owner
	}
	if sess != nil {
		rec.Session = sess.id
	}
	if allow {
		rec.Decision = "allow"
	}
	g.audit.write(rec)
}
