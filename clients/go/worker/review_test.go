package worker

import (
	"strconv"
	"strings"
	"testing"
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
