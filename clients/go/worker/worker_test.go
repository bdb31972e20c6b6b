package worker

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
)

func cat(connectors []string, tasks ...*pb.ConnectorTaskId) *pb.ConnectorsAndTasks {
	return &pb.ConnectorsAndTasks{Connectors: connectors, Tasks: tasks}
}

func task(c string, n int32) *pb.ConnectorTaskId { return &pb.ConnectorTaskId{Connector: c, Task: n} }

func shares(out []*pb.MemberAssignment) map[string]Set {
	m := map[string]Set{}
	for _, a := range out {
		m[a.MemberId] = SetOf(a.ConnectorsAndTasks)
	}
	return m
}

func TestAssignBalancesEverythingOnce(t *testing.T) {
	group := &pb.ConnectGroupPrepareAssignmentResponse{
		AssignorVersion: 1,
		Members: []*pb.PreparedMember{
			{MemberId: "w1", ConnectorsAndTasks: cat([]string{"A"}, task("A", 0), task("A", 1))},
			{MemberId: "w2", ConnectorsAndTasks: cat(nil)},
		},
		Catalogue: []*pb.ConnectorSpec{{Name: "A", TaskCount: 2}, {Name: "B", TaskCount: 1}},
		TargetAssignment: []*pb.MemberAssignment{
			{MemberId: "w1", ConnectorsAndTasks: cat([]string{"A"}, task("A", 0), task("A", 1))},
		},
	}
	got := shares(Assign(group))
	all := Set{}
	for id, s := range got {
		for r := range s {
			if all.Has(r) {
				t.Fatalf("%v assigned twice (%s)", r, id)
			}
			all.Add(r)
		}
	}
	want := NewSet(ConnectorResource("A"), ConnectorResource("B"), TaskResource("A", 0),
		TaskResource("A", 1), TaskResource("B", 0))
	if !reflect.DeepEqual(all, want) {
		t.Fatalf("assigned %v, want %v", all.Sorted(), want.Sorted())
	}
	// sticky: w1 keeps A and one of its tasks; balanced: one connector and 1-2 tasks each
	if !got["w1"].Has(ConnectorResource("A")) || !got["w1"].Has(TaskResource("A", 0)) {
		t.Fatalf("w1 lost its share: %v", got["w1"].Sorted())
	}
	for id, s := range got {
		connectors, tasks := s.Split()
		if len(connectors) != 1 || len(tasks) < 1 || len(tasks) > 2 {
			t.Fatalf("%s unbalanced: %v", id, s.Sorted())
		}
	}
}

func TestAssignDropsWhatLeftTheCatalogue(t *testing.T) {
	group := &pb.ConnectGroupPrepareAssignmentResponse{
		AssignorVersion: 1,
		Members: []*pb.PreparedMember{
			{MemberId: "w1", ConnectorsAndTasks: cat([]string{"A", "GONE"}, task("GONE", 0))},
		},
		Catalogue: []*pb.ConnectorSpec{{Name: "A", TaskCount: 1}},
	}
	out := Assign(group)
	if len(out) != 1 || out[0].Version != 1 {
		t.Fatalf("unexpected %v", out)
	}
	if got := SetOf(out[0].ConnectorsAndTasks); !reflect.DeepEqual(got,
		NewSet(ConnectorResource("A"), TaskResource("A", 0))) {
		t.Fatalf("got %v", got.Sorted())
	}
}

