// Command connect-group-worker is a worker for the connect.group.v1 coordinator whose work is an
// exec hook with the Python agent's JSON contract (see ../../README.md).
package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"example.com/connectgroup/worker"
)

// version is this client's version.
const version = "0.1.0"

func env(name, fallback string) string {
	if v, ok := os.LookupEnv("CONNECT_GROUP_" + name); ok && v != "" {
		return v
	}
	return fallback
}

// defaultMemberID is the host name plus a random suffix, fresh per process (a member id must
// belong to one process).
func defaultMemberID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	suffix := make([]byte, 6)
	if _, err := rand.Read(suffix); err != nil {
		suffix = []byte(strconv.FormatInt(time.Now().UnixNano(), 16))
	}
	return host + "-" + hex.EncodeToString(suffix)
}

const usage = `usage: connect-group-worker --coordinator HOST:PORT[,HOST:PORT...] --group G
    [--member-id ID] [--instance-id ID] [--url URL] [--rebalance-timeout-ms 60000]
    [--rpc-timeout-ms 5000] [--max-message-bytes N] [--exec-hook CMD] [--hook-timeout-s 30]
    [--tls-ca F] [--tls-cert F --tls-key F] [--tls-server-name N] [--allow-plaintext]
    [--version] [--help]

Environment (the flags win): CONNECT_GROUP_COORDINATOR, _GROUP, _MEMBER_ID, _INSTANCE_ID, _URL,
_MAX_MESSAGE_BYTES, _EXEC_HOOK, _TLS_CA, _TLS_CERT, _TLS_KEY, _TLS_SERVER_NAME,
_ALLOW_PLAINTEXT=1 (all CONNECT_GROUP_ prefixed).

Exit codes: 0 left the group (SIGTERM/SIGINT), 1 a second signal or a crash, 2 bad flags,
3 a fatal error (after stopping everything).

Flags:
`

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("connect-group-worker", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	coordinator := fs.String("coordinator", env("COORDINATOR", "127.0.0.1:9093"),
		"coordinator addresses; the first is used, all are asked by FindCoordinator")
	group := fs.String("group", env("GROUP", "connect-cluster"), "group id")
	memberID := fs.String("member-id", env("MEMBER_ID", ""),
		"member id (default: host name plus a random suffix, fresh per process)")
	instanceID := fs.String("instance-id", env("INSTANCE_ID", ""),
		"static membership: leave with epoch -2")
	url := fs.String("url", env("URL", ""), "this worker's URL (sent when set)")
	rebalanceTimeout := fs.Int("rebalance-timeout-ms", 60000, "rebalance timeout")
	rpcTimeout := fs.Int("rpc-timeout-ms", 5000, "deadline of each call")
	maxBytes, err := strconv.Atoi(env("MAX_MESSAGE_BYTES", strconv.Itoa(worker.DefaultMaxMessageBytes)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect-group-worker: CONNECT_GROUP_MAX_MESSAGE_BYTES must be a number")
		return 2
	}
	maxMessageBytes := fs.Int("max-message-bytes", maxBytes,
		"largest message sent or received (as the coordinator's --max-message-bytes)")
	execHook := fs.String("exec-hook", env("EXEC_HOOK", ""),
		"command run once per start or stop, the event's JSON on its standard input")
	hookTimeout := fs.Float64("hook-timeout-s", 30, "a hook call running longer is killed and failed")
	tlsCA := fs.String("tls-ca", env("TLS_CA", ""), "CA file to verify the coordinator")
	tlsCert := fs.String("tls-cert", env("TLS_CERT", ""), "client certificate (mTLS)")
	tlsKey := fs.String("tls-key", env("TLS_KEY", ""), "client key (mTLS)")
	tlsServerName := fs.String("tls-server-name", env("TLS_SERVER_NAME", ""),
		"the name to verify in the coordinator's certificate")
	allowPlaintext := fs.Bool("allow-plaintext", env("ALLOW_PLAINTEXT", "") != "",
		"allow plaintext to addresses other than loopback")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "connect-group-worker: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *showVersion {
		fmt.Println("connect-group-worker " + version)
		return 0
	}
	if *memberID == "" {
		*memberID = defaultMemberID()
	}
	var coordinators []string
	for _, a := range strings.Split(*coordinator, ",") {
		if a = strings.TrimSpace(a); a != "" {
			coordinators = append(coordinators, a)
		}
	}
	o := worker.Options{
		Coordinators:       coordinators,
		GroupID:            *group,
		MemberID:           *memberID,
		InstanceID:         *instanceID,
		RebalanceTimeoutMs: int32(*rebalanceTimeout),
		RPCTimeout:         time.Duration(*rpcTimeout) * time.Millisecond,
		MaxMessageBytes:    *maxMessageBytes,
		TLSCA:              *tlsCA,
		TLSCert:            *tlsCert,
		TLSKey:             *tlsKey,
		TLSServerName:      *tlsServerName,
		AllowPlaintext:     *allowPlaintext,
	}
	if *url != "" {
		o.URL = url
	}
	var hook *worker.ExecHook
	if *execHook != "" {
		hook, err = worker.NewExecHook(*execHook, time.Duration(*hookTimeout*float64(time.Second)))
		if err != nil {
			fmt.Fprintln(os.Stderr, "connect-group-worker: --exec-hook:", err)
			return 2
		}
		o.Listener = hook
	}
	w, err := worker.New(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect-group-worker:", err)
		return 2
	}
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		w.Leave()
		s := <-signals
		name := "SIGINT"
		if s == syscall.SIGTERM {
			name = "SIGTERM"
		}
		// The hooks run in their own sessions: left running, they would keep a resource going
		// that no member owns or watches.
		killed := 0
		if hook != nil {
			killed = hook.KillAll()
		}
		w.Log("exit", map[string]interface{}{
			"reason": name + " again: giving up without leaving", "hooks_killed": killed})
		os.Exit(1)
	}()
	return w.Run()
}
