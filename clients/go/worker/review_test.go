package worker

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
	"google.golang.org/protobuf/proto"
)

// The literal is what Key returned when it was built with repeated += (before the builder).
func TestSetKeyUnchanged(t *testing.T) {
	s := NewSet(TaskResource("b", 1), ConnectorResource("a"), TaskResource("a", 10),
		TaskResource("a", 2), ConnectorResource(`q"x`), ConnectorResource("é"))
	if got, want := s.Key(), `"a":-1;"a":2;"a":10;"b":1;"q\"x":-1;"é":-1;`; got != want {
		t.Fatalf("Key is %q, was %q", got, want)
	}
	if key := (Set{}).Key(); key != "" {
		t.Fatalf("the empty set's key is %q", key)
	}
}

// 20,000 resources: quadratic copying made this take seconds; now it is one buffer.
func TestSetKeyLarge(t *testing.T) {
	s := Set{}
	for c := 0; c < 20; c++ {
		name := "connector-" + strconv.Itoa(c)
		s.Add(ConnectorResource(name))
		for n := int32(0); n < 999; n++ {
			s.Add(TaskResource(name, n))
		}
	}
	key := s.Key()
	if strings.Count(key, ";") != 20000 || !strings.HasPrefix(key, `"connector-0":-1;"connector-0":0;`) {
		t.Fatalf("a key of %d bytes: %.80q...", len(key), key)
	}
}

func TestCleanTraceDropsNULAndInvalidUTF8(t *testing.T) {
	if got := cleanTrace("a\x00b\x00"); got != "ab" {
		t.Fatalf("NULs: %q", got)
	}
	if got := cleanTrace("bad \xff\xfe byte"); got != "bad \uFFFD byte" {
		t.Fatalf("invalid UTF-8: %q", got)
	}
	if got := cleanTrace("ok é €"); got != "ok é €" {
		t.Fatalf("a valid trace changed: %q", got)
	}
	// The bytes protobuf refuses: a trace as sent must marshal.
	raw := "stderr: \xc3"
	if _, err := proto.Marshal(&pb.StatusEntry{Connector: "A", Trace: raw}); err == nil {
		t.Fatalf("protobuf marshalled invalid UTF-8 (the test no longer shows the failure)")
	}
	if _, err := proto.Marshal(&pb.StatusEntry{Connector: "A", Trace: cleanTrace(raw)}); err != nil {
		t.Fatal(err)
	}
}

func TestCleanTraceCutsOnACharacterBoundary(t *testing.T) {
	// 3-byte characters: maxTraceChars (16,384) falls inside one.
	long := strings.Repeat("€", maxTraceChars)
	got := cleanTrace(long)
	if !utf8.ValidString(got) || len(got) > maxTraceChars || len(got) < maxTraceChars-3 ||
		strings.ContainsRune(got, utf8.RuneError) {
		t.Fatalf("cut to %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	// A trace already cut inside a character (traceOf cuts bytes): the piece becomes U+FFFD.
	got = cleanTrace(long[:maxTraceChars])
	if !utf8.ValidString(got) || len(got) > maxTraceChars {
		t.Fatalf("cut to %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	// Invalid bytes grow by the replacement: still cut to the limit.
	got = cleanTrace(strings.Repeat("\xff", maxTraceChars))
	if !utf8.ValidString(got) || len(got) > maxTraceChars {
		t.Fatalf("cut to %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}

// statusWorker holds n running resources with a status each.
func statusWorker(n int, trace string) *Worker {
	w := &Worker{running: Set{}, starting: Set{}, tokens: map[Resource]int64{},
		statuses: map[Resource]status{}, reported: map[Resource]reportedStatus{}}
	for i := 0; i < n; i++ {
		r := TaskResource("A", int32(i))
		w.running.Add(r)
		w.tokens[r] = 7
		w.statuses[r] = status{pb.ResourceState_FAILED, trace}
	}
	return w
}

func TestStatusChangesCapsEntriesAndCleansTraces(t *testing.T) {
	w := statusWorker(2500, "boom\x00 \xff")
	entries, keys := w.statusChanges()
	if len(entries) != maxStatusEntries || len(keys) != maxStatusEntries {
		t.Fatalf("%d entries in one call", len(entries))
	}
	if entries[0].Trace != "boom \uFFFD" || *entries[0].Task != 0 ||
		*entries[maxStatusEntries-1].Task != maxStatusEntries-1 {
		t.Fatalf("first entry %v, last %v", entries[0], entries[maxStatusEntries-1])
	}
	// As report records them once answered: the rest follow, and nothing is sent twice.
	sent := 0
	for len(entries) > 0 {
		sent += len(entries)
		for i, e := range entries {
			w.reported[keys[i]] = reportedStatus{e.State, e.Trace, e.FencingToken}
		}
		entries, keys = w.statusChanges()
	}
	if sent != 2500 {
		t.Fatalf("%d entries sent in all", sent)
	}
}

// liveInGroup lists the processes of group pgid that are not zombies (a killed hook's child,
// reparented, may wait for a reaper that a container does not run).
func liveInGroup(pgid int) []string {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	live := []string{}
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // gone
		}
		text := string(data)
		fields := strings.Fields(text[strings.LastIndexByte(text, ')')+1:])
		if len(fields) < 3 || fields[0] == "Z" || fields[0] == "X" {
			continue
		}
		if fields[2] == strconv.Itoa(pgid) {
			live = append(live, path)
		}
	}
	return live
}

func TestExecHookKillAllKillsRunningHooks(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	hook, _ := NewExecHook(`sh -c 'echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; sleep 30 & wait' `+pidFile,
		time.Minute)
	done := make(chan error, 1)
	go func() { done <- hook.Handle(&Event{Event: "assigned", Resources: Set{}}) }()
	pgid := 0
	for deadline := time.Now().Add(5 * time.Second); pgid == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the hook did not start")
		}
		if data, err := os.ReadFile(pidFile); err == nil {
			pgid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		}
	}
	if len(liveInGroup(pgid)) < 2 {
		t.Fatalf("the hook's group %d: %v", pgid, liveInGroup(pgid))
	}
	if n := hook.KillAll(); n != 1 {
		t.Fatalf("KillAll signalled %d groups", n)
	}
	select {
	case err := <-done:
		if herr, ok := err.(*HookError); !ok || !strings.Contains(herr.Message, "killed by signal 9") {
			t.Fatalf("got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the hook still runs after KillAll")
	}
	for deadline := time.Now().Add(5 * time.Second); len(liveInGroup(pgid)) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("still in group %d: %v", pgid, liveInGroup(pgid))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if hook.KillAll() != 0 {
		t.Fatal("a reaped hook is still tracked")
	}
	// A hook that starts after KillAll is killed at once.
	start := time.Now()
	err := hook.Handle(&Event{Event: "assigned", Resources: Set{}})
	if _, ok := err.(*HookError); !ok || time.Since(start) > 5*time.Second {
		t.Fatalf("a hook after KillAll: %v after %v", err, time.Since(start))
	}
}

func TestTailOfStartsOnACharacter(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// 2,001 bytes of 3-byte characters after one byte: the window opens inside one.
	if _, err := f.WriteString("x" + strings.Repeat("€", 1000)); err != nil {
		t.Fatal(err)
	}
	got := tailOf(f)
	if !strings.HasPrefix(got, "...€") || strings.ContainsRune(got, utf8.RuneError) {
		t.Fatalf("tail %.20q", got)
	}
}
