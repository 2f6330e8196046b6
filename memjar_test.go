package idem_test

import (
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/keyjar/jartest"
)

func TestMemoryJar(t *testing.T) {
	jartest.Run(t, func(t *testing.T) jartest.Jar { return new(idem.MemoryJar) })
}
