package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestExecHookContract(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	hook, err := NewExecHook(`sh -c 'cat > "$0"; echo "$WORKER_AGENT_EVENT $WORKER_AGENT_MEMBER_EPOCH" >> "$0"' `+out, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e := &Event{Event: "revoked", GroupID: "g", MemberID: "m", MemberEpoch: 5,
		Resources: NewSet(ConnectorResource("A")), FencingTokens: TokensOf(Set{}, nil)}
	if err := hook.Handle(e); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(out)
	if !strings.HasPrefix(string(data), `{"connectors":["A"],"event":"revoked"`) ||
		!strings.HasSuffix(string(data), "}\nrevoked 5\n") {
		t.Fatalf("the hook read %q", data)
	}
}

func TestExecHookFailureMasksConfigValues(t *testing.T) {
	hook, _ := NewExecHook(`sh -c 'echo "bad secret-value here" >&2; exit 4'`, time.Second)
	e := &Event{Event: "assigned", Resources: NewSet(ConnectorResource("A")),
		Configs: map[string]ConfigJSON{"A": {Digest: "d", Config: map[string]string{"k": "secret-value"}}}}
	err := hook.Handle(e)
	herr, ok := err.(*HookError)
	if !ok || herr.ExitCode != 4 || !strings.Contains(herr.Message, "exited with 4") ||
		!strings.HasSuffix(herr.Message, "; stderr: bad *** here") {
		t.Fatalf("got %v", err)
	}
}

func TestExecHookTimeoutKillsItsProcessGroup(t *testing.T) {
	hook, _ := NewExecHook(`sh -c 'sleep 30 & sleep 30'`, 200*time.Millisecond)
	start := time.Now()
	err := hook.Handle(&Event{Event: "revoked", Resources: Set{}})
	herr, ok := err.(*HookError)
	if !ok || !herr.TimedOut {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("took %v", time.Since(start))
	}
}
