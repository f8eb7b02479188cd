"""gradbridge-serve for the tests: the installed script (`script`, built on first use; tests ask for it as the
`serve_script` fixture of tests/conftest.py) and `Service`, one service process on a free loopback port, used
as a context manager so that it is always stopped:

    with Service(serve_script, model, log_dir, "--fsync", "never") as service:
        status, body = service.post("/feedback", {"x": ..., "y": ...})
        code, out, err = service.terminate()   # SIGTERM and its drain, when the test checks them

On leaving the block a process still running is killed (SIGKILL) and reaped; a test that kills or restarts
the service on purpose does so inside the block (``service.process.kill()``) or opens a new one."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from gradbridge._runtime import gradle

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "serve" / "build" / "install" / "gradbridge-serve" / "bin" / "gradbridge-serve"


def script() -> Path:
    """serve/build/install's gradbridge-serve, after `gradle :serve:installDist` when it is missing."""
    if not SCRIPT.exists():
        result = gradle.run_task(":serve:installDist")
        assert result.returncode == 0, result.stderr[-2000:]
    return SCRIPT


class Service:
    """gradbridge-serve on a free port; the generated token (the log folder's serve.key) is sent."""

    def __init__(self, script, model, log_dir, *options):
        self.log_dir = Path(log_dir)
        self.process = subprocess.Popen([str(script), "--model", str(model), "--log", str(log_dir), "--port", "0",
                                         *map(str, options)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()  # the JVM and libtorch start: a few seconds
        if not line.startswith(("gradbridge-serve: listening on http://127.0.0.1:",
                                "gradbridge-serve: listening on https://127.0.0.1:")):
            self.kill()  # not serving: stopped before its error output is read (a live process would never end it)
            raise AssertionError(line + self.process.stderr.read())
        self.context = None  # an ssl.SSLContext for https
        self.url = line.split()[3]
        self.admin_url = None
        self.token = None
        for _ in range(2):
            more = self.process.stdout.readline()
            if more.startswith("gradbridge-serve: /healthz and /metrics on "):
                self.admin_url = more.split()[-1]
            elif "need 'Authorization: Bearer TOKEN'" in more:
                key = Path(more.split()[-1])
                self.token = (key if key.is_file() else self.log_dir / "serve.key").read_text().strip()
                break
            else:
                break

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    def post(self, path, body, timeout=10, headers=None, token=True):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if token and self.token:
            all_headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, method="POST", headers=all_headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.context) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as ex:
            return ex.code, ex.read().decode()

    def get(self, path, timeout=10):
        try:
            with urllib.request.urlopen((self.admin_url or self.url) + path, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as ex:
            return ex.code, ex.read().decode()

    def terminate(self, timeout=60):
        """SIGTERM, then waits for the drain: (exit code, stdout, stderr)."""
        self.process.send_signal(signal.SIGTERM)
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out, err

    def kill(self):
        """SIGKILL if it is still running, and reaped; its output stays readable (``process.stderr``)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
