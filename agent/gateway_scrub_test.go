package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

var scrubTestPairs = scrubPairs([]gwSub{
	{placeholder: "PH-A", name: "a", secret: &gwSecret{Value: "value-a"}},
	{placeholder: "PH-AB", name: "ab", secret: &gwSecret{Value: "value-a-longer"}},
}, nil)

// TestGatewayScrubStream: a real value split across reads of any size comes back as its placeholder, the
// longest value first where two start at one place, and every other byte unchanged.
func TestGatewayScrubStream(t *testing.T) {
	in := strings.Repeat("x", 70000) + "value-a|value-a-longer|val" + "ue-a" + strings.Repeat("y", 5) + "value-"
	want := strings.Repeat("x", 70000) + "PH-A|PH-AB|PH-A" + strings.Repeat("y", 5) + "value-"
	for _, size := range []int{1, 2, 3, 7, 4096, 1 << 20} {
		r := &scrubReader{src: io.NopCloser(iotest.OneByteReader(strings.NewReader(in))), pairs: scrubTestPairs,
			longest: len(scrubTestPairs[0].from), buf: make([]byte, size)}
		got, err := io.ReadAll(r)
		if err != nil || string(got) != want {
			t.Fatalf("read size %d: %v: %q", size, err, got[len(got)-40:])
		}
	}
}

// TestGatewayScrubResponse: headers, a body of known length (a new Content-Length), a streamed one, a gzip
// one (decoded) and an encoding the gateway cannot read (refused).
func TestGatewayScrubResponse(t *testing.T) {
	resp := func(body io.Reader, length int64, encoding string) *http.Response {
		h := http.Header{"X-Echo": {"Bearer value-a"}}
		if encoding != "" {
			h.Set("Content-Encoding", encoding)
		}
		return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(body), ContentLength: length}
	}
	r := resp(strings.NewReader("token=value-a"), 13, "")
	if err := scrubResponse(r, scrubTestPairs, 1<<20); err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r.Body)
	if string(got) != "token=PH-A" || r.ContentLength != 10 || r.Header.Get("Content-Length") != "10" ||
		r.Header.Get("X-Echo") != "Bearer PH-A" {
		t.Fatalf("known length: %q %d %v", got, r.ContentLength, r.Header)
	}
	r = resp(strings.NewReader("token=value-a"), -1, "")
	if err := scrubResponse(r, scrubTestPairs, 1<<20); err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(r.Body); string(got) != "token=PH-A" || r.ContentLength != -1 {
		t.Fatalf("streamed: %q", got)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write([]byte("token=value-a"))
	_ = zw.Close()
	r = resp(&zipped, int64(zipped.Len()), "gzip")
	if err := scrubResponse(r, scrubTestPairs, 1<<20); err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(r.Body); string(got) != "token=PH-A" || r.Header.Get("Content-Encoding") != "" {
		t.Fatalf("gzip: %q %v", got, r.Header)
	}
	if err := scrubResponse(resp(strings.NewReader("?"), 1, "br"), scrubTestPairs, 1<<20); err == nil {
		t.Fatal("a body in an encoding the gateway cannot read was passed on")
	}
	// a binary download passes unchanged, with its length (its headers are still scrubbed)
	r = resp(strings.NewReader("value-a"), 7, "")
	r.Header.Set("Content-Type", "application/octet-stream")
	if err := scrubResponse(r, scrubTestPairs, 1<<20); err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(r.Body); string(got) != "value-a" || r.ContentLength != 7 || r.Header.Get("X-Echo") != "Bearer PH-A" {
		t.Fatalf("binary: %q %d %v", got, r.ContentLength, r.Header)
	}
	for _, ct := range []string{"", "text/html; charset=utf-8", "application/json", "application/problem+json"} {
		if !textual(ct) {
			t.Fatalf("%q is textual", ct)
		}
	}
}
