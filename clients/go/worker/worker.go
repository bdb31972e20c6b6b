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
	"math"
	"os"
	"sort"
	"strings"
	"sync"
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

// --- reconciliation: revoke before assign, one resource at a time ------------------------------

func first(s Set) Resource { return s.Sorted()[0] }

func (w *Worker) reconcile() {
	if w.busy {
		return
	}
	stopAll := w.phase == rejoining || w.phase == leaving || w.phase == fatalPhase
	toStop := w.running.Minus(w.assigned)
	if stopAll {
		toStop = w.running
	}
	if len(toStop) > 0 {
		reason := map[phase]string{rejoining: "membership lost", leaving: "leaving",
			fatalPhase: "fatal error"}[w.phase]
		if reason == "" {
			reason = "revoked"
		}
		w.stopWork(first(toStop), reason)
		return
	}
	if w.phase != member {
		return
	}
	// New work starts only once its configs are here; the rest waits for the fetch.
	if toStart := w.withConfigs(w.assigned.Minus(w.running)); len(toStart) > 0 {
		w.startWork(first(toStart))
		return
	}
	// A connector whose digest changed: one reconfigured call for its running resources.
	for len(w.reconfigure) > 0 {
		names := make([]string, 0, len(w.reconfigure))
		for name := range w.reconfigure {
			names = append(names, name)
		}
		sort.Strings(names)
		name := names[0]
		delete(w.reconfigure, name)
		resources := Set{}
		for r := range w.running {
			if r.Connector == name && !w.failedStarts.Has(r) {
				resources.Add(r)
			}
		}
		if _, ok := w.configs[name]; ok && len(resources) > 0 {
			w.reconfigureWork(resources)
			return
		}
	}
	if w.fetched && w.fetchedRev == w.revision && w.revision > 0 {
		if resources, target := w.targetChange(); len(resources) > 0 {
			w.targetWork(resources, target)
		} else if restarts := w.dueRestarts(); len(restarts) > 0 {
			w.restartWork(first(restarts))
		}
	}
}

// dueRestarts: running resources whose restart count is above the one acted on (DESIGN 3.20).
func (w *Worker) dueRestarts() Set {
	out := Set{}
	for r := range w.running {
		if acted, ok := w.acted[r]; ok && w.restartCounts[r] > acted {
			out.Add(r)
		}
	}
	return out
}

// targetChange: the running resources (whose start did not fail) of the first connector whose
// target state differs from the one applied to them, and that target state; STOPPED names the
// connector only (its tasks are revoked).
func (w *Worker) targetChange() (Set, pb.TargetState) {
	out := Set{}
	var target pb.TargetState
	for _, r := range w.running.Sorted() {
		held, ok := w.configs[r.Connector]
		before, applied := w.applied[r]
		if !ok || !applied || held.targetState == before || w.failedStarts.Has(r) {
			continue
		}
		if held.targetState == pb.TargetState_TARGET_STOPPED && r.IsTask() {
			continue
		}
		if len(out) == 0 {
			target = held.targetState
		} else if first(out).Connector != r.Connector {
			break
		}
		out.Add(r)
	}
	return out, target
}

// stateFor is what a started resource reports, by its connector's target state.
func stateFor(r Resource, target pb.TargetState) pb.ResourceState {
	switch target {
	case pb.TargetState_TARGET_PAUSED:
		return pb.ResourceState_PAUSED
	case pb.TargetState_TARGET_STOPPED:
		if r.IsTask() {
			return pb.ResourceState_PAUSED
		}
		return pb.ResourceState_STOPPED
	}
	return pb.ResourceState_RUNNING
}

func (w *Worker) targetOf(r Resource) pb.TargetState {
	if held, ok := w.configs[r.Connector]; ok {
		return held.targetState
	}
	return pb.TargetState_TARGET_STARTED
}

// recordStart: the start of r returned (ok) or failed, with the count read before it.
func (w *Worker) recordStart(r Resource, count int64, ok bool) {
	w.acted[r] = count
	w.applied[r] = w.targetOf(r)
	if ok {
		delete(w.failedStarts, r)
	} else {
		w.failedStarts.Add(r)
	}
}

// withConfigs: those of resources whose connector's config is here, fetched at the revision of
// the last heartbeat answer (all of them when that revision is 0: nothing to fetch).
func (w *Worker) withConfigs(resources Set) Set {
	if w.revision <= 0 {
		return resources
	}
	if !w.fetched || w.fetchedRev != w.revision {
		return Set{}
	}
	// A connector missing from a fresh answer is not held (deleted): it is being revoked.
	out := Set{}
	for r := range resources {
		if _, ok := w.configs[r.Connector]; ok {
			out.Add(r)
		}
	}
	return out
}

