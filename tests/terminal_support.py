"""A person at a terminal, for tests: a command on a pseudo-terminal, read until a pattern shows, then typed
into (as a person types after seeing the prompt, not ahead of it)."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import time


class Terminal:
    def __init__(self, argv: list[str], rows: int = 40, cols: int = 120) -> None:
        import fcntl
        import struct
        import termios

        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                                     env={**os.environ, "TERM": "xterm"})
        os.close(slave)
        self.master = master
        self.output = ""

    def expect(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """Read until `pattern` (a regex) appears in what the terminal showed since the last match."""
        deadline = time.monotonic() + timeout
        while True:
            clean = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", self.output)
            found = re.search(pattern, clean)
            if found:
                self.output = clean[found.end():]
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{pattern!r} did not show within {timeout} s; the terminal showed:\n"
                                   f"{clean[-2000:]}")
            if select.select([self.master], [], [], min(left, 0.5))[0]:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    data = b""
                if not data:
                    raise EOFError(f"the terminal closed before {pattern!r}; it showed:\n{clean[-2000:]}")
                self.output += data.decode(errors="replace")

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        """Close the terminal as a dropped connection would (the client sees a hang-up)."""
        with contextlib.suppress(OSError):
            os.close(self.master)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGHUP)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
