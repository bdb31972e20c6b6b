package worker

import (
	"sort"
	"strconv"
	"strings"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
)

// Resource is a connector (Task < 0) or one of its tasks.
type Resource struct {
	Connector string
	Task      int32
}

// ConnectorResource is the connector itself as a resource.
func ConnectorResource(name string) Resource { return Resource{Connector: name, Task: -1} }

// TaskResource is task n of connector name.
func TaskResource(name string, n int32) Resource { return Resource{Connector: name, Task: n} }

// IsTask says whether r is a task (else the connector itself).
func (r Resource) IsTask() bool { return r.Task >= 0 }

// String is "A" for a connector, "A-0" for a task.
func (r Resource) String() string {
	if r.IsTask() {
		return r.Connector + "-" + strconv.Itoa(int(r.Task))
	}
	return r.Connector
}

// less orders connectors before their tasks, then by name, then by task number.
func less(a, b Resource) bool {
	if a.Connector != b.Connector {
		return a.Connector < b.Connector
	}
	return a.Task < b.Task
}

// Set is a set of resources.
type Set map[Resource]struct{}

// NewSet holds the given resources.
func NewSet(rs ...Resource) Set {
	s := Set{}
	for _, r := range rs {
		s[r] = struct{}{}
	}
	return s
}

// Has says whether r is in s.
func (s Set) Has(r Resource) bool { _, ok := s[r]; return ok }

// Add puts r in s.
func (s Set) Add(r Resource) { s[r] = struct{}{} }

// Sorted lists s in order (connectors, then tasks, by name).
func (s Set) Sorted() []Resource {
	out := make([]Resource, 0, len(s))
	for r := range s {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return less(out[i], out[j]) })
	return out
}

// Minus is s without what b holds.
func (s Set) Minus(b Set) Set {
	out := Set{}
	for r := range s {
		if !b.Has(r) {
			out.Add(r)
		}
	}
	return out
}

// Union is what s or b holds.
func (s Set) Union(b Set) Set {
	out := Set{}
	for r := range s {
		out.Add(r)
	}
	for r := range b {
		out.Add(r)
	}
	return out
}

// Key is a string that two sets share exactly when they hold the same resources. It runs on
// the loop several times per heartbeat, so it is built in one buffer: appending to a string
// copies it each time, quadratic in a set of thousands of resources.
func (s Set) Key() string {
	var key strings.Builder
	for _, r := range s.Sorted() {
		key.WriteString(strconv.Quote(r.Connector))
		key.WriteByte(':')
		key.WriteString(strconv.Itoa(int(r.Task)))
		key.WriteByte(';')
	}
	return key.String()
}

// SetOf reads a ConnectorsAndTasks (nil: empty).
func SetOf(cat *pb.ConnectorsAndTasks) Set {
	s := Set{}
	if cat == nil {
		return s
	}
	for _, c := range cat.Connectors {
		s.Add(ConnectorResource(c))
	}
	for _, t := range cat.Tasks {
		s.Add(TaskResource(t.Connector, t.Task))
	}
	return s
}

// Proto is s as a ConnectorsAndTasks, sorted (never nil: present, maybe empty).
func (s Set) Proto() *pb.ConnectorsAndTasks {
	out := &pb.ConnectorsAndTasks{Connectors: []string{}, Tasks: []*pb.ConnectorTaskId{}}
	for _, r := range s.Sorted() {
		if r.IsTask() {
			out.Tasks = append(out.Tasks, &pb.ConnectorTaskId{Connector: r.Connector, Task: r.Task})
		} else {
			out.Connectors = append(out.Connectors, r.Connector)
		}
	}
	return out
}

// TaskJSON is a task as JSON lines and hook events carry it.
type TaskJSON struct {
	Connector string `json:"connector"`
	Task      int32  `json:"task"`
}

// TaskTokenJSON is a task's fencing token as JSON.
type TaskTokenJSON struct {
	Connector string `json:"connector"`
	Task      int32  `json:"task"`
	Token     int64  `json:"token"`
}

// TokensJSON is the agent's fencing_tokens shape: {connectors: {name: token}, tasks: [...]}.
type TokensJSON struct {
	Connectors map[string]int64 `json:"connectors"`
	Tasks      []TaskTokenJSON  `json:"tasks"`
}

// Split lists s's connectors and tasks, sorted, as JSON carries them (never nil).
func (s Set) Split() ([]string, []TaskJSON) {
	connectors, tasks := []string{}, []TaskJSON{}
	for _, r := range s.Sorted() {
		if r.IsTask() {
			tasks = append(tasks, TaskJSON{r.Connector, r.Task})
		} else {
			connectors = append(connectors, r.Connector)
		}
	}
	return connectors, tasks
}

// TokensOf is the tokens of s's resources among tokens, as JSON.
func TokensOf(s Set, tokens map[Resource]int64) TokensJSON {
	out := TokensJSON{Connectors: map[string]int64{}, Tasks: []TaskTokenJSON{}}
	for _, r := range s.Sorted() {
		token, ok := tokens[r]
		if !ok {
			continue
		}
		if r.IsTask() {
			out.Tasks = append(out.Tasks, TaskTokenJSON{r.Connector, r.Task, token})
		} else {
			out.Connectors[r.Connector] = token
		}
	}
	return out
}

// tokensFrom reads an assignment's fencing tokens (a token's task is ABSENT for the connector).
func tokensFrom(list []*pb.FencingToken) map[Resource]int64 {
	out := map[Resource]int64{}
	for _, t := range list {
		if t.Task != nil {
			out[TaskResource(t.Connector, *t.Task)] = t.Token
		} else {
			out[ConnectorResource(t.Connector)] = t.Token
		}
	}
	return out
}

// restartCountsFrom reads a ConnectGroupConfigs answer's restart counts.
func restartCountsFrom(list []*pb.RestartCount) map[Resource]int64 {
	out := map[Resource]int64{}
	for _, c := range list {
		if c.Task != nil {
			out[TaskResource(c.Connector, *c.Task)] = c.RestartCount
		} else {
			out[ConnectorResource(c.Connector)] = c.RestartCount
		}
	}
	return out
}
