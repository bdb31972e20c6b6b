// Package worker is a worker client for the connect.group.v1 coordinator (protos/README.md, "For
// client authors"), a port of clients/node/worker.js.
//
// It joins a group, heartbeats, reconciles revoke-before-assign (stop what was revoked, report
// what it now owns, and only then start new work), one resource at a time, computes a target
// when asked (COMPUTE_ASSIGNMENT, with Assign), rejoins at epoch 0 when fenced, fences itself
// when it has not been heard for nearly a session timeout, fetches the configs of what it holds
// and reports statuses (DESIGN 3.20), restarts and pauses what it is told to, and leaves the
// group when asked (Leave).
//
// All state belongs to one goroutine (Run's loop); RPCs and listener calls run on their own
// goroutines and hand their outcome back to the loop as a closure.
package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
)

// DefaultMaxMessageBytes is the coordinator's default --max-message-bytes (64 MiB).
const DefaultMaxMessageBytes = 64 * 1024 * 1024

// maxTraceChars bounds a status report's trace.
const maxTraceChars = 16384

// Options configure a Worker.
type Options struct {
	Coordinators       []string // host:port; the first is used, all are asked by FindCoordinator
	GroupID            string
	MemberID           string
	InstanceID         string  // static membership; empty: none
	URL                *string // nil: not sent
	RebalanceTimeoutMs int32
	RPCTimeout         time.Duration
	MaxMessageBytes    int
	TLSCA              string
	TLSCert            string
	TLSKey             string
	TLSServerName      string
	AllowPlaintext     bool
	// Listener does the work; nil: the worker only logs its start and stop lines.
	Listener Listener
	// A failing revoked (or target-state) call is retried after RetryInitial, doubling up to
	// RetryMax (defaults 1 s and 30 s, as the agent).
	RetryInitial time.Duration
	RetryMax     time.Duration
	// Print writes one log line (default: standard output).
	Print func(line []byte)
}

// configurationErrors are a join's configuration errors (DESIGN 3.19): what the operator should
// do, on the `fatal` line. This client speaks the connect protocol only.
var configurationErrors = map[pb.ErrorCode]string{
	pb.ErrorCode_INCONSISTENT_GROUP_PROTOCOL: "the group's group.protocol.migration.policy does " +
		"not let a connect-protocol worker join it: change the policy (coordinator-svc " +
		"alter-configs GROUP --set group.protocol.migration.policy=upgrade, or bidirectional), " +
		"or run classic-protocol workers in this group instead",
	pb.ErrorCode_UNSUPPORTED_VERSION: "the cluster feature group.version is at level 0, which " +
		"admits no new connect-protocol member: raise it to 1 (coordinator-svc features update " +
		"--feature group.version --level 1), or run classic-protocol workers instead",
}

// Heartbeat answers and what they mean (protos/README.md, "Errors").
type outcome int

const (
	retryLater   outcome = iota // everything else, and codes this client does not know
	success                     // NONE, COMPUTE_ASSIGNMENT
	rejoin                      // not (or no longer) a member: stop everything, rejoin at epoch 0
	fatal                       // retrying unchanged cannot help: stop everything, exit 3
	findAndRetry                // another (or no) process serves the group
)

// Classify says what a heartbeat answer's code asks of the worker.
func Classify(code pb.ErrorCode) outcome {
	switch code {
	case pb.ErrorCode_NONE, pb.ErrorCode_COMPUTE_ASSIGNMENT:
		return success
	case pb.ErrorCode_FENCED_MEMBER_EPOCH, pb.ErrorCode_UNKNOWN_MEMBER_ID:
		return rejoin
	case pb.ErrorCode_FENCED_INSTANCE_ID, pb.ErrorCode_UNSUPPORTED_ASSIGNOR,
		pb.ErrorCode_INVALID_GROUP_ID, pb.ErrorCode_INVALID_REQUEST,
		pb.ErrorCode_GROUP_AUTHORIZATION_FAILED, pb.ErrorCode_INCONSISTENT_GROUP_PROTOCOL,
		pb.ErrorCode_UNSUPPORTED_VERSION:
		return fatal
	case pb.ErrorCode_NOT_COORDINATOR, pb.ErrorCode_COORDINATOR_NOT_AVAILABLE:
		return findAndRetry
	}
	return retryLater
}

