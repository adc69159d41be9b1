"""A scripted model behind the wire formats of the OpenAI Responses API and the Anthropic
Messages API, so that `examples.agent_loop` (and the tests) run the real SDK clients offline.

`POST /v1/responses` and `POST /v1/messages` answer as those APIs do: a JSON body, or
server-sent events when the request has `"stream": true`. The "model" reads the tool results
the request carries, as a model would: it runs a cell with `exec`, learns the cell id from
`Script running with cell ID 1` and calls `wait`, then answers with what the cells printed.
A question that mentions a city the tools do not know makes its cell fail, and the answer
quotes the error.

Served on trio with h11 (which the SDKs' HTTP stack already brings). Run it on its own with
`.venv/bin/python -m examples.scripted_model --port 8765`, then point a client at
`http://127.0.0.1:8765/v1` (OpenAI) or `http://127.0.0.1:8765` (Anthropic) with any API key.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

import h11
import trio

MODEL = "scripted-model"

EXEC_CODE = """\
// @exec: {"yield_time_ms": 5000}
const cities = await tools.list_cities();
const readings = await Promise.all(cities.map((city) => tools.current_temperature({ city })));
readings.sort((a, b) => b.degrees - a.degrees);
text(`warmest: ${readings[0].city} at ${readings[0].degrees} C`);
yield_control(); // hand the first finding over while the forecast loads
const days = await tools.forecast({ city: readings[0].city, days: 3 });
text(days.map((d) => `day ${d.day}: ${d.sky}, ${d.low} to ${d.high} C`).join("\\n"));
"""

UNKNOWN_CITY_CODE = """\
const reading = await tools.current_temperature({ city: "Atlantis" });
text(`${reading.city}: ${reading.degrees} C`);
"""


def next_step(question: str, tool_results: list[str]) -> tuple[str, Any]:
    """The scripted model's decision, from the question and the texts of the tool results it
    has seen so far.

    Returns:
        `("exec", code)`, `("wait", arguments)` or `("answer", text)`.
    """
    if not tool_results:
        return "exec", UNKNOWN_CITY_CODE if "Atlantis" in question else EXEC_CODE
    last = tool_results[-1]
    running = re.match(r"Script running with cell ID (\S+)", last)
    if running:
        return "wait", {"cell_id": running.group(1), "yield_time_ms": 5000}
    if last.startswith("Script failed"):
        error = last.split("Script error:\n", 1)[-1].splitlines()[0]
        return "answer", f"The tools could not answer: {error}"
    findings = [line for text in tool_results for line in text.splitlines()[3:] if line]
    return "answer", "Here is what I found:\n" + "\n".join(findings)


def _texts(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if part.get("text") is not None)


def _pieces(text: str) -> list[str]:
    """The text as a model streams it: a line at a time."""
    return re.findall(r"[^\n]*\n|[^\n]+", text)


# --- The OpenAI Responses API ------------------------------------------------------------------


def _openai_output(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = body["input"]
    question = next(_texts(i["content"]) for i in items if i.get("role") == "user")
    results = [_texts(i["output"]) for i in items if i.get("type", "").endswith("call_output")]
    assert [tool["name"] for tool in body.get("tools", [])] == ["exec", "wait"]
    action, value = next_step(question, results)
    n = len(results) + 1
    if action == "answer":
        text = {"type": "output_text", "text": value, "annotations": []}
        message = {"type": "message", "id": f"msg_{n}", "role": "assistant", "content": [text]}
        return [{**message, "status": "completed"}]
    if action == "exec":
        call = {"type": "custom_tool_call", "id": f"ctc_{n}", "input": value}
    else:
        arguments = json.dumps(value)
        call = {"type": "function_call", "id": f"fc_{n}", "arguments": arguments}
        call["status"] = "completed"
    return [{**call, "call_id": f"call_{n}", "name": action}]


def _openai_response(body: dict[str, Any], output: list[dict[str, Any]], status: str) -> Any:
    return {
        "id": "resp_scripted",
        "object": "response",
        "created_at": 1767225600,
        "status": status,
        "model": body.get("model", MODEL),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": body.get("tools", []),
        "error": None,
        "incomplete_details": None,
        "usage": {
            "input_tokens": 1,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 1,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 2,
        },
    }


def _openai_events(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events of a streamed response, without their sequence numbers."""
    output = _openai_output(body)
    yield {"type": "response.created", "response": _openai_response(body, [], "in_progress")}
    yield {"type": "response.in_progress", "response": _openai_response(body, [], "in_progress")}
    for index, item in enumerate(output):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            empty = {"type": "output_text", "text": "", "annotations": []}
            yield {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "content": [], "status": "in_progress"},
            }
            yield {"type": "response.content_part.added", **at, "content_index": 0, "part": empty}
            for piece in _pieces(text):
                yield {
                    "type": "response.output_text.delta",
                    **at,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                }
            yield {
                "type": "response.output_text.done",
                **at,
                "content_index": 0,
                "text": text,
                "logprobs": [],
            }
            yield {
                "type": "response.content_part.done",
                **at,
                "content_index": 0,
                "part": item["content"][0],
            }
        elif item["type"] == "custom_tool_call":
            yield {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "input": ""},
            }
            for piece in _pieces(item["input"]):
                yield {"type": "response.custom_tool_call_input.delta", **at, "delta": piece}
            yield {"type": "response.custom_tool_call_input.done", **at, "input": item["input"]}
        else:
            yield {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "arguments": "", "status": "in_progress"},
            }
            yield {
                "type": "response.function_call_arguments.delta",
                **at,
                "delta": item["arguments"],
            }
            yield {
                "type": "response.function_call_arguments.done",
                **at,
                "arguments": item["arguments"],
                "name": item["name"],
            }
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    yield {"type": "response.completed", "response": _openai_response(body, output, "completed")}


