"""The chat page of `ember serve` in headless Chromium (Debian's `chromium`).

    python test_chat_page.py EMBER_CLI [MODEL] [--screenshot FILE.png]

Drives the page as a user does, through the Chrome DevTools Protocol over a
pipe (--remote-debugging-pipe: no port, no extra package): types a message,
presses Enter, waits for the streamed reply, checks it equals the server's
own greedy reply to the same conversation at the same temperature (0), sends a
second message (the page keeps the conversation), and optionally saves a
screenshot (docs/images/chat_page.png is made this way).
"""

import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import EmberServer, default_model  # noqa: E402


class Chromium:
    """Chromium with the DevTools Protocol on fds 3 (commands) and 4 (replies), NUL-separated JSON."""

    def __init__(self):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if not exe:
            raise SystemExit("chromium not found (bash tools/setup.sh installs it)")
        self.profile = tempfile.mkdtemp(prefix="ember-chromium-")
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()
        # Above 10, so that moving them to 3 and 4 in the child clobbers neither.
        cmd_r, out_w = [self._high(fd) for fd in (cmd_r, out_w)]
        # The child's fd 3 reads our commands, fd 4 writes its replies (moved there by the shell).
        args = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                "--remote-debugging-pipe", "--user-data-dir=" + self.profile, "--window-size=900,700",
                "about:blank"]
        self.proc = subprocess.Popen(
            ["bash", "-c", 'exec "$@" 3<&%d 4>&%d %d<&- %d>&-' % (cmd_r, out_w, cmd_r, out_w), "bash"] + args,
            pass_fds=(cmd_r, out_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(out_w)
        self.next_id = 0
        self.buf = b""
        self.session = None

    @staticmethod
    def _high(fd):
        high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        os.close(fd)
        return high

    def _read_message(self, timeout):
        deadline = time.time() + timeout
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("no reply from Chromium")
            chunk = os.read(self.out_r, 65536)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=True, timeout=60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read_message(timeout)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError("%s: %s" % (method, reply["error"]))
                return reply["result"]

    def open(self, url):
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.send("Page.enable")
        self.send("Page.navigate", {"url": url})

    def eval(self, expression):
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError("page: %s" % r["exceptionDetails"])
        return r["result"].get("value")

    def wait_for(self, expression, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.eval(expression)
            if v:
                return v
            time.sleep(0.1)
        raise TimeoutError("timed out waiting for " + expression)

    def type_and_send(self, text):
        self.eval("document.getElementById('input').focus()")
        self.send("Input.insertText", {"text": text})
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                 "windowsVirtualKeyCode": 13, "text": "\r" if kind == "keyDown" else ""})

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def server_reply(server, messages, temperature):
    body = json.dumps({"messages": messages, "temperature": temperature, "max_tokens": 48}).encode()
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["message"]["content"]


def main():
    args = sys.argv[1:]
    shot = None
    if "--screenshot" in args:
        i = args.index("--screenshot")
        shot = args[i + 1]
        del args[i:i + 2]
    ember = args[0]
    model = args[1] if len(args) > 1 else default_model()
    if not os.path.exists(model):
        print("model not found: %s" % model)
        sys.exit(77)
    server = EmberServer(ember, model)
    browser = Chromium()
    failures = []
    try:
        browser.open(server.url + "/")
        browser.wait_for("document.readyState === 'complete' && document.getElementById('model').textContent")
        browser.eval("document.getElementById('temp').value = '0'; document.getElementById('max').value = '48'")
        conversation = []
        for i, text in enumerate(["Hello! What can you do?", "Write a haiku about the sea."]):
            browser.type_and_send(text)
            state = browser.wait_for("['done', 'error'].includes(document.body.dataset.state) && "
                                     "document.querySelectorAll('.msg.user').length === %d && "
                                     "document.body.dataset.state" % (i + 1))
            if state != "done":
                failures.append("reply %d: the page shows an error: %s" % (
                    i, browser.eval("document.querySelector('.error').textContent")))
                break
            shown = browser.eval("document.getElementById('reply-%d').firstChild.textContent" % (2 * i + 1))
            conversation.append({"role": "user", "content": text})
            expected = server_reply(server, conversation, 0)
            conversation.append({"role": "assistant", "content": expected})
            if shown != expected:
                failures.append("reply %d: page shows %r, the API gives %r" % (i, shown, expected))
            stats = browser.eval("document.querySelectorAll('.stats')[%d].textContent" % i)
            if "tokens" not in stats:
                failures.append("reply %d: no stats line (%r)" % (i, stats))
            print("reply %d: %r (%s)" % (i, shown[:80], stats))
        if shot:
            data = browser.send("Page.captureScreenshot", {"format": "png"})["data"]
            with open(shot, "wb") as f:
                f.write(base64.b64decode(data))
            print("screenshot:", shot)
    finally:
        browser.close()
        status = server.stop()
    if status != 0:
        failures.append("ember serve exited with %d" % status)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
