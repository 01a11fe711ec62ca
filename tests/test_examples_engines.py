"""The trainer-side examples per engine (issue 44.6) run against their engine replaced at
its HTTP boundary: a local server on 127.0.0.1 answers each request with a recorded
response of that engine (tests/engines/), and the records the example publishes are
checked, exact, with the draft lag, and aggregated."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

from specmeter.schemas import GenerationRecord
from specmeter.streams import OfflineAggregator

from .engines import sglang_shapes as sg
from .engines import tensorrt_llm_shapes as trt
from .test_consume import _example
from .test_vllm_adapter import DOC_EXAMPLE


class RecordingPublisher:
    """Stands in for a Publisher: what the example publishes, in the publisher's run."""

    settings = SimpleNamespace(producer_id="rollout-0", run_id="grpo-7")

    def __init__(self) -> None:
        self.records: list[GenerationRecord] = []

    async def publish(self, record: GenerationRecord) -> None:
        self.records.append(record)


@contextmanager
def engine(answers: dict[str, bytes], content_type: str = "application/json") -> Iterator[tuple[str, list[dict]]]:
    """An HTTP server on 127.0.0.1 answering POST ``path`` with ``answers[path]``; yields its
    base URL and the request bodies it received."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = answers[self.path]
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def counters(record: GenerationRecord):
    return (record.accepted, record.proposed, record.verify, record.completion, record.accept_histogram)


def aggregated(records: list[GenerationRecord]):
    aggregator = OfflineAggregator(speculative_algorithm="EAGLE3")
    for record in records:
        aggregator.feed(record)
    (result,) = aggregator.results(closed_at=0.0)
    return result


def test_the_sglang_openai_example_publishes_exact_records_whole_and_streamed():
    example = _example("sglang_openai_rollout")
    ret = [sg.ret_item(sg.EAGLE_0_5_12)]
    for stream, answer, kind in (
        (False, json.dumps(sg.openai_response(ret)).encode(), "application/json"),
        (True, sg.openai_stream(ret).encode(), "text/event-stream"),
    ):
        publisher = RecordingPublisher()
        with engine({"/v1/chat/completions": answer}, kind) as (url, received):
            sent = asyncio.run(
                example.rollout_step(publisher, url, ["a", "b"], batch_id="step-3", draft_lag=2, stream=stream)
            )
        assert sent == 2 and all(body["return_spec_tokens_details"] is True for body in received)
        assert [counters(r) for r in publisher.records] == [sg.EAGLE_0_5_12_COUNTERS] * 2
        assert [r.session_id for r in publisher.records] == ["step-3/prompt-0", "step-3/prompt-1"]
        assert {(r.draft_lag, r.producer_id, r.run_id) for r in publisher.records} == {(2, "rollout-0", "grpo-7")}


def test_the_vllm_example_publishes_exact_records_with_the_draft_lag():
    example = _example("vllm_rollout")
    answer = {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [{"index": 0, "text": "...", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 54, "total_tokens": 65},
        "metrics": {"speculative_decoding": DOC_EXAMPLE},
    }
    publisher = RecordingPublisher()
    with engine({"/v1/completions": json.dumps(answer).encode()}) as (url, received):
        sent = asyncio.run(example.rollout_step(publisher, url, ["p"], batch_id="step-1", draft_lag=1))
    assert sent == 1 and received[0]["prompt"] == "p"
    (record,) = publisher.records
    assert counters(record) == (10, 129, 43, 54, [39, 1, 0, 3]) and record.draft_lag == 1
    assert (record.producer_id, record.run_id) == ("rollout-0", "grpo-7"), "in the publisher's run"
    batch = aggregated(publisher.records)
    assert batch.metrics["spec/accept_rate"] == 10 / 129
    assert [entry.draft_lag for entry in batch.by_draft_lag] == [1]


def test_the_tensorrt_llm_example_is_exact_with_pr_19311_and_unknown_without():
    example = _example("tensorrt_llm_rollout")
    for choice, want in (
        (trt.PR_19311_CHOICE, (30, 60, 20, 50, [8, 0, 6, 6])),
        (trt.RELEASED_CHOICE, (None, None, None, 50, None)),
    ):
        publisher = RecordingPublisher()
        answer = json.dumps(trt.chat_response(choice)).encode()
        with engine({"/v1/chat/completions": answer}) as (url, _):
            asyncio.run(example.rollout_step(publisher, url, ["p"], batch_id="step-0", draft_lag=0))
        (record,) = publisher.records
        assert counters(record) == want and (record.draft_lag, record.run_id) == (0, "grpo-7")
    batch = aggregated(publisher.records)
    assert batch.metrics["spec/accept_count_coverage"] == 0.0, "a released server's answer is not reported"
