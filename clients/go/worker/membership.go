// Heartbeats, membership and its loss, self-fencing, leaving, and FindCoordinator.

package worker

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
)

func (w *Worker) heartbeatDue() bool {
	stopping := w.phase == rejoining || w.phase == leaving || w.phase == fatalPhase
	if w.stillHeartbeating() {
		// Leaving while the work stops: still a member, so heartbeat as one (the owned list
		// shrinking as it stops) and keep the session, which must not expire while work runs.
		return !time.Now().Before(w.nextHeartbeat)
	}
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
		return w.phase == leaving && !time.Now().Before(w.nextHeartbeat) // a failed leave backs off
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

// stillHeartbeating: leaving as a member (epoch > 0) while work still stops.
func (w *Worker) stillHeartbeating() bool {
	return w.phase == leaving && w.epoch > 0 && (w.busy || len(w.owned()) > 0)
}

func (w *Worker) heartbeat() {
	if w.phase == leaving && !w.stillHeartbeating() {
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
	if w.phase == leaving && req.MemberEpoch > 0 {
		// A heartbeat while the work stops before the leave: the session is kept; the answer's
		// assignment does not matter any more (everything stops).
		w.keepSession(resp, sentAt, key, withOwned)
		w.epoch = resp.MemberEpoch
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
	w.keepSession(resp, sentAt, key, withOwned)
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

// keepSession: what every successful heartbeat answer updates (the session's clock, the
// coordinator's interval and timeout, what it has been told).
func (w *Worker) keepSession(resp *pb.ConnectGroupHeartbeatResponse, sentAt time.Time,
	key string, withOwned bool) {
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
	if (w.phase != member && !w.stillHeartbeating()) || w.lastSuccessAt.IsZero() {
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
