// Package unnamed lets package client say that an *idem.PendingError it
// builds is the error of a call sent without a name, as the Transport's
// own says, without exported API for it.
package unnamed

// Mark marks err, an *idem.PendingError, as the error of a call sent
// without a name (neither idem.WithOperation nor a key of the caller's):
// its message then says that the same call made again without a name is
// a new operation under a new key. Package idem sets it as it starts; it
// leaves any other error as it is.
var Mark func(err error)
