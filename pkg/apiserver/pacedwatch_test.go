package apiserver

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/storage"
)

// failingWatches is etcd without a leader: every watch ends at once with an error.
type failingWatches struct{ storage.Interface }

func (failingWatches) Watch(context.Context, string, storage.ListOptions) (watch.Interface, error) {
	ch := make(chan watch.Event, 1)
	ch <- watch.Event{Type: watch.Error, Object: &metav1.Status{Status: metav1.StatusFailure, Message: "etcdserver: no leader", Code: 500}}
	close(ch)
	return watch.NewProxyWatcher(ch), nil
}

// TestWatchRestartsArePaced: a watcher restarting at once a watch that
// fails at once (the watch cache's reflector, while etcd has no leader)
// restarts it a handful of times in two seconds, not thousands; the error
// still reaches it.
func TestWatchRestartsArePaced(t *testing.T) {
	s := &pacedWatches{Interface: failingWatches{}, pause: minWatchPause}
	deadline := time.Now().Add(2 * time.Second)
	restarts := 0
	for time.Now().Before(deadline) {
		w, err := s.Watch(context.Background(), "/k", storage.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ev, ok := <-w.ResultChan()
		if !ok || ev.Type != watch.Error {
			t.Fatalf("the watch's error was not passed on: %v %v", ev, ok)
		}
		w.Stop()
		restarts++
	}
	// 0.2 + 0.4 + 0.8 s of pauses: the fourth restart ends past 2 s.
	if restarts > 5 {
		t.Errorf("%d restarts in 2 s of a watch that fails at once: not paced", restarts)
	}
	// A watch that lived long resets the pause.
	if got := s.next(healthyWatch); got != 0 || s.pause != minWatchPause {
		t.Errorf("after a healthy watch: pause %v, next %v; want none, then %v", got, s.pause, minWatchPause)
	}
}