// digestsOf: the config digests of the resources' connectors, what log lines carry instead of
// values.
func (w *Worker) digestsOf(resources Set) map[string]string {
	out := map[string]string{}
	for r := range resources {
		if held, ok := w.configs[r.Connector]; ok {
			out[r.Connector] = held.digest
		}
	}
	return out
}

// described: the resources as logged: connectors, tasks, their tokens.
func (w *Worker) described(resources Set, f fields) fields {
	connectors, tasks := resources.Split()
	f["connectors"] = connectors
	f["tasks"] = tasks
	f["fencing_tokens"] = TokensOf(resources, w.tokens)
	return f
}

var targetNames = map[pb.TargetState]string{
	pb.TargetState_TARGET_STARTED: "STARTED",
	pb.TargetState_TARGET_PAUSED:  "PAUSED",
	pb.TargetState_TARGET_STOPPED: "STOPPED",
}

// event builds a listener event for resources (configs only on the events that carry them).
func (w *Worker) event(kind string, resources Set, reason string) *Event {
	e := &Event{
		Event: kind, GroupID: w.o.GroupID, MemberID: w.o.MemberID, MemberEpoch: w.epoch,
		Resources: resources, FencingTokens: TokensOf(resources, w.tokens), Reason: reason,
	}
	if configEvents[kind] {
		e.Configs = map[string]ConfigJSON{}
		e.TargetStates = map[string]string{}
		for r := range resources {
			if held, ok := w.configs[r.Connector]; ok {
				e.Configs[r.Connector] = ConfigJSON{Digest: held.digest, Config: held.config}
				e.TargetStates[r.Connector] = targetNames[held.targetState]
			}
		}
	}
	return e
}

// call runs the listener (none: nothing to do).
func (w *Worker) call(e *Event) error {
	if w.o.Listener == nil {
		return nil
	}
	return w.o.Listener.Handle(e)
}

// retry calls the listener until it succeeds, with a backoff (on a work goroutine).
func (w *Worker) retry(e *Event, what string) {
	delay := w.o.RetryInitial
	for attempt := 1; ; attempt++ {
		err := w.call(e)
		if err == nil {
			return
		}
		w.Log("error", fields{"what": what, "attempt": attempt, "error": err.Error()})
		time.Sleep(delay)
		delay *= 2
		if delay > w.o.RetryMax {
			delay = w.o.RetryMax
		}
	}
}

func traceOf(err error) string {
	text := err.Error()
	if len(text) > maxTraceChars {
		text = text[:maxTraceChars]
	}
	return text
}

// stopWork stops r (revoked hook, retried until it succeeds), then releases it and heartbeats
// at once: each stopped resource is acknowledged on its own (partial release).
func (w *Worker) stopWork(r Resource, reason string) {
	w.busy = true
	one := NewSet(r)
	epoch := w.epoch
	what := w.described(one, fields{"member_epoch": epoch, "reason": reason})
	var e *Event
	if !w.failedStarts.Has(r) { // a resource whose start failed runs nothing: no hook call
		e = w.event("revoked", one, "")
	}
	go func() {
		if e != nil {
			w.retry(e, "stop")
		}
		w.post(func() {
			w.released(one, what)
			w.done()
		})
	}()
}

// released: stopped resources are no longer run nor owned: forget them; the stop line says so.
func (w *Worker) released(resources Set, what fields) {
	for r := range resources {
		delete(w.running, r)
		delete(w.statuses, r) // the coordinator reads it UNASSIGNED until reported
		delete(w.reported, r)
		delete(w.acted, r)
		delete(w.applied, r)
		delete(w.failedStarts, r)
	}
	w.Log("stop", what)
	keep := w.assigned.Union(w.running)
	for r := range w.tokens {
		if !keep.Has(r) {
			delete(w.tokens, r)
		}
	}
}

