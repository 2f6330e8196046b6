package testserver_test

import (
	"testing"

	"github.com/idemkit/idem/testserver"
	"github.com/idemkit/idem/testserver/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) testserver.Store { return new(testserver.MemoryStore) })
}
