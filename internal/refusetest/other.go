//go:build !linux && !darwin

package refusetest

import (
	"net"
	"testing"
)

func reserve(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("refusetest: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