// startWork starts r (assigned hook, made once: a failed start is reported FAILED and runs again
// only on a restart), reporting it owned while it starts.
func (w *Worker) startWork(r Resource) {
	w.busy = true
	one := NewSet(r)
	w.starting = one
	e := w.event("assigned", one, "")
	w.Log("start", w.described(one, fields{"member_epoch": w.epoch,
		"config_digests": w.digestsOf(one)}))
	count := w.restartCounts[r]
	go func() {
		err := w.call(e)
		w.post(func() {
			w.running.Add(r) // held either way
			w.starting = Set{}
			w.recordStart(r, count, err == nil)
			if err != nil {
				w.Log("error", fields{"what": "start", "error": err.Error()})
				w.statuses[r] = status{pb.ResourceState_FAILED, traceOf(err)}
			} else {
				w.statuses[r] = status{stateFor(r, w.targetOf(r)), ""}
			}
			w.done()
		})
	}()
}

// reconfigureWork: the running resources of a connector whose config digest changed, in one
// call.
func (w *Worker) reconfigureWork(resources Set) {
	w.busy = true
	w.Log("reconfigured", w.described(resources, fields{"member_epoch": w.epoch,
		"config_digests": w.digestsOf(resources)}))
	e := w.event("reconfigured", resources, "")
	go func() {
		err := w.call(e)
		w.post(func() {
			if err != nil {
				w.Log("error", fields{"what": "reconfigure", "error": err.Error()})
			}
			for r := range resources {
				if !w.running.Has(r) {
					continue
				}
				if err != nil {
					w.statuses[r] = status{pb.ResourceState_FAILED, traceOf(err)}
				} else {
					w.statuses[r] = status{stateFor(r, w.targetOf(r)), ""}
				}
			}
			w.busy = false
		})
	}()
}

var targetEvents = map[pb.TargetState]string{
	pb.TargetState_TARGET_PAUSED:  "paused",
	pb.TargetState_TARGET_STARTED: "resumed",
	pb.TargetState_TARGET_STOPPED: "stopped",
}

// targetWork: a connector's target state changed (paused, resumed, stopped): one call for its
// running resources, retried until the hook succeeds, then reported.
func (w *Worker) targetWork(resources Set, target pb.TargetState) {
	w.busy = true
	kind := targetEvents[target]
	w.Log("target_state", w.described(resources, fields{"member_epoch": w.epoch,
		"target_state": targetNames[target], "event": kind}))
	e := w.event(kind, resources, "")
	go func() {
		w.retry(e, "target_state")
		w.post(func() {
			for r := range resources {
				if w.running.Has(r) {
					w.applied[r] = target
					w.statuses[r] = status{stateFor(r, target), ""}
				}
			}
			w.busy = false
		})
	}()
}

// restartWork restarts r in place (DESIGN 3.20, KIP-745): revoked then assigned, both with
// reason "restart"; ownership does not change. It starts again only if this membership still
// holds r when the stop returned (else r is released).
func (w *Worker) restartWork(r Resource) {
	w.busy = true
	one := NewSet(r)
	membership := w.membership
	count := w.restartCounts[r]
	w.Log("restart", w.described(one, fields{"member_epoch": w.epoch}))
	// It reads RESTARTING: nothing is reported until the restart resolves, then reported again
	// even if unchanged.
	delete(w.statuses, r)
	delete(w.reported, r)
	var stop *Event
	if !w.failedStarts.Has(r) {
		stop = w.event("revoked", one, "restart")
	}
	go func() {
		if stop != nil {
			w.retry(stop, "stop")
		}
		w.post(func() {
			if w.phase != member || membership != w.membership || !w.assigned.Has(r) {
				w.released(one, w.described(one, fields{"member_epoch": w.epoch,
					"reason": "revoked during a restart"}))
				w.done()
				return
			}
			start := w.event("assigned", one, "restart")
			go func() {
				err := w.call(start)
				w.post(func() {
					w.recordStart(r, count, err == nil)
					if err != nil {
						w.Log("error", fields{"what": "restart", "error": err.Error()})
						w.statuses[r] = status{pb.ResourceState_FAILED, traceOf(err)}
					} else {
						w.statuses[r] = status{stateFor(r, w.targetOf(r)), ""}
					}
					w.busy = false
				})
			}()
		})
	}()
}

// done: the work finished; heartbeat at once (an acknowledgement, or a new owned list).
func (w *Worker) done() {
	w.busy = false
	w.nextHeartbeat = time.Now()
}

// --- heartbeats --------------------------------------------------------------------------------

func (w *Worker) heartbeatDue() bool {
	stopping := w.phase == rejoining || w.phase == leaving || w.phase == fatalPhase
	if stopping && (w.busy || len(w.owned()) > 0) {
		return false // stop first, then rejoin, leave or exit
	}
	if w.phase == fatalPhase {
		w.phase = left
		return false
	}
	if w.phase == leaving {
		if w.epoch <= 0 {
			w.phase = left // never joined: nothing to leave
		}
		return w.phase == leaving
	}
	if w.phase == rejoining {
		w.phase = joining
	}
	return !time.Now().Before(w.nextHeartbeat)
}

