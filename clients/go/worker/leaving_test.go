package worker

import (
	"errors"
	"testing"
	"time"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
)

// Leaving while work still runs: it heartbeats as a member (its epoch, not -1) until everything
// has stopped, in one call, and self-fencing still applies meanwhile.
func TestLeavingHeartbeatsAsAMemberWhileItStops(t *testing.T) {
	w := newTestWorker(t)
	w.phase, w.epoch, w.fullNext = member, 5, false
	w.running = NewSet(ConnectorResource("A"), TaskResource("A", 0), TaskResource("A", 1))
	w.assigned = w.running.Union(Set{})
	w.leave()
	w.reconcile()
	if !w.busy {
		t.Fatal("leaving: it must stop its work")
	}
	w.nextHeartbeat = time.Now().Add(-time.Millisecond)
	if !w.stillHeartbeating() || !w.heartbeatDue() {
		t.Fatal("while its work stops, a leaving member heartbeats")
	}
	if req, _, _ := w.buildHeartbeat(); req.MemberEpoch != 5 {
		t.Fatalf("as a member (epoch 5), not a leave: %v", req)
	}
	(<-w.posted)() // one call stopped everything
	if len(w.running) != 0 || w.busy {
		t.Fatalf("everything stops in one call: still running %v", w.running.Sorted())
	}
	if w.stillHeartbeating() {
		t.Fatal("stopped: now the leave (-1) is due, not another member heartbeat")
	}
}

func TestSelfFenceWhileLeaving(t *testing.T) {
	w := newTestWorker(t)
	w.phase, w.epoch = member, 5
	w.running = NewSet(ConnectorResource("A"))
	w.interval, w.session = 100*time.Millisecond, time.Second
	w.leave()
	w.busy = true // its stop is in progress
	w.lastSuccessAt = time.Now().Add(-900 * time.Millisecond)
	w.checkSelfFence()
	if w.epoch != 0 || w.phase != leaving {
		t.Fatalf("not heard for 900 ms of a 1 s session: fenced (epoch %d, phase %v)", w.epoch,
			w.phase)
	}
}

func TestFailedLeaveBacksOff(t *testing.T) {
	w := newTestWorker(t)
	w.phase, w.epoch = leaving, 5
	w.nextHeartbeat = time.Now().Add(time.Second)
	if w.heartbeatDue() {
		t.Fatal("a leave retried before its backoff has passed")
	}
	w.nextHeartbeat = time.Now().Add(-time.Millisecond)
	if !w.heartbeatDue() {
		t.Fatal("the leave is due once the backoff has passed")
	}
}

type failingListener struct{ calls int }

func (l *failingListener) Handle(*Event) error {
	l.calls++
	return errors.New("refused by the test")
}

// A target-state call that keeps failing gives up while something must stop, so it never holds
// the one-at-a-time slot against a revocation.
func TestFailingTargetStateGivesWayToStops(t *testing.T) {
	w := newTestWorker(t)
	listener := &failingListener{}
	w.o.Listener, w.o.RetryInitial, w.o.RetryMax = listener, time.Millisecond, time.Millisecond
	w.phase, w.epoch = member, 3
	a := ConnectorResource("A")
	w.running, w.assigned = NewSet(a), NewSet(a)
	w.stopWanted.Store(true)
	w.targetWork(NewSet(a), pb.TargetState_TARGET_PAUSED)
	select {
	case f := <-w.posted:
		f()
	case <-time.After(5 * time.Second):
		t.Fatal("the failing target-state call did not give up while a stop was wanted")
	}
	if w.busy {
		t.Fatal("the slot is free again")
	}
	if _, applied := w.applied[a]; applied || listener.calls != 1 {
		t.Fatalf("not applied, tried once (applied %v, calls %d)", applied, listener.calls)
	}
}
