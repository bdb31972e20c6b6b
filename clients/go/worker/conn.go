package worker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	pb "example.com/connectgroup/gen/go/connect/group/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// IsLoopback says whether a host:port (or [v6]:port, or a bare host) names this machine only.
func IsLoopback(address string) bool {
	if i := strings.LastIndex(address, "///"); i >= 0 {
		address = address[i+3:]
	}
	host := address
	if h, _, err := net.SplitHostPort(address); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// dialOption is the transport for address: TLS when a CA or a client certificate is configured
// (the files are read at every connect, so a rotated certificate is used from the next
// reconnect on), plaintext otherwise, which goes only to loopback addresses unless
// AllowPlaintext.
func (o *Options) dialOption(address string) (grpc.DialOption, error) {
	if o.TLSCA != "" || o.TLSCert != "" || o.TLSKey != "" {
		if (o.TLSCert == "") != (o.TLSKey == "") {
			return nil, errors.New("a client certificate needs both --tls-cert and --tls-key")
		}
		cfg := &tls.Config{ServerName: o.TLSServerName, MinVersion: tls.VersionTLS12}
		if o.TLSCA != "" {
			pem, err := os.ReadFile(o.TLSCA)
			if err != nil {
				return nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s: no PEM certificate in it", o.TLSCA)
			}
			cfg.RootCAs = pool
		}
		if o.TLSCert != "" {
			pair, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
			if err != nil {
				return nil, err
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
	}
	if !o.AllowPlaintext && !IsLoopback(address) {
		return nil, fmt.Errorf("%s is not a loopback address and no TLS is configured; "+
			"pass --tls-ca (and --tls-cert/--tls-key for mTLS), or --allow-plaintext", address)
	}
	return grpc.WithInsecure(), nil
}

// dial opens a channel to address with both message size limits set (a large group's Prepare
// answer exceeds gRPC's 4 MiB default).
func (o *Options) dial(address string) (*grpc.ClientConn, error) {
	creds, err := o.dialOption(address)
	if err != nil {
		return nil, err
	}
	return grpc.Dial(address, creds, grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(o.MaxMessageBytes), grpc.MaxCallSendMsgSize(o.MaxMessageBytes)))
}

// conn is one coordinator connection.
type conn struct {
	address     string
	cc          *grpc.ClientConn
	coordinator pb.ConnectGroupCoordinatorClient
}

func (o *Options) connect(address string) (*conn, error) {
	cc, err := o.dial(address)
	if err != nil {
		return nil, err
	}
	return &conn{address: address, cc: cc, coordinator: pb.NewConnectGroupCoordinatorClient(cc)}, nil
}
