// Package chanbatch gathers the values waiting in a channel into a batch,
// for the single writers of the jars: each takes what is queued at the
// moment and writes it in one transaction or round trip.
package chanbatch

// Drain appends to batch the values queued in ch at the moment, without
// waiting, until batch holds limit values or ch is empty or closed.
func Drain[T any](ch <-chan T, batch []T, limit int) []T {
	for len(batch) < limit {
		select {
		case v, ok := <-ch:
			if !ok {
				return batch
			}
			batch = append(batch, v)
		default:
			return batch
		}
	}
	return batch
}
