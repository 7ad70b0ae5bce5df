package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// frameTable is frames.json: the one machine-readable source of the protocol's types, limits and error codes.
type frameTable struct {
	Version int `json:"version"`
	Header  struct {
		Size int `json:"size"`
	} `json:"header"`
	Limits      map[string]int  `json:"limits"`
	ClientTypes map[string]byte `json:"client_types"`
	AgentTypes  map[string]byte `json:"agent_types"`
	ErrorCodes  []string        `json:"error_codes"`
}

func loadTable(t *testing.T) frameTable {
	raw, err := os.ReadFile("frames.json")
	must(t, err)
	var table frameTable
	must(t, json.Unmarshal(raw, &table))
	return table
}

func TestTheAgentsConstantsAreTheFrameTables(t *testing.T) {
	table := loadTable(t)
	if table.Version != ProtocolVersion || table.Header.Size != headerSize {
		t.Fatalf("version %d header %d, the agent's %d and %d", table.Version, table.Header.Size, ProtocolVersion, headerSize)
	}
	limits := map[string]int{
		"max_frame_body": maxFrameBody, "max_start_payload": maxStartLen, "max_control_payload": maxControlLen,
		"data_chunk": dataChunk, "max_read_chunk": maxReadChunk, "max_list_entries": maxListEntries,
		"credit_size": creditSize, "offset_size": offsetSize,
	}
	if len(limits) != len(table.Limits) {
		t.Errorf("the table has %d limits, the agent %d", len(table.Limits), len(limits))
	}
	for name, v := range limits {
		if table.Limits[name] != v {
			t.Errorf("limit %s: the table says %d, the agent %d", name, table.Limits[name], v)
		}
	}
	compare := func(side string, table, agent map[string]byte) {
		if len(table) != len(agent) {
			t.Errorf("%s: the table has %d types, the agent %d", side, len(table), len(agent))
		}
		for name, v := range agent {
			if table[name] != v {
				t.Errorf("%s %s: the table says 0x%02x, the agent 0x%02x", side, name, table[name], v)
			}
		}
	}
	compare("client", table.ClientTypes, clientTypes)
	// PROTOCOL.md names the agent's HELLO and LIST replies as the client's; the table, as the codecs do
	replies := map[string]byte{}
	for name, v := range agentTypes {
		if name == "HELLO" || name == "LIST" {
			name += "_REPLY"
		}
		replies[name] = v
	}
	compare("agent", table.AgentTypes, replies)
}

var errorLiteral = regexp.MustCompile(`"(E[A-Z0-9]+)"`)

// Every code the agent can put in an ERROR frame (its errno names, and the codes it names in its sources) is
// in the table, and the table lists no code the agent never sends.
func TestEveryErrorCodeTheAgentSendsIsInTheFrameTable(t *testing.T) {
	table := loadTable(t)
	listed := map[string]bool{}
	for _, code := range table.ErrorCodes {
		listed[code] = true
	}
	sent := map[string]bool{}
	for name := range errnoNames {
		sent[name] = true
	}
	sources, err := filepath.Glob("*.go")
	must(t, err)
	for _, path := range sources {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		raw, err := os.ReadFile(path)
		must(t, err)
		for _, m := range errorLiteral.FindAllStringSubmatch(string(raw), -1) {
			sent[m[1]] = true
		}
	}
	for code := range sent {
		if !listed[code] {
			t.Errorf("the agent sends %s, which the table does not list", code)
		}
	}
	for code := range listed {
		if !sent[code] {
			t.Errorf("the table lists %s, which the agent never sends", code)
		}
	}
}
