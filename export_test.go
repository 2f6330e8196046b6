package idem

import "strings"

// SetMemoryJarHash makes j place operations by h instead of maphash: a
// constant h puts every operation but the first in the collision map.
func SetMemoryJarHash(j *MemoryJar, h func(op string) uint64) { j.hash = h }

// MemoryJarBytes returns how many bytes j's chunks hold, and how many of
// them belong to no record.
func MemoryJarBytes(j *MemoryJar) (data, dead int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.live + j.dead, j.dead
}

// MemoryJarChunkBytes returns the capacity of j's chunks: the memory that
// the bytes MemoryJarBytes counts take.
func MemoryJarChunkBytes(j *MemoryJar) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for _, c := range j.chunks {
		n += cap(c)
	}
	return n
}

// HolderHost is the host part of this process's lease holder ids.
func HolderHost() string {
	h, _, _ := strings.Cut(processPrefix(), "/")
	return h
}