// codeName is the name of a code, or UNKNOWN_SERVER_ERROR for one this client does not know.
func codeName(code pb.ErrorCode) string {
	if _, ok := pb.ErrorCode_name[int32(code)]; ok {
		return code.String()
	}
	return fmt.Sprintf("UNKNOWN_SERVER_ERROR(%d)", int32(code))
}

type phase int

const (
	joining phase = iota
	member
	rejoining
	leaving
	fatalPhase
	left
)

// heldConfig is one held connector's config (never mutated once stored).
type heldConfig struct {
	digest      string
	config      map[string]string
	targetState pb.TargetState
}

type status struct {
	state pb.ResourceState
	trace string
}

type reportedStatus struct {
	state pb.ResourceState
	trace string
	token int64
}

// Worker is one group member. Make it with New, run it with Run.
type Worker struct {
	o       Options
	printMu sync.Mutex
	posted  chan func()
	leaveCh chan struct{}
	conn    *conn

	phase        phase
	epoch        int32
	assigned     Set                // what the coordinator last said we may run
	running      Set                // what runs now (a resource being stopped still counts)
	starting     Set                // being started: reported as owned already
	tokens       map[Resource]int64 // fencing token per resource assigned or running
	busy         bool               // a start or stop is in progress (one at a time)
	stopWanted   atomic.Bool        // something must stop: a retrying target-state call gives up
	heartbeating bool               // a heartbeat (or FindCoordinator) is in flight
	// The heartbeat in flight: loseMembership abandons it (its answer, stale, is dropped) so
	// that the rejoin need not wait out its deadline.
	currentHeartbeat context.Context
	cancelHeartbeat  context.CancelFunc
	fullNext         bool   // send every field: on a join and after any error
	lastReported     string // the owned list the last answered heartbeat carried
	hasReported      bool
	interval         time.Duration // heartbeat_interval_ms of the last answer
	session          time.Duration // session_timeout_ms of the last answer
	lastSuccessAt    time.Time     // when the request of the last successful answer was sent
	nextHeartbeat    time.Time
	failures         int
	computing        bool
	lastInstalled    int32
	leaveDeadline    time.Time
	fatalWhy         string
	revision         int64
	revisionsSeen    int
	fetchedRev       int64
	fetched          bool // fetchedRev is meaningful (a Configs answer since the join)
	configs          map[string]heldConfig
	reconfigure      map[string]bool // connectors whose digest changed
	restartCounts    map[Resource]int64
	acted            map[Resource]int64
	applied          map[Resource]pb.TargetState
	failedStarts     Set
	fetching         bool
	fetchNotBefore   time.Time
	callsNotBefore   time.Time // THROTTLING_QUOTA_EXCEEDED: both member calls wait
	statuses         map[Resource]status
	reported         map[Resource]reportedStatus
	reporting        bool
	lastReportAt     time.Time
	membership       int // counts joins: an answer to a call of an earlier membership is dropped
}

