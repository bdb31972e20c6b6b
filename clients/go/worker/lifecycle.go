// The connector lifecycle (DESIGN 3.20): configs fetched for what the worker holds, statuses
// reported back.

package worker

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
)

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

// maxStatusEntries bounds one ConnectGroupReportStatus call (the coordinator refuses more than
// 10,000 entries, the whole call): the rest go in the next calls.
const maxStatusEntries = 1000

// cleanTrace is trace as the coordinator takes it: the coordinator refuses a whole
// ConnectGroupReportStatus call whose trace holds a NUL character, and protobuf refuses to
// marshal a string that is not UTF-8 (a hook's standard error, or a trace cut inside a
// character), so either would fail every report, forever. Invalid bytes become U+FFFD, NULs go,
// and it is cut to maxTraceChars bytes on a character boundary.
func cleanTrace(trace string) string {
	trace = strings.ReplaceAll(strings.ToValidUTF8(trace, "\uFFFD"), "\x00", "")
	if len(trace) <= maxTraceChars {
		return trace
	}
	cut := maxTraceChars
	for cut > 0 && !utf8.RuneStart(trace[cut]) {
		cut--
	}
	return trace[:cut]
}

// statusChanges: the statuses that differ from what the coordinator last answered, at most
// maxStatusEntries of them (in resource order).
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
		if len(entries) == maxStatusEntries {
			break
		}
		st := w.statuses[r]
		token, ok := w.tokens[r]
		if !owned.Has(r) || !ok {
			continue
		}
		// Compared as sent (what reported holds), else a trace that cleaning changes would
		// differ from it forever and be sent again at every interval.
		trace := cleanTrace(st.trace)
		if last, ok := w.reported[r]; ok && last.state == st.state && last.trace == trace &&
			last.token == token {
			continue
		}
		entry := &pb.StatusEntry{Connector: r.Connector, FencingToken: token, State: st.state,
			Trace: trace}
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
			if len(entries) == maxStatusEntries && len(resp.Results) >= len(entries) {
				// A full call, all answered: there may be more, sent without waiting for the
				// interval (unanswered entries wait for it, else they would be sent in a loop).
				w.lastReportAt = time.Time{}
			}
		})
	}()
}