// buildHeartbeat: every field on a join and after an error; otherwise only what changed (the
// owned list ABSENT unless it changed).
func (w *Worker) buildHeartbeat() (*pb.ConnectGroupHeartbeatRequest, string, bool) {
	o := w.o
	req := &pb.ConnectGroupHeartbeatRequest{GroupId: o.GroupID, MemberId: o.MemberID,
		MemberEpoch: w.epoch}
	owned := w.owned()
	key := owned.Key()
	if w.fullNext || w.epoch == 0 {
		if o.InstanceID != "" {
			req.InstanceId = &o.InstanceID
		}
		timeout := o.RebalanceTimeoutMs
		req.RebalanceTimeoutMs = &timeout
		req.ClientAssignors = &pb.AssignorList{Assignors: []*pb.Assignor{{
			Name: AssignorName, MinimumVersion: AssignorMinVersion,
			MaximumVersion: AssignorMaxVersion, Version: AssignorMaxVersion,
		}}}
		req.ConnectorsAndTasks = owned.Proto() // present, even when empty: "I run nothing"
		if o.URL != nil {
			url := *o.URL
			req.Url = &url
		}
	} else if !w.hasReported || key != w.lastReported {
		req.ConnectorsAndTasks = owned.Proto()
	} // else ABSENT: unchanged since the last heartbeat
	return req, key, req.ConnectorsAndTasks != nil
}

func (w *Worker) rpcContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), w.o.RPCTimeout)
}

func (w *Worker) heartbeat() {
	if w.phase == leaving {
		w.sendLeave()
		return
	}
	req, key, withOwned := w.buildHeartbeat()
	client := w.conn.coordinator
	w.heartbeating = true
	sentAt := time.Now()
	ctx, cancel := w.rpcContext()
	w.cancelHeartbeat = cancel
	go func() {
		resp, err := client.ConnectGroupHeartbeat(ctx, req)
		cancel()
		w.post(func() {
			w.heartbeating = false
			if ctx != w.heartbeatCtx() {
				return // abandoned by loseMembership: a stale answer
			}
			w.cancelHeartbeat = nil
			w.onHeartbeat(req, resp, err, sentAt, key, withOwned)
		})
	}()
	w.currentHeartbeat = ctx
}

// heartbeatCtx is the context of the heartbeat in flight that still counts (nil: none).
func (w *Worker) heartbeatCtx() context.Context { return w.currentHeartbeat }

func (w *Worker) onHeartbeat(req *pb.ConnectGroupHeartbeatRequest,
	resp *pb.ConnectGroupHeartbeatResponse, err error, sentAt time.Time, key string, withOwned bool) {
	if err != nil {
		w.retryLater("heartbeat failed: " + err.Error())
		if w.failures%3 == 0 {
			w.findCoordinator()
		}
		return
	}
	code := resp.ErrorCode
	switch Classify(code) {
	case success:
		w.onSuccess(req, resp, sentAt, key, withOwned)
	case rejoin:
		w.loseMembership(fmt.Sprintf("%s: %s", codeName(code), resp.ErrorMessage))
	case fatal:
		f := fields{"error_code": codeName(code), "error_message": resp.ErrorMessage}
		w.fatalWhy = fmt.Sprintf("%s: %s", codeName(code), resp.ErrorMessage)
		if fix, ok := configurationErrors[code]; ok {
			f["fix"] = fix
			w.fatalWhy += " [configuration error: " + fix + "]"
		}
		w.Log("fatal", f)
		w.phase = fatalPhase
		w.assigned = Set{}
	case findAndRetry:
		w.retryLater(fmt.Sprintf("%s: %s", codeName(code), resp.ErrorMessage))
		w.findCoordinator()
	default:
		w.retryLater(fmt.Sprintf("%s: %s", codeName(code), resp.ErrorMessage))
	}
	if resp.ThrottleTimeMs > 0 {
		// A quota (e.g. joins per principal): no request before it has passed.
		until := time.Now().Add(time.Duration(resp.ThrottleTimeMs) * time.Millisecond)
		if until.After(w.nextHeartbeat) {
			w.nextHeartbeat = until
		}
	}
}