// New checks the options and connects (lazily) to the first coordinator.
func New(o Options) (*Worker, error) {
	if len(o.Coordinators) == 0 {
		return nil, fmt.Errorf("no coordinator address")
	}
	if o.GroupID == "" || o.MemberID == "" {
		return nil, fmt.Errorf("a group id and a member id are needed")
	}
	if o.RebalanceTimeoutMs <= 0 {
		o.RebalanceTimeoutMs = 60000
	}
	if o.RPCTimeout <= 0 {
		o.RPCTimeout = 5 * time.Second
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.RetryInitial <= 0 {
		o.RetryInitial = time.Second
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 30 * time.Second
	}
	if o.Print == nil {
		o.Print = func(line []byte) { _, _ = os.Stdout.Write(line) }
	}
	w := &Worker{
		o:             o,
		posted:        make(chan func(), 64),
		leaveCh:       make(chan struct{}, 1),
		phase:         joining,
		assigned:      Set{},
		running:       Set{},
		starting:      Set{},
		tokens:        map[Resource]int64{},
		fullNext:      true,
		interval:      3 * time.Second,
		session:       10 * time.Second,
		lastInstalled: -1,
		configs:       map[string]heldConfig{},
		reconfigure:   map[string]bool{},
		restartCounts: map[Resource]int64{},
		acted:         map[Resource]int64{},
		applied:       map[Resource]pb.TargetState{},
		failedStarts:  Set{},
		statuses:      map[Resource]status{},
		reported:      map[Resource]reportedStatus{},
	}
	c, err := o.connect(o.Coordinators[0])
	if err != nil {
		return nil, err
	}
	w.conn = c
	return w, nil
}

// Log writes one JSON line: ts (Unix seconds, fractional), event, group_id, member_id, fields.
// Safe from any goroutine.
func (w *Worker) Log(event string, fields map[string]interface{}) {
	line := map[string]interface{}{}
	for k, v := range fields {
		line[k] = v
	}
	line["ts"] = float64(time.Now().UnixNano()) / 1e9
	line["event"] = event
	line["group_id"] = w.o.GroupID
	line["member_id"] = w.o.MemberID
	data, err := json.Marshal(line)
	if err != nil {
		data = []byte(fmt.Sprintf(`{"event":"error","error":%q}`, err.Error()))
	}
	w.printMu.Lock()
	defer w.printMu.Unlock()
	w.o.Print(append(data, '\n'))
}

type fields = map[string]interface{}

// post hands f to the loop goroutine, which runs it.
func (w *Worker) post(f func()) { w.posted <- f }

// Leave asks the worker to stop everything and leave the group (safe from any goroutine).
func (w *Worker) Leave() {
	select {
	case w.leaveCh <- struct{}{}:
	default:
	}
}

// owned: what runs or is being started (what the owned list reports).
func (w *Worker) owned() Set { return w.running.Union(w.starting) }

// Run runs until the worker has left; it returns the process exit code: 0, or 3 after a fatal
// error.
func (w *Worker) Run() int {
	w.Log("starting", fields{"coordinator": w.conn.address, "assignor": AssignorName,
		"versions": []int{AssignorMinVersion, AssignorMaxVersion}})
	for w.phase != left {
		w.checkSelfFence()
		w.reconcile()
		w.lifecycle()
		if !w.heartbeating && w.heartbeatDue() {
			w.heartbeat()
			continue
		}
		if w.phase == left {
			break
		}
		wait := 100 * time.Millisecond // fencing and stopping must not wait for a slow call
		if !w.heartbeating {
			if until := time.Until(w.nextHeartbeat); until < wait {
				wait = until
			}
		}
		if wait < time.Millisecond {
			wait = time.Millisecond
		}
		timer := time.NewTimer(wait)
		select {
		case f := <-w.posted:
			f()
		case <-w.leaveCh:
			w.leave()
		case <-timer.C:
		}
		timer.Stop()
	}
	w.conn.cc.Close()
	var why interface{}
	if w.fatalWhy != "" {
		why = w.fatalWhy
	}
	w.Log("stopped", fields{"fatal": why})
	if w.fatalWhy != "" {
		return 3
	}
	return 0
}

// leave: stop everything, then leave the group.
func (w *Worker) leave() {
	if w.phase == left || w.phase == leaving {
		return
	}
	w.Log("leaving", fields{"reason": "signal"})
	if w.phase != member {
		w.epoch = 0 // not a member: nothing to tell the coordinator
	}
	if w.phase != fatalPhase {
		w.phase = leaving
	}
	w.leaveDeadline = time.Now().Add(10 * time.Second)
}
