package main

import (
	"encoding/json"
	"fmt"
	"os"
)

func readProtocolMd() (string, error) {
	b, err := os.ReadFile("PROTOCOL.md")
	return string(b), err
}

func fmtSscanHex(s string, v *byte) (int, error) {
	return fmt.Sscanf(s, "0x%x", v)
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func itoa(n int) string { return fmt.Sprint(n) }
