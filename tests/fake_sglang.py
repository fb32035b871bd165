"""A stand-in for `python -m sglang.launch_server`, for tests of Eyrie's SGLang clients.

`fake_server(post)` is the source of a script that parses the launch flags it needs (`a`),
answers GET /health, and answers POST /generate with the body of `post`: Python lines that
read `req` (the request's JSON) and call `self._send(200, {...})`.
"""

HEAD = r"""
import argparse, json, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
p.add_argument("--speculative-algorithm")
p.add_argument("--speculative-num-steps", type=int, default=0)
p.add_argument("--pid-file")
a, _ = p.parse_known_args()
"""

HANDLER = r"""
class H(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(200 if self.path == "/health" else 404, {})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
{post}

ThreadingHTTPServer(("127.0.0.1", a.port), H).serve_forever()
"""


def fake_server(post: str, setup: str = "") -> str:
    """The script's source: flags, then `setup` (module level), then the handler."""
    body = "\n".join("        " + line if line.strip() else "" for line in post.splitlines())
    return HEAD + setup + HANDLER.replace("{post}", body)
