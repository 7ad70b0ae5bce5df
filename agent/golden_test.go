package main

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
)

// testdata/golden_frames.json holds frames as bytes on the wire with their decoded values; the Python codec
// (tests/agent/test_golden_frames.py) decodes and encodes the same file, so the two cannot drift apart.
type goldenFrame struct {
	Name       string  `json:"name"`
	Direction  string  `json:"direction"`
	TypeName   string  `json:"type_name"`
	Type       byte    `json:"type"`
	ID         uint32  `json:"id"`
	JSON       any     `json:"json"`
	Offset     *uint64 `json:"offset"`
	DataHex    string  `json:"data_hex"`
	U64        *uint64 `json:"u64"`
	PayloadHex *string `json:"payload_hex"`
	Hex        string  `json:"hex"`
}

func loadGolden(t *testing.T) (frames []goldenFrame, invalid []goldenFrame) {
	t.Helper()
	b, err := os.ReadFile("testdata/golden_frames.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Frames  []goldenFrame `json:"frames"`
		Invalid []goldenFrame `json:"invalid"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // integers stay integers
	if err := d.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Frames) == 0 || len(doc.Invalid) == 0 {
		t.Fatal("no golden frames")
	}
	return doc.Frames, doc.Invalid
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// payload is what the golden frame says its payload is.
func (g goldenFrame) payload(t *testing.T) []byte {
	t.Helper()
	switch {
	case g.JSON != nil:
		b, err := json.Marshal(g.JSON)
		if err != nil {
			t.Fatal(err)
		}
		return b
	case g.Offset != nil:
		return append(binary.BigEndian.AppendUint64(nil, *g.Offset), unhex(t, g.DataHex)...)
	case g.U64 != nil:
		return binary.BigEndian.AppendUint64(nil, *g.U64)
	case g.PayloadHex != nil:
		return unhex(t, *g.PayloadHex)
	}
	t.Fatalf("%s: no payload given", g.Name)
	return nil
}

func TestGoldenFramesDecode(t *testing.T) {
	frames, _ := loadGolden(t)
	for _, g := range frames {
		types := map[string]map[string]byte{"client": clientTypes, "agent": agentTypes}[g.Direction]
		if typ, ok := types[g.TypeName]; !ok || typ != g.Type {
			t.Errorf("%s: %s %s is 0x%02x here, 0x%02x in the file", g.Name, g.Direction, g.TypeName, typ, g.Type)
		}
		f, err := readFrame(bytes.NewReader(unhex(t, g.Hex)))
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		if f.typ != g.Type || f.id != g.ID {
			t.Errorf("%s: type 0x%02x id %d", g.Name, f.typ, f.id)
		}
		if g.JSON != nil {
			var got any
			d := json.NewDecoder(bytes.NewReader(f.payload))
			d.UseNumber()
			if err := d.Decode(&got); err != nil || !reflect.DeepEqual(got, g.JSON) {
				t.Errorf("%s: payload %s, want %v (%v)", g.Name, f.payload, g.JSON, err)
			}
		}
		if !bytes.Equal(f.payload, g.payload(t)) && !(len(f.payload) == 0 && len(g.payload(t)) == 0) {
			t.Errorf("%s: payload % x, want % x", g.Name, f.payload, g.payload(t))
		}
	}
}

// The agent's own writer (conn.write / conn.writeJSON, what every reply goes through) makes the golden bytes.
func TestGoldenFramesEncodeThroughTheAgentsWriter(t *testing.T) {
	frames, _ := loadGolden(t)
	ours, theirs := socketPair(t)
	defer ours.Close()
	cn := &conn{c: theirs}
	defer cn.close()
	for _, g := range frames {
		want := unhex(t, g.Hex)
		var err error
		switch {
		case g.JSON != nil:
			err = cn.writeJSON(g.Type, g.ID, g.JSON)
		case g.Offset != nil: // a data frame goes out as two parts: the offset, then the ring's bytes
			err = cn.write(g.Type, g.ID, binary.BigEndian.AppendUint64(nil, *g.Offset), unhex(t, g.DataHex))
		default:
			err = cn.write(g.Type, g.ID, g.payload(t))
		}
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if _, err := io.ReadFull(ours, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: wrote % x\nwant % x", g.Name, got, want)
		}
	}
}

func TestGoldenInvalidFramesAreRefused(t *testing.T) {
	_, invalid := loadGolden(t)
	for _, g := range invalid {
		_, err := readFrame(bytes.NewReader(unhex(t, g.Hex)))
		if !errors.Is(err, errFrameTooLarge) && (err == nil || !strings.Contains(err.Error(), "below the header")) {
			t.Errorf("%s: %v", g.Name, err)
		}
	}
}
