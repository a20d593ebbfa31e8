"""Starts and stops `ember serve` for the server tests (loopback only)."""

import os
import re
import signal
import subprocess
import time
import urllib.request


class EmberServer:
    """`ember serve --port 0 ...` in a child process; .url once it listens."""

    def __init__(self, ember, model, *extra):
        self.proc = subprocess.Popen([ember, "serve", "-m", model, "--port", "0", "--quiet", *extra],
                                     stderr=subprocess.PIPE, text=True)
        self.url = None
        self.log = []
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        if not self.url:
            self.proc.kill()
            raise RuntimeError("ember serve did not start: " + "".join(self.log))

    def get(self, path, timeout=30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.status, r.read().decode()

    def metrics(self):
        _, text = self.get("/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.split()
                out[name] = float(value)
        return out

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGTERM, then the exit status (a clean shutdown is 0)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("ember serve did not stop within 30 s of SIGTERM")
        self.log.append(self.proc.stderr.read())
        self.proc.stderr.close()
        return self.proc.returncode


def default_model():
    home = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")
    return os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")
