package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// The demo's story holds: one key on every attempt and across the
// restart, one charge, the second run answered by a replay of the first
// answer, its status included.
func TestBasic(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	keys := regexp.MustCompile(`attempt \d+ with key (\S+)`).FindAllStringSubmatch(text, -1)
	if len(keys) != 3 {
		t.Fatalf("got %d attempts; want 3 (503, 201, replay after the restart):\n%s", len(keys), text)
	}
	for _, k := range keys {
		if k[1] != keys[0][1] {
			t.Fatalf("keys %v; want one key throughout:\n%s", keys, text)
		}
	}
	for _, want := range []string{`client: 201 {"charge":"ch_1"} replayed=false`, `client: 201 {"charge":"ch_1"} replayed=true`,
		"the server charged 1 time(s)"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
}
