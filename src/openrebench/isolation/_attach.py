"""A terminal in an attempt's sandbox: `python -I -S _attach.py SOCKET REQUEST` (what a login runs).

Standard library only. It asks the sandbox's exec server for a shell on a pseudo-terminal of the sandbox
and relays the person's terminal to it: keystrokes in frames (b"d" + length + bytes), window size
changes as b"r" frames, the shell's output raw. The person's own terminal never enters the sandbox (a
descriptor of it there could inject keystrokes into the host's shell). Any number of terminals can be
open at once, all in the same sandbox; a dropped connection hangs its shell up as ssh does, and what runs
in tmux or under nohup goes on, to be found again from the next terminal (`tmux attach`).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import struct
import sys


def _frame(kind: bytes, data: bytes) -> bytes:
    return kind + struct.pack(">I", len(data)) + data


def _size() -> tuple[int, int]:
    size = shutil.get_terminal_size((80, 24))
    return size.lines, size.columns


def _me() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def main() -> int:
    if len(sys.argv) != 3:
        sys.stderr.write("usage: _attach.py SOCKET REQUEST_JSON\n")
        return 2
    path, request = sys.argv[1], json.loads(sys.argv[2])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except PermissionError:
        owner = os.stat(os.path.dirname(path)).st_uid
        sys.stderr.write(f"openrebench: this attempt's sandbox belongs to uid {owner} and you are uid "
                         f"{os.getuid()}: ask the operator to start it with `--login-user {_me()}` "
                         "(or log in as that user)\n")
        return 1
    except OSError as e:
        sys.stderr.write(f"openrebench: the attempt's sandbox is not running ({e.strerror or e})\n")
        return 1
    rows, cols = _size()
    env = dict(request.get("env") or {})
    env["TERM"] = os.environ.get("TERM", env.get("TERM", "xterm"))
    interactive = os.isatty(0)
    request.update(env=env, rows=rows, cols=cols, pty=interactive)
    conn.sendall(json.dumps(request).encode() + b"\n")
    line = b""
    while not line.endswith(b"\n"):  # byte by byte: what follows the reply is the shell's, read below
        byte = conn.recv(1)
        if not byte:
            break
        line += byte
    reply = json.loads(line or b"{}")
    if not reply.get("ok"):
        why = reply.get("message") or reply.get("error") or "no reply"
        sys.stderr.write(f"openrebench: no terminal: {why}\n")
        return 1
    saved = None
    if interactive:
        import termios
        import tty

        saved = termios.tcgetattr(0)
        tty.setraw(0)
        signal.signal(signal.SIGWINCH, lambda *_: conn.sendall(_frame(b"r", struct.pack(">HH", *_size()))))
    stdin_open = True
    try:
        while True:
            watched = [conn] + ([0] if stdin_open else [])
            try:
                ready, _, _ = select.select(watched, [], [])
            except InterruptedError:
                continue
            if conn in ready:
                data = conn.recv(65536)
                if not data:
                    break
                os.write(1, data)
            if 0 in ready:
                data = os.read(0, 65536)
                if not data:  # input ended (a pipe, a file): so does the shell's
                    conn.sendall(_frame(b"e", b""))
                    stdin_open = False
                    continue
                conn.sendall(_frame(b"d", data))
    except (ConnectionError, OSError):
        pass
    finally:
        if saved is not None:
            import termios

            termios.tcsetattr(0, termios.TCSADRAIN, saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
