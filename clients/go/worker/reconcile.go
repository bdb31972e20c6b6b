// Reconciliation: revoke before assign, one resource at a time (protos/README.md, "What a client
// must do"); target states and restarts in place (DESIGN 3.20), each one listener call.

package worker

import (
	"sort"
	"time"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
)

func first(s Set) Resource { return s.Sorted()[0] }

func (w *Worker) reconcile() {
	stopAll := w.phase == rejoining || w.phase == leaving || w.phase == fatalPhase
	toStop := w.running.Minus(w.assigned)
	if stopAll {
		toStop = w.running
	}
	// A target-state call retrying on a work goroutine gives up while something must stop.
	w.stopWanted.Store(len(toStop) > 0)
	if w.busy {
		return
	}
	if len(toStop) > 0 {
		reason := map[phase]string{rejoining: "membership lost", leaving: "leaving",
			fatalPhase: "fatal error"}[w.phase]
		if reason == "" {
			reason = "revoked"
		}
		if stopAll {
			// Everything stops in one call: one resource at a time could outlast the session
			// (self-fencing leaves max(interval, session/5) for all of it).
			w.stopWork(toStop, reason)
		} else {
			w.stopWork(NewSet(first(toStop)), reason)
		}
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
	w.retryUnless(e, what, func() bool { return false })
}

// retryUnless calls the listener until it succeeds (true) or, after a failure, until
// `abandon` says to give up (false), with a backoff (on a work goroutine).
func (w *Worker) retryUnless(e *Event, what string, abandon func() bool) bool {
	delay := w.o.RetryInitial
	for attempt := 1; ; attempt++ {
		err := w.call(e)
		if err == nil {
			return true
		}
		w.Log("error", fields{"what": what, "attempt": attempt, "error": err.Error()})
		if abandon() {
			w.Log("abandoned", fields{"what": what, "attempt": attempt,
				"why": "resources must be stopped first"})
			return false
		}
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

// stopWork stops resources (one revoked hook call, retried until it succeeds), then releases
// them and heartbeats at once: a revocation stops one resource at a time, so each is
// acknowledged on its own (partial release); stopping everything is one call.
func (w *Worker) stopWork(resources Set, reason string) {
	w.busy = true
	one := resources
	epoch := w.epoch
	what := w.described(one, fields{"member_epoch": epoch, "reason": reason})
	var e *Event
	// A resource whose start failed runs nothing: no hook call for it.
	if runs := one.Minus(w.failedStarts); len(runs) > 0 {
		e = w.event("revoked", runs, "")
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
		if !w.retryUnless(e, "target_state", w.stopWanted.Load) {
			w.post(func() { w.busy = false }) // tried again once the stops are done
			return
		}
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
