"""The sans-IO operations (``belljar._ops``) against scripted answers: what each sends, and
how the daemon's errors thrown into it at a request are handled. No daemon is needed: the
operations do no I/O, which is what lets the sync and asyncio clients share them."""

import asyncio
from typing import Any, Callable, List, Tuple

import pytest

from belljar import BelljarError
from belljar import _ops


def script(*answers: Any) -> Tuple[List[_ops.Call], Callable[[_ops.Call], Any]]:
    """A ``perform`` that answers in turn (an exception is raised), and the calls it got."""
    calls: List[_ops.Call] = []
    pending = list(answers)

    def perform(call: _ops.Call) -> Any:
        calls.append(call)
        answer = pending.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return calls, perform


def test_a_volume_is_made_when_missing_and_a_racing_maker_wins() -> None:
    missing = BelljarError("volume_not_found", "no", 404)
    taken = BelljarError("conflict", "exists", 409)
    calls, perform = script(missing, taken, {"name": "v", "size_mib": 5})
    data = _ops.drive(_ops.volume_from_name("v", True, 5), perform)
    assert data == {"name": "v", "size_mib": 5}
    assert [(c.method, c.url) for c in calls] == [
        ("GET", "/v1/volumes/v"),
        ("POST", "/v1/volumes"),
        ("GET", "/v1/volumes/v"),
    ]
    assert calls[1].body == {"name": "v", "size_mib": 5}
    # Without create_if_missing the daemon's error is the caller's.
    _, perform = script(missing)
    with pytest.raises(BelljarError) as e:
        _ops.drive(_ops.volume_from_name("v", False, None), perform)
    assert e.value.code == "volume_not_found"


def test_closing_the_stdin_of_an_ended_command_is_not_an_error() -> None:
    ended = BelljarError("conflict", "exited", 409)
    calls, perform = script(ended)
    _ops.drive(_ops.command_stdin("/c", b"", close=True), perform)
    assert calls[0].url == "/c/stdin?close=true" and calls[0].headers == {}
    # Writing data to it is.
    _, perform = script(ended)
    with pytest.raises(BelljarError):
        _ops.drive(_ops.command_stdin("/c", b"x", close=False), perform)


def test_a_sandbox_that_already_ended_terminates_quietly() -> None:
    _, perform = script(BelljarError("sandbox_not_running", "ended", 409))
    assert _ops.drive(_ops.terminate("sbx_1"), perform) is None
    _, perform = script(BelljarError("not_found", "gone", 404))
    with pytest.raises(BelljarError):
        _ops.drive(_ops.terminate("sbx_1"), perform)


def test_a_snapshot_timeout_says_how_long() -> None:
    calls, perform = script(BelljarError("timeout", "late"))
    with pytest.raises(BelljarError) as e:
        _ops.drive(_ops.snapshot_filesystem("sbx_1", 5.0), perform)
    assert e.value.code == "timeout" and "5s" in e.value.message
    assert calls[0].timeout == 5.0


def test_pages_are_followed_and_the_async_driver_agrees() -> None:
    pages = (
        {"entries": [{"name": "a", "path": "/d/a", "kind": "file", "size": 1, "mode": 420, "mtime": 0}], "next_cursor": "k"},
        {"entries": [{"name": "b", "path": "/d/b", "kind": "file", "size": 2, "mode": 420, "mtime": 0}]},
    )
    calls, perform = script(*pages)
    names = [e.name for e in _ops.drive(_ops.list_files("sbx_1", "/d"), perform)]
    assert names == ["a", "b"]
    assert calls[1].params == {"path": "/d", "cursor": "k"}

    calls, perform = script(*pages)

    async def aperform(call: _ops.Call) -> Any:
        return perform(call)

    entries = asyncio.run(_ops.adrive(_ops.list_files("sbx_1", "/d"), aperform))
    assert [e.name for e in entries] == ["a", "b"]


def lines(*events: Any) -> Callable[[_ops.Call], Any]:
    """A ``perform`` that gives an NDJSON call's ``lines`` each event, as a client does."""

    def perform(call: _ops.Call) -> Any:
        assert call.lines is not None
        for event in events:
            call.lines(event)
        return None

    return perform


def test_an_import_is_every_done_image_and_names_its_body() -> None:
    a, b = {"name": "x/a:1", "status": "ready"}, {"name": "x/b:1", "status": "ready"}
    seen: List[Any] = []
    perform = lines({"type": "progress", "message": "m"}, {"type": "done", "image": a}, {"type": "done", "image": b})
    assert _ops.drive(_ops.import_image(b"tar", "x/c:1", seen.append), perform) == [a, b]
    assert [e["type"] for e in seen] == ["progress", "done", "done"]

    calls: List[_ops.Call] = []

    def record(call: _ops.Call) -> Any:
        calls.append(call)
        return lines({"type": "done", "image": a})(call)

    _ops.drive(_ops.import_image(b"tar", None, None), record)
    _ops.drive(_ops.import_image("/tmp/app.tar", "x/c:1", None), record)
    assert (calls[0].content, calls[0].upload, calls[0].params) == (b"tar", None, None)
    assert (calls[1].content, str(calls[1].upload), calls[1].params) == (None, "/tmp/app.tar", {"tag": "x/c:1"})


def test_a_pull_error_event_raises_its_code() -> None:
    perform = lines({"type": "progress", "message": "m"}, {"type": "error", "code": "registry_unavailable", "message": "no"})
    with pytest.raises(BelljarError) as e:
        _ops.drive(_ops.pull_image("127.0.0.1:1/none:1", False, None), perform)
    assert e.value.code == "registry_unavailable"
    with pytest.raises(BelljarError) as cut:
        _ops.drive(_ops.pull_image("r/x:1", False, None), lines({"type": "progress", "message": "m"}))
    assert cut.value.code == "connection_lost"


def test_image_names_are_one_path_segment() -> None:
    calls, perform = script(None, None)
    _ops.drive(_ops.remove_image("localhost:5000/a/b:1"), perform)
    _ops.drive(_ops.export_image("localhost:5000/a/b:1", "out.tar"), perform)
    assert calls[0].url == "/v1/images/localhost%3A5000%2Fa%2Fb%3A1"
    assert calls[1].url == "/v1/images/localhost%3A5000%2Fa%2Fb%3A1/export"
    assert str(calls[1].download) == "out.tar"