func TestShellSplit(t *testing.T) {
	cases := map[string][]string{
		`python3 -S hook.py out.jsonl`: {"python3", "-S", "hook.py", "out.jsonl"},
		`a 'b c' "d \"e\" $f" g\ h`:    {"a", "b c", `d "e" $f`, "g h"},
		`  x''  `:                      {"x"},
		`''`:                           {""},
	}
	for in, want := range cases {
		got, err := ShellSplit(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ShellSplit(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ShellSplit(`a "b`); err == nil {
		t.Error("an unclosed quote must fail")
	}
}

func TestClassify(t *testing.T) {
	cases := map[pb.ErrorCode]outcome{
		pb.ErrorCode_NONE:                        success,
		pb.ErrorCode_COMPUTE_ASSIGNMENT:          success,
		pb.ErrorCode_FENCED_MEMBER_EPOCH:         rejoin,
		pb.ErrorCode_UNKNOWN_MEMBER_ID:           rejoin,
		pb.ErrorCode_UNSUPPORTED_VERSION:         fatal,
		pb.ErrorCode_INCONSISTENT_GROUP_PROTOCOL: fatal,
		pb.ErrorCode_FENCED_INSTANCE_ID:          fatal,
		pb.ErrorCode_NOT_COORDINATOR:             findAndRetry,
		pb.ErrorCode_COORDINATOR_NOT_AVAILABLE:   findAndRetry,
		pb.ErrorCode_GROUP_MAX_SIZE_REACHED:      retryLater,
		pb.ErrorCode(4242):                       retryLater,
	}
	for code, want := range cases {
		if got := Classify(code); got != want {
			t.Errorf("Classify(%v) = %v, want %v", code, got, want)
		}
	}
}

// newTestWorker is a Worker without a connection, for the pure decisions.
func newTestWorker(t *testing.T) *Worker {
	w, err := New(Options{Coordinators: []string{"127.0.0.1:1"}, GroupID: "g", MemberID: "m",
		Print: func([]byte) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.conn.cc.Close() })
	return w
}

func TestHeartbeatSendsOnlyWhatChanged(t *testing.T) {
	w := newTestWorker(t)
	join, _, _ := w.buildHeartbeat()
	if join.RebalanceTimeoutMs == nil || join.ClientAssignors == nil ||
		join.ConnectorsAndTasks == nil {
		t.Fatalf("a join sets every field: %v", join)
	}
	// a member that reported its (empty) owned list: nothing changed, the list is ABSENT
	w.phase, w.epoch, w.fullNext = member, 3, false
	w.lastReported, w.hasReported = Set{}.Key(), true
	if req, _, _ := w.buildHeartbeat(); req.ConnectorsAndTasks != nil ||
		req.RebalanceTimeoutMs != nil || req.ClientAssignors != nil {
		t.Fatalf("unchanged: every optional field absent, got %v", req)
	}
	// it started something: the list is present
	w.running.Add(ConnectorResource("A"))
	if req, _, _ := w.buildHeartbeat(); req.ConnectorsAndTasks == nil ||
		req.RebalanceTimeoutMs != nil {
		t.Fatalf("owned list changed: only it is present, got %v", req)
	}
	// after an error: every field again
	w.retryLater("test")
	if req, _, _ := w.buildHeartbeat(); req.RebalanceTimeoutMs == nil || req.ConnectorsAndTasks == nil {
		t.Fatalf("after an error every field is sent, got %v", req)
	}
}

func TestReconcileStopsBeforeItStarts(t *testing.T) {
	w := newTestWorker(t)
	w.phase, w.epoch = member, 4
	w.running = NewSet(ConnectorResource("A"), TaskResource("A", 0))
	w.assigned = NewSet(ConnectorResource("A"), TaskResource("B", 0))
	w.reconcile()
	if !w.busy || len(w.starting) != 0 {
		t.Fatalf("it must stop A-0 first (busy %v, starting %v)", w.busy, w.starting)
	}
	(<-w.posted)() // the stop finished: released, heartbeat due at once
	if w.running.Has(TaskResource("A", 0)) || w.busy {
		t.Fatalf("A-0 still running after its stop: %v", w.running.Sorted())
	}
	if time.Until(w.nextHeartbeat) > 0 {
		t.Fatal("the acknowledgement is not sent at once")
	}
	w.reconcile()
	if !w.starting.Has(TaskResource("B", 0)) {
		t.Fatalf("then it starts B-0, starting %v", w.starting.Sorted())
	}
	(<-w.posted)()
	if !w.running.Has(TaskResource("B", 0)) || w.statuses[TaskResource("B", 0)].state !=
		pb.ResourceState_RUNNING {
		t.Fatalf("B-0 runs and reads RUNNING: %v %v", w.running.Sorted(), w.statuses)
	}
}

func TestSelfFence(t *testing.T) {
	w := newTestWorker(t)
	w.phase, w.epoch = member, 2
	w.interval, w.session = 100*time.Millisecond, time.Second
	w.lastSuccessAt = time.Now().Add(-700 * time.Millisecond)
	w.checkSelfFence()
	if w.phase != member {
		t.Fatal("fenced too early: 1000 - max(100, 200) = 800 ms")
	}
	w.lastSuccessAt = time.Now().Add(-800 * time.Millisecond)
	w.checkSelfFence()
	if w.phase != rejoining || w.epoch != 0 {
		t.Fatalf("not fenced after 800 ms: phase %v epoch %d", w.phase, w.epoch)
	}
}

func TestEventJSON(t *testing.T) {
	tokens := map[Resource]int64{TaskResource("A", 1): 7}
	e := &Event{Event: "assigned", GroupID: "g", MemberID: "m", MemberEpoch: 3,
		Resources: NewSet(TaskResource("A", 1)), FencingTokens: TokensOf(NewSet(TaskResource("A", 1)), tokens),
		Configs:      map[string]ConfigJSON{"A": {Digest: "d", Config: map[string]string{"k": "v"}}},
		TargetStates: map[string]string{"A": "STARTED"}}
	data, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"configs":{"A":{"digest":"d","config":{"k":"v"}}},"connectors":[],"event":"assigned",` +
		`"fencing_tokens":{"connectors":{},"tasks":[{"connector":"A","task":1,"token":7}]},` +
		`"group_id":"g","member_epoch":3,"member_id":"m","target_states":{"A":"STARTED"},` +
		`"tasks":[{"connector":"A","task":1}]}`
	if string(data) != want {
		t.Fatalf("got  %s\nwant %s", data, want)
	}
	revoked := &Event{Event: "revoked", Resources: Set{}, Reason: "restart"}
	data, _ = json.Marshal(revoked)
	var obj map[string]interface{}
	_ = json.Unmarshal(data, &obj)
	if _, ok := obj["configs"]; ok || obj["reason"] != "restart" {
		t.Fatalf("revoked: no configs, a reason: %s", data)
	}
}

func TestIsLoopback(t *testing.T) {
	for address, want := range map[string]bool{
		"127.0.0.1:9093": true, "localhost:1": true, "[::1]:9093": true, "10.0.0.1:9093": false,
		"coordinator:9093": false,
	} {
		if IsLoopback(address) != want {
			t.Errorf("IsLoopback(%q) != %v", address, want)
		}
	}
}

func TestTargetChangeIsOneConnectorAtATime(t *testing.T) {
	w := newTestWorker(t)
	w.running = NewSet(ConnectorResource("A"), TaskResource("A", 0), ConnectorResource("B"))
	for r := range w.running {
		w.applied[r] = pb.TargetState_TARGET_STARTED
	}
	w.configs["A"] = heldConfig{"d", map[string]string{}, pb.TargetState_TARGET_PAUSED}
	w.configs["B"] = heldConfig{"d", map[string]string{}, pb.TargetState_TARGET_PAUSED}
	got, target := w.targetChange()
	if target != pb.TargetState_TARGET_PAUSED ||
		!reflect.DeepEqual(got, NewSet(ConnectorResource("A"), TaskResource("A", 0))) {
		t.Fatalf("got %v %v", got.Sorted(), target)
	}
	w.configs["A"] = heldConfig{"d", map[string]string{}, pb.TargetState_TARGET_STOPPED}
	w.configs["B"] = heldConfig{"d", map[string]string{}, pb.TargetState_TARGET_STARTED}
	got, target = w.targetChange()
	if target != pb.TargetState_TARGET_STOPPED || !reflect.DeepEqual(got, NewSet(ConnectorResource("A"))) {
		t.Fatalf("STOPPED names the connector only: got %v %v", got.Sorted(), target)
	}
}
