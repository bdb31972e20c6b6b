package worker

import (
	"sort"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
)

// AssignorName is the assignor this client advertises, versions [AssignorMinVersion,
// AssignorMaxVersion]: the Python agents advertise [1-2], which covers it, so whenever one is in
// the group, it computes (protos/README.md, "For client authors").
const (
	AssignorName       = "incremental_cooperative"
	AssignorMinVersion = 1
	AssignorMaxVersion = 1
)

// balance shares one kind of resource (keys) over the members, sticky and balanced: each member
// in order claims its previous share (what is still free), every member ends with the floor or
// the ceiling of len(all)/len(order), the members holding the most keep the ceilings, and what
// has to move goes, in key order, to the members in id order.
func balance(order []string, all []string, previous func(id string) []string) map[string][]string {
	free := map[string]bool{}
	for _, r := range all {
		free[r] = true
	}
	shares := map[string][]string{}
	for _, id := range order {
		share := []string{}
		for _, r := range previous(id) {
			if free[r] {
				delete(free, r)
				share = append(share, r)
			}
		}
		sort.Strings(share)
		shares[id] = share
	}
	floor := len(all) / len(order)
	ceilings := len(all) % len(order)
	byLoad := append([]string(nil), order...)
	sort.SliceStable(byLoad, func(i, j int) bool {
		a, b := byLoad[i], byLoad[j]
		if len(shares[a]) != len(shares[b]) {
			return len(shares[a]) > len(shares[b])
		}
		return a < b
	})
	quota := map[string]int{}
	for i, id := range byLoad {
		quota[id] = floor
		if i < ceilings {
			quota[id]++
		}
	}
	pool := []string{}
	for r := range free {
		pool = append(pool, r)
	}
	for _, id := range order {
		share := shares[id]
		for len(share) > quota[id] {
			pool = append(pool, share[len(share)-1])
			share = share[:len(share)-1]
		}
		shares[id] = share
	}
	sort.Strings(pool)
	ids := append([]string(nil), order...)
	sort.Strings(ids)
	for _, id := range ids {
		for len(shares[id]) < quota[id] {
			shares[id] = append(shares[id], pool[0])
			pool = pool[1:]
		}
	}
	return shares
}

func taskKey(connector string, task int32) string {
	return connector + "\x00" + itoa32(task)
}

func itoa32(n int32) string {
	// zero-padded so that keys sort by task number within a connector
	s := []byte("0000000000")
	for i := len(s) - 1; n > 0 && i >= 0; i-- {
		s[i] = byte('0' + n%10)
		n /= 10
	}
	return string(s)
}

// Assign computes the next target from a PrepareAssignment answer: one full share per member,
// sorted by member id. Members of the last target claim first (so a newcomer's stale owned list
// never wins); a member without a target share starts from what it owns.
func Assign(group *pb.ConnectGroupPrepareAssignmentResponse) []*pb.MemberAssignment {
	if len(group.Members) == 0 {
		return []*pb.MemberAssignment{}
	}
	target := map[string]*pb.ConnectorsAndTasks{}
	for _, m := range group.TargetAssignment {
		target[m.MemberId] = m.ConnectorsAndTasks
	}
	owned := map[string]*pb.ConnectorsAndTasks{}
	ids := []string{}
	for _, m := range group.Members {
		owned[m.MemberId] = m.ConnectorsAndTasks
		ids = append(ids, m.MemberId)
	}
	var inTarget, newcomers []string
	for _, id := range ids {
		if _, ok := target[id]; ok {
			inTarget = append(inTarget, id)
		} else {
			newcomers = append(newcomers, id)
		}
	}
	sort.Strings(inTarget)
	sort.Strings(newcomers)
	order := append(inTarget, newcomers...)
	start := func(id string) *pb.ConnectorsAndTasks {
		if t, ok := target[id]; ok {
			if t == nil {
				return &pb.ConnectorsAndTasks{}
			}
			return t
		}
		if o := owned[id]; o != nil {
			return o
		}
		return &pb.ConnectorsAndTasks{}
	}
	var allConnectors, allTasks []string
	taskOf := map[string]*pb.ConnectorTaskId{}
	for _, c := range group.Catalogue {
		allConnectors = append(allConnectors, c.Name)
		for n := int32(0); n < c.TaskCount; n++ {
			k := taskKey(c.Name, n)
			allTasks = append(allTasks, k)
			taskOf[k] = &pb.ConnectorTaskId{Connector: c.Name, Task: n}
		}
	}
	connectors := balance(order, allConnectors, func(id string) []string {
		return append([]string(nil), start(id).Connectors...)
	})
	tasks := balance(order, allTasks, func(id string) []string {
		out := []string{}
		for _, t := range start(id).Tasks {
			out = append(out, taskKey(t.Connector, t.Task))
		}
		return out
	})
	sorted := append([]string(nil), ids...)
	sort.Strings(sorted)
	out := make([]*pb.MemberAssignment, 0, len(sorted))
	for _, id := range sorted {
		cat := &pb.ConnectorsAndTasks{Connectors: append([]string{}, connectors[id]...)}
		for _, k := range tasks[id] {
			cat.Tasks = append(cat.Tasks, taskOf[k])
		}
		out = append(out, &pb.MemberAssignment{
			MemberId: id, ConnectorsAndTasks: cat, Version: group.AssignorVersion,
		})
	}
	return out
}
