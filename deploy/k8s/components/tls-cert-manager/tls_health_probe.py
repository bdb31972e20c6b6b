"""The coordinator's kubelet probe when it serves TLS and requires client certificates.

The kubelet's native gRPC probe speaks plaintext only, so it cannot check a coordinator that
serves TLS. This exec probe runs inside the coordinator's container and asks the standard
grpc.health.v1.Health service over TLS, on the pod's loopback, presenting the coordinator's own
certificate as its client certificate (issued for server and client auth by the same CA the
coordinator trusts for clients), and verifying the server's certificate for the fixed name given
with --server-name (the loopback address is in no certificate).

Everything else comes from the container's environment, which an exec probe inherits:
COORDINATOR_HOST and COORDINATOR_PORT (where to connect), COORDINATOR_TLS_CERT,
COORDINATOR_TLS_KEY and COORDINATOR_TLS_CLIENT_CA (the files; the CA verifies the server too).
The files are read at every run, so a rotated certificate is what the next probe presents.

Exit status 0 when the service answers SERVING, 1 otherwise (the reason on stdout, which the
kubelet records in the pod's events).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys


def target(host: str, port: str) -> str:
    """The address to dial for a server listening on `host`: the loopback for a wildcard."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    return f"{host}:{port}"


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main(argv: list[str] | None = None) -> int:
    env = os.environ
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-name", required=True, help="name to verify in the certificate")
    parser.add_argument("--service", default="", help='service to check ("" = the server)')
    parser.add_argument("--timeout-s", type=float, default=3.0)
    parser.add_argument("--ca", default=env.get("COORDINATOR_TLS_CLIENT_CA", ""))
    parser.add_argument("--cert", default=env.get("COORDINATOR_TLS_CERT", ""))
    parser.add_argument("--key", default=env.get("COORDINATOR_TLS_KEY", ""))
    args = parser.parse_args(argv)
    address = target(env.get("COORDINATOR_HOST", "0.0.0.0"), env.get("COORDINATOR_PORT", "9093"))

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        credentials = grpc.ssl_channel_credentials(
            read(args.ca) if args.ca else None,
            read(args.key) if args.key else None,
            read(args.cert) if args.cert else None,
        )
    except OSError as error:
        print(f"cannot read the TLS files: {error}")
        return 1
    options = [
        ("grpc.ssl_target_name_override", args.server_name),
        ("grpc.enable_http_proxy", 0),
    ]
    with grpc.secure_channel(address, credentials, options=options) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_s
            )
        except grpc.RpcError as error:
            print(f"{address} {args.service or '(server)'}: {error.code().name} {error.details()}")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"{address} {args.service or '(server)'}: {status}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