func (w *Worker) onSuccess(req *pb.ConnectGroupHeartbeatRequest,
	resp *pb.ConnectGroupHeartbeatResponse, sentAt time.Time, key string, withOwned bool) {
	if w.phase == leaving && req.MemberEpoch == 0 {
		w.epoch = resp.MemberEpoch // joined just as we decided to leave: leave properly
		return
	}
	if w.phase != joining && w.phase != member {
		return // we rejoin or leave now
	}
	if w.phase == joining {
		w.Log("joined", fields{"member_epoch": resp.MemberEpoch})
		w.membership++
		w.fetched = false // fetch again after every join
	}
	w.phase = member
	w.failures = 0
	w.fullNext = false
	if withOwned {
		w.lastReported, w.hasReported = key, true
	}
	w.lastSuccessAt = sentAt
	if resp.HeartbeatIntervalMs > 0 {
		w.interval = time.Duration(resp.HeartbeatIntervalMs) * time.Millisecond
	}
	if resp.SessionTimeoutMs > 0 {
		w.session = time.Duration(resp.SessionTimeoutMs) * time.Millisecond
	}
	w.nextHeartbeat = time.Now().Add(w.interval)
	w.epoch = resp.MemberEpoch
	if resp.LifecycleRevision != w.revision {
		w.revisionsSeen++
	}
	w.revision = resp.LifecycleRevision
	if resp.Assignment != nil {
		// Present: the full set we may run now. Absent: keep what we have.
		w.assigned = SetOf(resp.Assignment.ConnectorsAndTasks)
		// Its tokens; a resource it keeps without a token keeps the one it had, and one still
		// running outside it (being revoked) the one it ran under.
		keep := w.assigned.Union(w.running)
		tokens := map[Resource]int64{}
		for r, t := range w.tokens {
			if keep.Has(r) {
				tokens[r] = t
			}
		}
		for r, t := range tokensFrom(resp.Assignment.FencingTokens) {
			if w.assigned.Has(r) {
				tokens[r] = t
			}
		}
		w.tokens = tokens
		w.Log("assignment", w.described(w.assigned, fields{"member_epoch": w.epoch}))
	}
	if resp.ErrorCode == pb.ErrorCode_COMPUTE_ASSIGNMENT && !w.computing {
		w.compute()
	}
	if w.owned().Key() != w.lastReported {
		w.nextHeartbeat = time.Now()
	}
	w.lifecycle()
}

func (w *Worker) retryLater(why string) {
	w.failures++
	w.fullNext = true
	exponential := 50 * time.Millisecond * time.Duration(math.Pow(2, math.Min(float64(w.failures-1), 10)))
	backoff := 2 * time.Second
	if w.interval < backoff {
		backoff = w.interval
	}
	if exponential < backoff {
		backoff = exponential
	}
	if backoff < 50*time.Millisecond {
		backoff = 50 * time.Millisecond
	}
	w.nextHeartbeat = time.Now().Add(backoff)
	w.Log("retry", fields{"why": why, "attempt": w.failures})
}

func (w *Worker) loseMembership(why string) {
	w.Log("rejoin", fields{"why": why})
	if w.cancelHeartbeat != nil {
		w.cancelHeartbeat()
		w.cancelHeartbeat, w.currentHeartbeat = nil, nil
	}
	if w.phase != leaving {
		w.phase = rejoining
	}
	w.epoch = 0
	w.assigned = Set{}
	w.revision = 0
	w.fetched = false
	w.configs = map[string]heldConfig{}
	w.restartCounts = map[Resource]int64{}
	w.reconfigure = map[string]bool{}
	w.reported = map[Resource]reportedStatus{} // a new membership: new grants, new tokens
	w.fullNext = true
	w.lastSuccessAt = time.Time{}
	w.failures = 0
	w.nextHeartbeat = time.Now()
}

// checkSelfFence: not heard for nearly a session timeout, stop everything before anyone else
// may start it (checked on the loop's timer, so a hanging call cannot delay it).
func (w *Worker) checkSelfFence() {
	if w.phase != member || w.lastSuccessAt.IsZero() {
		return
	}
	margin := w.interval
	if fifth := w.session / 5; fifth > margin {
		margin = fifth
	}
	silent := time.Since(w.lastSuccessAt)
	if silent >= w.session-margin {
		w.loseMembership(fmt.Sprintf("no successful heartbeat for %d ms: fencing itself",
			silent.Milliseconds()))
	}
}

