package worker

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"
)

// protoCodec is gRPC's "proto" codec on google.golang.org/protobuf (APIv2). grpc-go 1.33's own
// codec goes through github.com/golang/protobuf, which Debian ships at v1.3 (golang-github-
// golang-protobuf-1-3-dev): that version cannot read the APIv2 messages protoc-gen-go 1.28
// generates. Registering this one under the same name replaces it; with a module build
// (github.com/golang/protobuf >= 1.4) it behaves the same as the one it replaces.
type protoCodec struct{}

func (protoCodec) Marshal(v interface{}) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("proto codec: %T is not a proto.Message", v)
	}
	return proto.Marshal(m)
}

func (protoCodec) Unmarshal(data []byte, v interface{}) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("proto codec: %T is not a proto.Message", v)
	}
	return proto.Unmarshal(data, m)
}

func (protoCodec) Name() string { return "proto" }

func init() { encoding.RegisterCodec(protoCodec{}) }
