// COMPUTE_ASSIGNMENT: Prepare, assign, Install, once per group epoch, while heartbeats go on.

package worker

import (
	pb "example.com/connectgroup/gen/go/connect/group/v1"
)

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