// sendLeave: one heartbeat with epoch -1 (-2 with an instance id: a static member's work waits
// for its successor); retried until the leave deadline.
func (w *Worker) sendLeave() {
	o := w.o
	req := &pb.ConnectGroupHeartbeatRequest{GroupId: o.GroupID, MemberId: o.MemberID,
		MemberEpoch: -1}
	if o.InstanceID != "" {
		req.MemberEpoch = -2
		req.InstanceId = &o.InstanceID
	}
	client := w.conn.coordinator
	w.heartbeating = true
	go func() {
		ctx, cancel := w.rpcContext()
		resp, err := client.ConnectGroupHeartbeat(ctx, req)
		cancel()
		w.post(func() {
			w.heartbeating = false
			if err == nil {
				w.Log("left", fields{"member_epoch": req.MemberEpoch,
					"error_code": codeName(resp.ErrorCode)})
				w.phase = left
			} else if time.Now().After(w.leaveDeadline) {
				w.Log("left", fields{"error": fmt.Sprintf(
					"leave not delivered (%v); the session will expire", err)})
				w.phase = left
			} else {
				w.retryLater("leave failed: " + err.Error())
			}
		})
	}()
}

// findCoordinator asks each known address (the current one first) which process serves the
// group, and reconnects there. Heartbeats wait for it.
func (w *Worker) findCoordinator() {
	current := w.conn.address
	candidates := []string{current}
	for _, a := range w.o.Coordinators {
		if a != current {
			candidates = append(candidates, a)
		}
	}
	w.heartbeating = true
	o := w.o
	go func() {
		found := ""
		for _, address := range candidates {
			cc, err := o.dial(address)
			if err != nil {
				w.Log("find_coordinator_failed", fields{"address": address, "error": err.Error()})
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), o.RPCTimeout)
			resp, err := pb.NewConnectGroupAdminClient(cc).FindCoordinator(ctx,
				&pb.FindCoordinatorRequest{GroupId: o.GroupID})
			cancel()
			cc.Close()
			if err != nil {
				w.Log("retry", fields{"why": fmt.Sprintf("FindCoordinator at %s failed: %v",
					address, err)})
				continue
			}
			if resp.ErrorCode == pb.ErrorCode_NONE && resp.Host != "" {
				found = fmt.Sprintf("%s:%d", resp.Host, resp.Port)
				if strings.Contains(resp.Host, ":") {
					found = fmt.Sprintf("[%s]:%d", resp.Host, resp.Port)
				}
				break
			}
		}
		w.post(func() {
			w.heartbeating = false
			if found == "" || found == w.conn.address {
				return
			}
			c, err := o.connect(found)
			if err != nil {
				w.Log("find_coordinator_failed", fields{"address": found, "error": err.Error()})
				return
			}
			w.Log("reconnect", fields{"coordinator": found})
			old := w.conn
			w.conn = c
			old.cc.Close()
		})
	}()
}

// --- connector lifecycle (DESIGN 3.20): configs in, statuses out -------------------------------

// lifecycle fetches configs or reports statuses if due; each runs beside the heartbeats, one
// at a time.
func (w *Worker) lifecycle() {
	if w.phase != member || w.revision <= 0 {
		return
	}
	now := time.Now()
	if now.Before(w.callsNotBefore) {
		return // throttled: both calls wait
	}
	if !w.fetching && (!w.fetched || w.fetchedRev != w.revision) && !now.Before(w.fetchNotBefore) {
		w.fetchConfigs()
	}
	if !w.reporting && !now.Before(w.lastReportAt.Add(w.interval)) {
		if entries, keys := w.statusChanges(); len(entries) > 0 {
			w.lastReportAt = now
			w.report(entries, keys)
		}
	}
}

// memberCallRefused: THROTTLING_QUOTA_EXCEEDED holds both calls back for its throttle_time_ms;
// the others are retried later (the heartbeat deals with membership).
func (w *Worker) memberCallRefused(call string, code pb.ErrorCode, message string, throttleMs int32) {
	if code == pb.ErrorCode_THROTTLING_QUOTA_EXCEEDED {
		wait := time.Duration(throttleMs) * time.Millisecond
		if wait <= 0 {
			wait = w.interval
		}
		w.callsNotBefore = time.Now().Add(wait)
		w.Log("throttled", fields{"call": call, "throttle_time_ms": wait.Milliseconds()})
		return
	}
	w.Log("retry", fields{"why": fmt.Sprintf("%s: %s: %s", call, codeName(code), message)})
}

