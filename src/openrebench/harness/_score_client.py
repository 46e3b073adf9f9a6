"""The `score` command inside the sandbox: ask the harness to score over its Unix socket.

Standard library only: it runs with the sandbox's Python and sees none of the package.
"""

import json
import socket
import sys

SOCKET = "/run/openrebench/score.sock"


def main() -> None:
    request = {"op": sys.argv[1] if len(sys.argv) > 1 else "score"}
    if request["op"] not in ("score", "log"):
        sys.exit("usage: score [log]")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(SOCKET)
        except OSError as e:
            sys.exit(f"score: cannot reach the harness ({e})")
        conn.sendall(json.dumps(request).encode() + b"\n")
        reply = b"".join(iter(lambda: conn.recv(65536), b""))
    print(json.loads(reply)["text"])


if __name__ == "__main__":
    main()