# --- The Anthropic Messages API ----------------------------------------------------------------


def _anthropic_content(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body["messages"]
    question = _texts(messages[0]["content"])
    results = [
        _texts(block["content"])
        for message in messages
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    assert [tool["name"] for tool in body.get("tools", [])] == ["exec", "wait"]
    action, value = next_step(question, results)
    if action == "answer":
        return [{"type": "text", "text": value}]
    arguments = {"code": value} if action == "exec" else value
    n = len(results) + 1
    return [{"type": "tool_use", "id": f"toolu_{n}", "name": action, "input": arguments}]


def _anthropic_message(body: dict[str, Any], content: list[dict[str, Any]]) -> Any:
    uses = any(block["type"] == "tool_use" for block in content)
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", MODEL),
        "content": content,
        "stop_reason": "tool_use" if uses else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def _anthropic_events(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    content = _anthropic_content(body)
    final = _anthropic_message(body, content)
    started = {**final, "content": [], "stop_reason": None}
    yield {"type": "message_start", "message": started}
    for index, block in enumerate(content):
        if block["type"] == "text":
            yield {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            }
            for piece in _pieces(block["text"]):
                yield {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": piece},
                }
        else:
            yield {
                "type": "content_block_start",
                "index": index,
                "content_block": {**block, "input": {}},
            }
            arguments = json.dumps(block["input"])
            for start in range(0, len(arguments), 64):
                delta = {"type": "input_json_delta", "partial_json": arguments[start : start + 64]}
                yield {"type": "content_block_delta", "index": index, "delta": delta}
        yield {"type": "content_block_stop", "index": index}
    stop: dict[str, Any] = {"stop_reason": final["stop_reason"], "stop_sequence": None}
    yield {"type": "message_delta", "delta": stop, "usage": {"output_tokens": 1}}
    yield {"type": "message_stop"}


# --- HTTP --------------------------------------------------------------------------------------


def _sse(events: Iterator[dict[str, Any]], numbered: bool) -> Iterator[bytes]:
    for number, event in zip(itertools.count(), events, strict=False):
        if numbered:
            event = {**event, "sequence_number": number}
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def answer(path: str, body: dict[str, Any]) -> tuple[int, str, list[bytes]]:
    """The status, content type and body chunks that answer a POST to `path`."""
    stream = body.get("stream") is True
    if path.endswith("/responses"):
        if stream:
            return 200, "text/event-stream", list(_sse(_openai_events(body), numbered=True))
        output = _openai_output(body)
        return (
            200,
            "application/json",
            [json.dumps(_openai_response(body, output, "completed")).encode()],
        )
    if path.endswith("/messages"):
        if stream:
            return 200, "text/event-stream", list(_sse(_anthropic_events(body), numbered=False))
        message = _anthropic_message(body, _anthropic_content(body))
        return 200, "application/json", [json.dumps(message).encode()]
    error = {"error": {"type": "not_found_error", "message": f"no endpoint {path}"}}
    return 404, "application/json", [json.dumps(error).encode()]


async def _next_event(stream: trio.SocketStream, connection: h11.Connection) -> Any:
    while True:
        event = connection.next_event()
        if event is not h11.NEED_DATA:
            return event
        connection.receive_data(await stream.receive_some(65536))


async def handle(stream: trio.SocketStream, record: list[Any] | None = None) -> None:
    """Serve one client connection, one request after the other (HTTP/1.1 keep-alive).

    `record` gets each request's decoded body."""
    connection = h11.Connection(h11.SERVER)
    async with stream:
        while True:
            request = await _next_event(stream, connection)
            if not isinstance(request, h11.Request):
                return  # the client closed the connection
            body = b""
            while not isinstance(event := await _next_event(stream, connection), h11.EndOfMessage):
                body += event.data
            decoded = json.loads(body or b"{}")
            if record is not None:
                record.append(decoded)
            status, content_type, chunks = answer(request.target.decode(), decoded)
            headers = [("content-type", content_type)]
            if content_type == "application/json":
                headers.append(("content-length", str(sum(map(len, chunks)))))
            await stream.send_all(
                connection.send(h11.Response(status_code=status, headers=headers))
            )
            for chunk in chunks:  # one event at a time, as a server that streams
                await stream.send_all(connection.send(h11.Data(data=chunk)))
            await stream.send_all(connection.send(h11.EndOfMessage()))
            if connection.our_state is h11.MUST_CLOSE:
                return
            connection.start_next_cycle()


async def serve(
    port: int = 0,
    *,
    record: list[Any] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the scripted model on 127.0.0.1 until cancelled; `nursery.start` gets the port.
    `record` gets each request's decoded body."""
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(functools.partial(handle, record=record), listeners)


async def main(port: int) -> None:
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve, port)
        print(f"scripted model on http://127.0.0.1:{bound} (OpenAI: /v1, Anthropic: /)", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    trio.run(main, parser.parse_args().port)
