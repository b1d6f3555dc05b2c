package osb

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestWritesTakeTurns: with one slot, a second write waits for the first, in
// arrival order after it, and one whose platform gives up runs nothing.
func TestWritesTakeTurns(t *testing.T) {
	b := New(nil, nil, "ns", WithMaxConcurrentWrites(1))
	inFirst, releaseFirst := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error)
	go func() {
		firstDone <- b.write(context.Background(), func() error {
			close(inFirst)
			<-releaseFirst
			return nil
		})
	}()
	<-inFirst

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ran := false
	if err := b.write(ctx, func() error { ran = true; return nil }); !errors.Is(err, context.DeadlineExceeded) || ran {
		t.Fatalf("a write whose context ended while it waited: ran %v, %v", ran, err)
	}

	order := make(chan int, 2)
	for i := 1; i <= 2; i++ {
		go func() { _ = b.write(context.Background(), func() error { order <- i; return nil }) }()
		time.Sleep(20 * time.Millisecond) // the second waits after the first
	}
	select {
	case i := <-order:
		t.Fatalf("write %d ran while the slot was taken", i)
	case <-time.After(20 * time.Millisecond):
	}
	close(releaseFirst)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if first, second := <-order, <-order; first != 1 || second != 2 {
		t.Errorf("writes ran in order %d, %d; they arrived 1, 2", first, second)
	}

	unlimited := New(nil, nil, "ns", WithMaxConcurrentWrites(0))
	if unlimited.writes != nil {
		t.Errorf("0 should lift the limit")
	}
}
