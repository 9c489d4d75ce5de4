"""A stand-in for vLLM's `vllm serve` (vLLM needs a GPU, which these machines lack): installed as
an executable named `vllm` on the agent's PATH, it parses the command line the agent's engine
supervisor gives it, records that command line and every request it gets in `vllm-calls.jsonl` in
its working directory (the attempt's work dir), and answers the OpenAI API as vLLM does, streaming
included, with the served names it was given. An endpoint named `crash…` makes it print a few lines
and exit 1 at once, as an engine that cannot start does; one named `slow…` streams a word a second;
one named `fast…` streams max_tokens one-token chunks as fast as it can (bench/serving.py measures
the path, not a model); one named `lazy…` waits LAZY_HEAD_S before even its response head, as an
engine reading a long prompt does, and refuses a `temperature` above 2 as vLLM does (400 naming
it); one named `dies…` exits (status 1, unanswered) when a message says `exit`,
as an engine that crashes mid-serve. `GET /metrics` answers as vLLM's Prometheus endpoint does, with
`vllm:num_requests_running` (the requests it answers now) and `vllm:num_requests_waiting` (0; a
`slow…` engine says 2, as one whose batch is full), each scrape recorded in `vllm-metrics.jsonl`;
one whose name holds `bare` has no metrics (404, as `transformers serve`).
Standard library only: it runs in the attempt's sandbox."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CALLS = Path("vllm-calls.jsonl")
LAZY_HEAD_S = 3.0
SCRAPES = Path("vllm-metrics.jsonl")  # apart: the agent scrapes at every heartbeat


def record(entry: dict[str, Any], to: Path = CALLS) -> None:
    with to.open("a") as out:
        out.write(json.dumps(entry) + "\n")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--lora-modules", nargs="*", default=[])
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--tensor-parallel-size", type=int)
    parser.add_argument("--dtype")
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--enforce-eager", action="store_true")
    return parser.parse_args(argv)


def main() -> None:
    args = parse(sys.argv[1:])
    record({"argv": sys.argv[1:]})
    names = [args.served_model_name, *(m.split("=", 1)[0] for m in args.lora_modules)]
    if any(name.startswith("crash") for name in names):
        print("INFO loading weights", flush=True)
        print("ERROR CUDA out of memory: tried to allocate 80.00 GiB", flush=True)
        sys.exit(1)

    running = [0]  # requests being answered now, for /metrics
    lock = threading.Lock()

    def metrics() -> bytes:
        waiting = 2 if args.served_model_name.startswith("slow") else 0
        label = f'{{model_name="{args.served_model_name}"}}'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{label} {float(running[0])}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{label} {float(waiting)}\n"
        ).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *values: Any) -> None:
            print(format % values, flush=True)

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {})
            elif self.path == "/metrics" and "bare" in args.served_model_name:
                record({"refused": True}, SCRAPES)
                self._json(404, {"detail": "Not Found"})
            elif self.path == "/metrics":
                record({"running": running[0]}, SCRAPES)
                data = metrics()
                self.send_response(200)
                self.send_header("content-type", "text/plain; version=0.0.4")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": n, "object": "model"} for n in names]})
            else:
                self._json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            with lock:
                running[0] += 1
            try:
                self._post()
            finally:
                with lock:
                    running[0] -= 1

        def _post(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            record({"path": self.path, "model": body.get("model"), "stream": body.get("stream", False)})
            said = [m.get("content") for m in body.get("messages") or [] if isinstance(m, dict)]
            if args.served_model_name.startswith("dies") and "exit" in said:
                print("ERROR engine core died unexpectedly", flush=True)
                os._exit(1)
            if body.get("model") not in names:
                self._json(404, {"error": {"message": f"model {body.get('model')} does not exist"}})
                return
            if body["model"].startswith("lazy"):
                time.sleep(LAZY_HEAD_S)
                if (body.get("temperature") or 0) > 2:
                    refusal = {"message": "temperature must be at most 2", "type": "BadRequestError"}
                    self._json(400, {"error": refusal | {"param": "temperature", "code": 400}})
                    return
            fast = body["model"].startswith("fast")
            words = (
                ["t"] * (body.get("max_tokens") or 4)
                if fast
                else ["fake", "vllm", "says", "hi"][: body.get("max_tokens") or 4]
            )
            usage = {"prompt_tokens": 7, "completion_tokens": len(words), "total_tokens": 7 + len(words)}
            chat = self.path == "/v1/chat/completions"
            if not body.get("stream"):
                choice = {"index": 0, "finish_reason": "length"}
                if chat:
                    choice["message"] = {"role": "assistant", "content": " ".join(words)}
                else:
                    choice["text"] = " ".join(words)
                kind = "chat.completion" if chat else "text_completion"
                self._json(
                    200,
                    {
                        "id": "x",
                        "object": kind,
                        "created": 0,
                        "model": body["model"],
                        "choices": [choice],
                        "usage": usage,
                    },
                )
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for word in words:
                delta = {"delta": {"content": word + " "}} if chat else {"text": word + " "}
                chunk = {
                    "id": "x",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, **delta}],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(1.0 if body["model"].startswith("slow") else 0 if fast else 0.05)
            last = {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": body["model"],
                "choices": [],
                "usage": usage,
            }
            self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()

    class Server(ThreadingHTTPServer):
        request_queue_size = 1024  # as uvicorn's backlog: hundreds of streams connect at once
        daemon_threads = True

    Server((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
