package client_test

import (
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/client"
	"github.com/idemkit/idem/keyjar"
	"github.com/idemkit/idem/keyjar/pgjar"
)

// The jars the Client documents as usable.
var (
	_ client.Jar = (*idem.MemoryJar)(nil)
	_ client.Jar = (*keyjar.Jar)(nil)
	_ client.Jar = (*pgjar.Jar)(nil)
)

// The jars whose Forget the Client makes conditional.
var (
	_ client.KeyForgetter = (*idem.MemoryJar)(nil)
	_ client.KeyForgetter = (*keyjar.Jar)(nil)
	_ client.KeyForgetter = (*pgjar.Jar)(nil)
)
