package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// BenchmarkGatewayDownload downloads 64 MiB over one connection: straight from the upstream, through the
// gateway's TLS pass-through, and through a terminated (secret host) connection. Run with
// `go test -run '^$' -bench Gateway -benchtime 5x .`; the ratios are what issue 52's targets compare.
func BenchmarkGatewayDownload(b *testing.B) {
	const size = 64 << 20
	gt := startGateway(b, secretSession, secretFiles)
	chunk := make([]byte, 1<<20)
	big := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for i := 0; i < size/len(chunk); i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	big.TLS = gt.secure.TLS
	big.StartTLS()
	b.Cleanup(big.Close)
	bigPort := big.Listener.Addr().(*net.TCPAddr).Port
	gt.g.upstreamPort = func(p int) int { return bigPort }
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(gt.upstreamCA)
	direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: (&net.Dialer{}).DialContext, DisableKeepAlives: true}}
	for _, tc := range []struct {
		name   string
		client *http.Client
		url    string
	}{
		{"direct", direct, "https://other.test:" + strconv.Itoa(bigPort) + "/"},
		{"pass-through", gt.httpClient(gwClient, true), "https://other.test/"},
		{"terminated", gt.httpClient(gwClient, true), "https://secret.test/"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if tc.name == "direct" {
				tc.client.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, big.Listener.Addr().String())
				}
			}
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				resp, err := tc.client.Get(tc.url)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || n != size {
					b.Fatalf("%d bytes, %v", n, err)
				}
			}
		})
	}
}

// BenchmarkGatewayFirstByte is a new connection's time to the first byte of a small response.
func BenchmarkGatewayFirstByte(b *testing.B) {
	gt := startGateway(b, secretSession, secretFiles)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(gt.upstreamCA)
	securePort := gt.secure.Listener.Addr().String()
	direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, securePort)
		}, DisableKeepAlives: true}}
	for _, tc := range []struct {
		name   string
		client *http.Client
		url    string
	}{
		{"direct", direct, "https://other.test/"},
		{"pass-through", gt.httpClient(gwClient, true), "https://other.test/"},
		{"terminated", gt.httpClient(gwClient, true), "https://secret.test/"},
		{"http", gt.httpClient(gwClient, true), "http://allowed.test/"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				resp, err := tc.client.Get(tc.url)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
