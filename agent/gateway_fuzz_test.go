package main

import (
	"bytes"
	"crypto/tls"
	"net"
	"testing"
	"time"
)

// realClientHello is the first flight of Go's own TLS client for sni.
func realClientHello(sni string) []byte {
	a, b := net.Pipe()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_ = c.Handshake()
		a.Close()
	}()
	_ = b.SetDeadline(time.Now().Add(2 * time.Second))
	raw, _, _ := readClientHello(b)
	b.Close()
	return raw
}

// FuzzGatewayParsers feeds the gateway's parsers of what a session sends: a DNS message (first byte 0) or a
// TLS stream (first byte 1). None may panic; a DNS query that parses gets a reply that parses back to the
// same question; a ClientHello read never goes past the 64 KiB bound and replays exactly the bytes it read.
func FuzzGatewayParsers(f *testing.F) {
	q := []byte{0, 0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	q, _ = appendDNSName(q, "www.Example.com")
	f.Add(append(q, 0, 1, 0, 1))
	f.Add([]byte{0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0xC0, 12, 0, 1, 0, 1, 0xC0, 12, 0, 0, 0, 5, 0, 4, 1, 2, 3, 4})
	f.Add([]byte{0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xC0, 0x0C})
	f.Add(append([]byte{1}, realClientHello("example.com")...))
	f.Add(append([]byte{1}, realClientHello("")...))
	f.Add([]byte{1, 22, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		kind, m := data[0], data[1:]
		if kind&1 == 0 {
			q, err := parseDNSQuery(m)
			if _, _, _, aerr := parseDNSAnswer(m, 0x1234, "example.com"); aerr == nil && len(m) < 12 {
				t.Fatal("an answer shorter than a header")
			}
			if err != nil {
				return
			}
			if len(q.name) > dnsMaxName {
				t.Fatalf("a name of %d bytes", len(q.name))
			}
			reply := dnsReply(m, q, dnsRcodeOK, net.IPv4(10, 0, 0, 1))
			h, err := readDNSHeader(reply)
			if err != nil || h.id != q.hdr.id || h.qd != 1 || h.an != 1 || h.flags&0x8000 == 0 {
				t.Fatalf("reply header %+v %v", h, err)
			}
			back, err := parseDNSQuery(reply)
			if err != nil || back.name != q.name || back.qtype != q.qtype {
				t.Fatalf("the reply's question %q %v, asked %q", back.name, err, q.name)
			}
			return
		}
		_, _ = parseClientHello(m)
		raw, _, _ := readClientHello(bytes.NewReader(m))
		if len(raw) > maxHelloBytes+5 || !bytes.HasPrefix(m, raw) {
			t.Fatalf("read %d bytes, not a prefix of the stream", len(raw))
		}
	})
}
