package idem_test

import (
	"bytes"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar/jartest"
)

// FuzzMemoryJar runs the call sequence its input encodes on a MemoryJar and
// on a map of records, and compares every answer (jartest.Sequence). The
// first byte may force the jar's hash to collide, so that records move
// between the index and the collision map; large bodies make deletions
// copy the chunks.
func FuzzMemoryJar(f *testing.F) {
	f.Add([]byte("\x00\x00\x10\x21\x32\x43\x54\x65\x76\x07\x18"))
	f.Add([]byte("\x01\x00\x01\x02\x03\x40\x41\x42\x50\x51\x60\x70\x80\x00\x01"))
	f.Add([]byte("\x02\x00\x08\x10\x18\x20\x28\x51\x59\x61\x69\x00\x08\x10\x50\x58"))
	f.Add(bytes.Repeat([]byte("\x02\x0b\x53\x16\x5d"), 40))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 400 {
			return
		}
		j := new(idem.MemoryJar)
		switch data[0] % 3 {
		case 1:
			idem.SetMemoryJarHash(j, func(string) uint64 { return 7 })
		case 2:
			idem.SetMemoryJarHash(j, func(op string) uint64 { return uint64(len(op)) })
		}
		jartest.Sequence(t, j, data[1:])
	})
}
