// Responses from a secret's hosts go back to the session with the real value turned into the placeholder
// again: a host that echoes a request (an error page quoting the Authorization header, an API that shows a
// token) would otherwise hand the session the very value the gateway keeps from it.

package main

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// gwPair is one replacement in a response: a form of a real value (from) and what the session sent (to).
type gwPair struct{ from, to []byte }

// scrubPairs are the forms of each secret of subs the session must never read back: the value itself, its
// query-escaped and base64 forms, and each Basic credential the gateway made for this request (made).
func scrubPairs(subs []gwSub, made [][2]string) []gwPair {
	var pairs []gwPair
	add := func(from, to string) {
		if from != "" && from != to {
			pairs = append(pairs, gwPair{[]byte(from), []byte(to)})
		}
	}
	for _, s := range subs {
		add(s.secret.Value, s.placeholder)
		add(url.QueryEscape(s.secret.Value), url.QueryEscape(s.placeholder))
		add(base64.StdEncoding.EncodeToString([]byte(s.secret.Value)), base64.StdEncoding.EncodeToString([]byte(s.placeholder)))
	}
	for _, m := range made {
		add(m[0], m[1])
	}
	sort.Slice(pairs, func(i, j int) bool { return len(pairs[i].from) > len(pairs[j].from) })
	return pairs
}

// scrubResponse turns real values in resp's headers and body back into placeholders; a body only when it
// is textual (by its Content-Type: a binary download passes unchanged, with its length). A body is decoded
// first when gzip or deflate encoded (the request asked for identity); another encoding cannot be read and
// is refused (the caller answers 502). A body of a known length up to limit keeps a (new) Content-Length;
// a longer or unknown one is scrubbed as it streams.
func scrubResponse(resp *http.Response, pairs []gwPair, limit int64) error {
	if len(pairs) == 0 {
		return nil
	}
	for name, vs := range resp.Header {
		for i, v := range vs {
			vs[i] = string(replacePairs([]byte(v), pairs))
		}
		resp.Header[name] = vs
	}
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody ||
		!textual(resp.Header.Get("Content-Type")) {
		return nil
	}
	body := resp.Body
	switch enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			body.Close()
			return fmt.Errorf("a gzip body from a secret's host: %v", err)
		}
		body = readCloser{zr, body}
	case "deflate":
		zr, err := zlib.NewReader(body)
		if err != nil {
			body.Close()
			return fmt.Errorf("a deflate body from a secret's host: %v", err)
		}
		body = readCloser{zr, body}
	default:
		body.Close()
		return fmt.Errorf("a body from a secret's host in encoding %q, which the gateway cannot check for the secret", enc)
	}
	known := resp.ContentLength >= 0 && resp.ContentLength <= limit && body == resp.Body
	resp.Header.Del("Content-Encoding")
	if known {
		data, err := io.ReadAll(io.LimitReader(body, resp.ContentLength+1))
		body.Close()
		if err != nil {
			return err
		}
		data = replacePairs(data, pairs)
		resp.Body = io.NopCloser(bytes.NewReader(data))
		resp.ContentLength = int64(len(data))
		resp.Header.Set("Content-Length", strconv.Itoa(len(data)))
		return nil
	}
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Body = &scrubReader{src: body, pairs: pairs, longest: len(pairs[0].from), buf: make([]byte, 32<<10)}
	return nil
}

// textual tells a body that can carry a value back as text (an echo, an error page, JSON): every type but
// the binary ones (images, audio, video, fonts, archives, octet streams), which pass unchanged with their
// length, so a download from a secret's host is neither re-chunked nor slowed.
func textual(contentType string) bool {
	mediaType, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(contentType)), ";")
	mediaType = strings.TrimSpace(mediaType)
	major, minor, _ := strings.Cut(mediaType, "/")
	switch major {
	case "image", "audio", "video", "font":
		return false
	case "application":
		switch minor {
		case "octet-stream", "zip", "gzip", "x-gzip", "x-tar", "x-bzip2", "x-xz", "zstd", "pdf", "wasm",
			"vnd.docker.image.rootfs.diff.tar.gzip", "vnd.oci.image.layer.v1.tar+gzip", "x-git-upload-pack-result",
			"x-git-receive-pack-result":
			return false
		}
	}
	return true
}

type readCloser struct {
	io.Reader
	under io.Closer
}

func (r readCloser) Close() error { return r.under.Close() }

// replacePairs replaces every whole occurrence of a pair's from (the longest first at one position).
func replacePairs(b []byte, pairs []gwPair) []byte {
	out, _ := scrubUpTo(b, pairs, len(b))
	return out
}

// scrubUpTo replaces the matches in b that start before cut; it returns the replaced bytes and how far into b
// they reach (cut, or the end of a match that started before it).
func scrubUpTo(b []byte, pairs []gwPair, cut int) ([]byte, int) {
	var out []byte
	i := 0
	for {
		best, bestPair := -1, -1
		for k, p := range pairs {
			j := bytes.Index(b[i:], p.from)
			if j >= 0 && (best < 0 || i+j < best) {
				best, bestPair = i+j, k // pairs are longest first: at one position the first found is the longest
			}
		}
		if best < 0 || best >= cut {
			break
		}
		out = append(out, b[i:best]...)
		out = append(out, pairs[bestPair].to...)
		i = best + len(pairs[bestPair].from)
	}
	end := max(cut, i)
	return append(out, b[i:end]...), end
}

// scrubReader replaces real values in a stream, holding back at most the longest form's length less one
// byte: the tail that could still grow into a value.
type scrubReader struct {
	src     io.ReadCloser
	pairs   []gwPair
	longest int
	buf     []byte
	pending []byte // read, not yet checked
	out     []byte // checked, not yet returned
	err     error
}

func (s *scrubReader) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			if len(s.pending) > 0 {
				s.out, s.pending = replacePairs(s.pending, s.pairs), nil
				continue
			}
			return 0, s.err
		}
		n, err := s.src.Read(s.buf)
		s.pending = append(s.pending, s.buf[:n]...)
		if err != nil {
			s.err = err
			continue
		}
		if cut := len(s.pending) - (s.longest - 1); cut > 0 {
			var end int
			s.out, end = scrubUpTo(s.pending, s.pairs, cut)
			s.pending = append([]byte(nil), s.pending[end:]...)
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *scrubReader) Close() error { return s.src.Close() }
