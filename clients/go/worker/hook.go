package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// ConfigJSON is one connector's config as a hook event carries it.
type ConfigJSON struct {
	Digest string            `json:"digest"`
	Config map[string]string `json:"config"`
}

// Event is what a Listener is handed: the agent's RebalanceEvent.to_json object (DESIGN 2.3).
// This worker starts and stops one resource at a time, so each assigned and revoked event names
// one resource; a reconfigured, paused, resumed or stopped event names the running resources of
// one connector.
type Event struct {
	Event         string // assigned, revoked, reconfigured, paused, resumed, stopped
	GroupID       string
	MemberID      string
	MemberEpoch   int32
	Resources     Set
	FencingTokens TokensJSON
	// Configs and TargetStates ("STARTED", "PAUSED", "STOPPED"), per connector of the
	// resources: on assigned, reconfigured, paused, resumed and stopped events only.
	Configs      map[string]ConfigJSON
	TargetStates map[string]string
	Reason       string // "restart", or empty
}

// configEvents are the events that carry configs and target states (as the agent's).
var configEvents = map[string]bool{
	"assigned": true, "reconfigured": true, "paused": true, "resumed": true, "stopped": true,
}

// MarshalJSON writes the agent's object: lists sorted, configs only on config events, reason
// only when there is one.
func (e *Event) MarshalJSON() ([]byte, error) {
	connectors, tasks := e.Resources.Split()
	out := map[string]interface{}{
		"event":          e.Event,
		"group_id":       e.GroupID,
		"member_id":      e.MemberID,
		"member_epoch":   e.MemberEpoch,
		"connectors":     connectors,
		"tasks":          tasks,
		"fencing_tokens": e.FencingTokens,
	}
	if configEvents[e.Event] {
		configs := e.Configs
		if configs == nil {
			configs = map[string]ConfigJSON{}
		}
		states := e.TargetStates
		if states == nil {
			states = map[string]string{}
		}
		out["configs"] = configs
		out["target_states"] = states
	}
	if e.Reason != "" {
		out["reason"] = e.Reason
	}
	return json.Marshal(out)
}

// Listener does the work: starts and stops resources. Handle returns only once the event's work
// is done; an error is a failure (see the worker for what each failure means).
type Listener interface {
	Handle(e *Event) error
}

// HookError is an exec hook call that did not succeed; its message is a FAILED status's trace.
type HookError struct {
	Message  string
	ExitCode int // -1: killed, timed out or not started
	TimedOut bool
}

func (e *HookError) Error() string { return e.Message }

const tailBytes = 2000
const minMaskedValue = 4

// ExecHook runs a command once per event, with the event's JSON (and a newline) on its standard
// input, in a new session (its own process group). Exit 0 is success; a non-zero exit, a
// signal, a command that cannot start, or running past Timeout (the whole process group is then
// killed) is a HookError naming the exit code and the end of standard error, config values
// masked. Standard input, output and error are temporary files: a hook that leaves a
// background process behind is done when it exits.
type ExecHook struct {
	Argv    []string
	Timeout time.Duration

	// The process groups of the hooks running now. A hook runs in its own session, so it
	// outlives this process: KillAll kills them when the process exits without stopping its
	// work (a second signal), else they would go on running a resource nobody watches.
	mu     sync.Mutex
	groups map[int]struct{}
	killed bool // KillAll ran: a hook that starts after it is killed at once
}

// NewExecHook splits command like a POSIX shell word list (no shell runs).
func NewExecHook(command string, timeout time.Duration) (*ExecHook, error) {
	argv, err := ShellSplit(command)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, errors.New("an exec hook needs a command")
	}
	if timeout <= 0 {
		return nil, errors.New("the hook timeout must be positive")
	}
	return &ExecHook{Argv: argv, Timeout: timeout}, nil
}

// Handle runs the hook for e.
func (h *ExecHook) Handle(e *Event) error {
	command := strings.Join(h.Argv, " ")
	body, err := json.Marshal(e)
	if err != nil {
		return &HookError{Message: fmt.Sprintf("exec hook %q: %v", command, err), ExitCode: -1}
	}
	stdin, err := os.CreateTemp("", "connect-group-hook-")
	if err != nil {
		return &HookError{Message: fmt.Sprintf("exec hook %q: %v", command, err), ExitCode: -1}
	}
	defer stdin.Close()
	os.Remove(stdin.Name())
	stdout, err := os.CreateTemp("", "connect-group-hook-")
	if err != nil {
		return &HookError{Message: fmt.Sprintf("exec hook %q: %v", command, err), ExitCode: -1}
	}
	defer stdout.Close()
	os.Remove(stdout.Name())
	stderr, err := os.CreateTemp("", "connect-group-hook-")
	if err != nil {
		return &HookError{Message: fmt.Sprintf("exec hook %q: %v", command, err), ExitCode: -1}
	}
	defer stderr.Close()
	os.Remove(stderr.Name())
	if _, err := stdin.Write(append(body, '\n')); err != nil {
		return &HookError{Message: fmt.Sprintf("exec hook %q: %v", command, err), ExitCode: -1}
	}
	if _, err := stdin.Seek(0, io.SeekStart); err != nil {
		return &HookError{Message: fmt.Sprintf("exec hook %q: %v", command, err), ExitCode: -1}
	}

	cmd := exec.Command(h.Argv[0], h.Argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.Env = append(os.Environ(),
		"WORKER_AGENT_EVENT="+e.Event,
		"WORKER_AGENT_GROUP_ID="+e.GroupID,
		"WORKER_AGENT_MEMBER_ID="+e.MemberID,
		"WORKER_AGENT_MEMBER_EPOCH="+strconv.Itoa(int(e.MemberEpoch)),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return &HookError{
			Message:  fmt.Sprintf("exec hook %q could not start: %v", command, err),
			ExitCode: -1,
		}
	}
	pgid := cmd.Process.Pid // Setsid: the hook leads its own process group
	h.track(pgid)
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		// Forgotten right after the hook is reaped: its pid (the group's id) may be reused once
		// the group is empty, and KillAll must not hit another process's group.
		h.untrack(pgid)
		done <- err
	}()
	timer := time.NewTimer(h.Timeout)
	defer timer.Stop()
	var waitErr error
	select {
	case waitErr = <-done:
	case <-timer.C:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		tail := maskValues(tailOf(stderr), e.Configs)
		msg := fmt.Sprintf("exec hook %q (%s) still running after %g s; killed its process group",
			command, e.Event, h.Timeout.Seconds())
		if tail != "" {
			msg += "; stderr: " + tail
		}
		return &HookError{Message: msg, ExitCode: -1, TimedOut: true}
	}
	if waitErr == nil {
		return nil
	}
	tail := maskValues(tailOf(stderr), e.Configs)
	how := waitErr.Error()
	code := -1
	var exitErr *exec.ExitError
	if errors.As(waitErr, &exitErr) {
		if status, ok := exitErr.Sys().(syscall.WaitStatus); ok && status.Signaled() {
			how = fmt.Sprintf("was killed by signal %d", int(status.Signal()))
		} else {
			code = exitErr.ExitCode()
			how = fmt.Sprintf("exited with %d", code)
		}
	}
	msg := fmt.Sprintf("exec hook %q (%s) %s", command, e.Event, how)
	if tail != "" {
		msg += "; stderr: " + tail
	}
	return &HookError{Message: msg, ExitCode: code}
}