func (w *Worker) fetchConfigs() {
	w.fetching = true
	membership, seen := w.membership, w.revisionsSeen
	known := map[string]string{}
	for name, held := range w.configs {
		known[name] = held.digest
	}
	req := &pb.ConnectGroupConfigsRequest{GroupId: w.o.GroupID, MemberId: w.o.MemberID,
		MemberEpoch: w.epoch, KnownDigests: known}
	client := w.conn.coordinator
	go func() {
		ctx, cancel := w.rpcContext()
		resp, err := client.ConnectGroupConfigs(ctx, req)
		cancel()
		w.post(func() {
			w.fetching = false
			if membership != w.membership || w.phase != member {
				return // stale
			}
			if err != nil {
				resp = &pb.ConnectGroupConfigsResponse{ErrorCode: pb.ErrorCode_UNKNOWN_SERVER_ERROR,
					ErrorMessage: "transport: " + err.Error()}
			}
			if resp.ErrorCode != pb.ErrorCode_NONE {
				w.fetchNotBefore = time.Now().Add(w.interval)
				w.memberCallRefused("ConnectGroupConfigs", resp.ErrorCode, resp.ErrorMessage,
					resp.ThrottleTimeMs)
				return
			}
			w.onConfigs(req, resp, seen)
		})
	}()
}

func (w *Worker) onConfigs(req *pb.ConnectGroupConfigsRequest, resp *pb.ConnectGroupConfigsResponse,
	seen int) {
	configs := map[string]heldConfig{}
	changed := []string{}
	incomplete := false
	for _, held := range resp.Connectors {
		before, had := w.configs[held.Connector]
		var config map[string]string
		if held.Config != nil {
			config = map[string]string{}
			for k, v := range held.Config.Values {
				config[k] = v
			}
		} else if had && before.digest == held.ConfigDigest {
			config = before.config // ABSENT: the digest we sent
		}
		if config == nil {
			incomplete = true // cannot happen with a correct coordinator: ask again, naming nothing
			continue
		}
		configs[held.Connector] = heldConfig{held.ConfigDigest, config, held.TargetState}
		if !had || before.digest != held.ConfigDigest {
			changed = append(changed, held.Connector)
		}
		if had && before.digest != held.ConfigDigest {
			w.reconfigure[held.Connector] = true
		}
	}
	w.configs = configs
	w.restartCounts = restartCountsFrom(resp.RestartCounts)
	if incomplete {
		w.fetched = false
		w.fetchNotBefore = time.Now().Add(w.interval)
	} else {
		w.fetched, w.fetchedRev = true, resp.LifecycleRevision
		if seen == w.revisionsSeen {
			// No heartbeat answer brought a revision while it was asked: the answer's is the
			// latest known (it may be newer than the last heartbeat's). Without this it would be
			// fetched again until a heartbeat answer caught up, and nothing would start.
			w.revision = w.fetchedRev
		}
	}
	digests := map[string]string{}
	for name, held := range configs {
		digests[name] = held.digest
	}
	sort.Strings(changed)
	w.Log("configs", fields{"member_epoch": req.MemberEpoch,
		"lifecycle_revision": resp.LifecycleRevision, "config_digests": digests,
		"changed": changed})
}

// statusChanges: the statuses that differ from what the coordinator last answered.
func (w *Worker) statusChanges() ([]*pb.StatusEntry, []Resource) {
	owned := w.owned()
	entries := []*pb.StatusEntry{}
	keys := []Resource{}
	rs := make([]Resource, 0, len(w.statuses))
	for r := range w.statuses {
		rs = append(rs, r)
	}
	sort.Slice(rs, func(i, j int) bool { return less(rs[i], rs[j]) })
	for _, r := range rs {
		st := w.statuses[r]
		token, ok := w.tokens[r]
		if !owned.Has(r) || !ok {
			continue
		}
		if last, ok := w.reported[r]; ok && last.state == st.state && last.trace == st.trace &&
			last.token == token {
			continue
		}
		entry := &pb.StatusEntry{Connector: r.Connector, FencingToken: token, State: st.state,
			Trace: st.trace}
		if r.IsTask() {
			task := r.Task
			entry.Task = &task // ABSENT: the connector itself
		}
		entries = append(entries, entry)
		keys = append(keys, r)
	}
	return entries, keys
}

