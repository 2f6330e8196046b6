package chanbatch

import (
	"slices"
	"testing"
)

func TestDrain(t *testing.T) {
	ch := make(chan int, 10)
	for i := range 5 {
		ch <- i
	}
	// Up to max, counting what batch already holds.
	if got := Drain(ch, []int{-1}, 3); !slices.Equal(got, []int{-1, 0, 1}) {
		t.Fatalf("Drain to 3 = %v; want [-1 0 1]", got)
	}
	// What is queued, without waiting for more.
	if got := Drain(ch, nil, 10); !slices.Equal(got, []int{2, 3, 4}) {
		t.Fatalf("Drain of the rest = %v; want [2 3 4]", got)
	}
	if got := Drain(ch, nil, 10); len(got) != 0 {
		t.Fatalf("Drain of an empty channel = %v; want none", got)
	}
	// A closed channel ends the batch.
	ch <- 7
	close(ch)
	if got := Drain(ch, nil, 10); !slices.Equal(got, []int{7}) {
		t.Fatalf("Drain of a closed channel = %v; want [7]", got)
	}
	// A full batch takes nothing.
	open := make(chan int, 1)
	open <- 1
	if got := Drain(open, []int{0}, 1); !slices.Equal(got, []int{0}) || len(open) != 1 {
		t.Fatalf("Drain of a full batch = %v, %d left; want [0], 1 left", got, len(open))
	}
}