// track notes a started hook's process group; after KillAll it is killed at once (a hook that
// started while KillAll ran would escape it).
func (h *ExecHook) track(pgid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.killed {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	if h.groups == nil {
		h.groups = map[int]struct{}{}
	}
	h.groups[pgid] = struct{}{}
}

// untrack forgets a reaped hook's process group.
func (h *ExecHook) untrack(pgid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.groups, pgid)
}

// KillAll sends SIGKILL to the process group of every hook running now, and of any hook
// started later; it returns how many groups it signalled. For a process about to exit without
// stopping its work: the hooks run in their own sessions and would outlive it. (A background
// process that a finished hook left behind is not tracked: it is the hook's to manage.)
func (h *ExecHook) KillAll() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.killed = true
	for pgid := range h.groups {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	return len(h.groups)
}

// tailOf is the last tailBytes of f, trimmed, "..." in front when cut.
func tailOf(f *os.File) string {
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return ""
	}
	from := size - tailBytes
	if from < 0 {
		from = 0
	}
	buf := make([]byte, size-from)
	if _, err := f.ReadAt(buf, from); err != nil && err != io.EOF {
		return ""
	}
	if from > 0 {
		// The window may open inside a character: start at the next one, not at a U+FFFD.
		for i := 0; i < utf8.UTFMax-1 && len(buf) > 0 && !utf8.RuneStart(buf[0]); i++ {
			buf = buf[1:]
		}
	}
	text := strings.TrimSpace(strings.ToValidUTF8(string(buf), "\uFFFD"))
	if from > 0 {
		return "..." + text
	}
	return text
}

// maskValues replaces the config values of configs (at least minMaskedValue characters long,
// longest first) in text with "***": hook output goes to logs and status traces.
func maskValues(text string, configs map[string]ConfigJSON) string {
	if text == "" || len(configs) == 0 {
		return text
	}
	seen := map[string]bool{}
	values := []string{}
	for _, held := range configs {
		for _, v := range held.Config {
			if len(v) >= minMaskedValue && !seen[v] {
				seen[v] = true
				values = append(values, v)
			}
		}
	}
	sort.Slice(values, func(i, j int) bool { return len(values[i]) > len(values[j]) })
	for _, v := range values {
		text = strings.ReplaceAll(text, v, "***")
	}
	return text
}

// ShellSplit splits text into words as a POSIX shell would, without expansions (Python's
// shlex.split): blanks separate words, '...' is literal, "..." keeps blanks and takes a
// backslash before \ " $ ` or a newline, and a backslash outside quotes takes the next
// character literally.
func ShellSplit(text string) ([]string, error) {
	words := []string{}
	var word strings.Builder
	inWord := false
	rs := []rune(text)
	for i := 0; i < len(rs); {
		c := rs[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
			i++
		case c == '\'':
			end := -1
			for j := i + 1; j < len(rs); j++ {
				if rs[j] == '\'' {
					end = j
					break
				}
			}
			if end < 0 {
				return nil, fmt.Errorf("no closing quotation in %q", text)
			}
			word.WriteString(string(rs[i+1 : end]))
			inWord = true
			i = end + 1
		case c == '"':
			inWord = true
			i++
			for {
				if i >= len(rs) {
					return nil, fmt.Errorf("no closing quotation in %q", text)
				}
				d := rs[i]
				if d == '"' {
					break
				}
				if d == '\\' && i+1 < len(rs) && strings.ContainsRune("\\\"$`\n", rs[i+1]) {
					if rs[i+1] != '\n' {
						word.WriteRune(rs[i+1])
					}
					i += 2
					continue
				}
				word.WriteRune(d)
				i++
			}
			i++
		case c == '\\':
			if i+1 >= len(rs) {
				return nil, fmt.Errorf("no escaped character in %q", text)
			}
			if rs[i+1] != '\n' {
				word.WriteRune(rs[i+1])
				inWord = true
			}
			i += 2
		default:
			word.WriteRune(c)
			inWord = true
			i++
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words, nil
}