func (w *Worker) report(entries []*pb.StatusEntry, keys []Resource) {
	w.reporting = true
	membership := w.membership
	req := &pb.ConnectGroupReportStatusRequest{GroupId: w.o.GroupID, MemberId: w.o.MemberID,
		MemberEpoch: w.epoch, Entries: entries}
	client := w.conn.coordinator
	go func() {
		ctx, cancel := w.rpcContext()
		resp, err := client.ConnectGroupReportStatus(ctx, req)
		cancel()
		w.post(func() {
			w.reporting = false
			if membership != w.membership || w.phase != member {
				return // stale
			}
			if err != nil {
				resp = &pb.ConnectGroupReportStatusResponse{
					ErrorCode:    pb.ErrorCode_UNKNOWN_SERVER_ERROR,
					ErrorMessage: "transport: " + err.Error()}
			}
			if resp.ErrorCode != pb.ErrorCode_NONE {
				w.memberCallRefused("ConnectGroupReportStatus", resp.ErrorCode, resp.ErrorMessage,
					resp.ThrottleTimeMs)
				return
			}
			counted, refused := []fields{}, []fields{}
			for i, entry := range entries {
				code, message := pb.ErrorCode_UNKNOWN_SERVER_ERROR, ""
				if i < len(resp.Results) {
					code, message = resp.Results[i].ErrorCode, resp.Results[i].ErrorMessage
				}
				resource := fields{"connector": entry.Connector, "state": entry.State.String()}
				if entry.Task != nil {
					resource["task"] = *entry.Task
				}
				if code == pb.ErrorCode_NONE {
					counted = append(counted, resource)
				} else {
					resource["error_code"] = codeName(code)
					resource["why"] = message
					refused = append(refused, resource)
				}
				// Counted, or refused (NOT_RESOURCE_OWNER: not held under that token): either
				// way, not sent again until it changes; a new grant brings a new token.
				if _, now := w.statuses[keys[i]]; now && code != pb.ErrorCode_UNKNOWN_SERVER_ERROR {
					w.reported[keys[i]] = reportedStatus{entry.State, entry.Trace, entry.FencingToken}
				}
			}
			w.Log("status", fields{"member_epoch": req.MemberEpoch, "counted": counted,
				"refused": refused})
		})
	}()
}

// --- COMPUTE_ASSIGNMENT ------------------------------------------------------------------------

// compute: Prepare, assign, Install, once per group epoch, while heartbeats go on.
func (w *Worker) compute() {
	w.computing = true
	o := w.o
	epoch, lastInstalled := w.epoch, w.lastInstalled
	client := w.conn.coordinator
	go func() {
		installed := int32(-1)
		defer func() {
			w.post(func() {
				w.computing = false
				if installed >= 0 {
					w.lastInstalled = installed
				}
			})
		}()
		ctx, cancel := w.rpcContext()
		prepared, err := client.ConnectGroupPrepareAssignment(ctx,
			&pb.ConnectGroupPrepareAssignmentRequest{GroupId: o.GroupID, MemberId: o.MemberID,
				MemberEpoch: epoch})
		cancel()
		if err != nil {
			w.Log("compute", fields{"outcome": "failed", "error": err.Error()})
			return
		}
		if prepared.ErrorCode != pb.ErrorCode_NONE {
			// UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, ...: abandon; the heartbeat says what next.
			w.Log("compute", fields{"outcome": "prepare refused",
				"error_code": codeName(prepared.ErrorCode)})
			return
		}
		if prepared.GroupEpoch == lastInstalled {
			return // computed already
		}
		install := &pb.ConnectGroupInstallAssignmentRequest{GroupId: o.GroupID,
			MemberId: o.MemberID, MemberEpoch: epoch, GroupEpoch: prepared.GroupEpoch,
			Members: []*pb.MemberAssignment{}, AssignorState: []byte{}}
		if prepared.AssignorName == AssignorName {
			install.Members = Assign(prepared)
		} else {
			install.Error = 1
			install.ErrorMessage = "this client has no assignor " + prepared.AssignorName
		}
		ctx, cancel = w.rpcContext()
		resp, err := client.ConnectGroupInstallAssignment(ctx, install)
		cancel()
		if err != nil {
			w.Log("compute", fields{"outcome": "failed", "error": err.Error()})
			return
		}
		outcome := "install refused"
		if resp.ErrorCode == pb.ErrorCode_NONE {
			outcome = "installed"
			if install.Error == 0 {
				installed = prepared.GroupEpoch
			}
		}
		w.Log("compute", fields{"outcome": outcome, "group_epoch": prepared.GroupEpoch,
			"error_code": codeName(resp.ErrorCode), "error_message": resp.ErrorMessage})
	}()
}
