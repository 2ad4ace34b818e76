"""The Responses API's store: one file per answer, ids that sort oldest first, at most
`max_stored_responses` kept, an id of another form refused before it names a file; and
on a live server (a small random Llama on the torch engine) the bound holds and stored
answers, and the conversations they carry, survive a restart."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from app.api.responses.store import (
    ResponseStore,
    StoredResponse,
    check_response_id,
    new_response_id,
)
from app.config.settings import ModelSpec
from app.errors import InvalidResponseId
from tests.support.live import live_server, make_settings
from tests.support.random_models import save_random_llama


def stored(response_id: str, text: str = "hi") -> StoredResponse:
    output = [{"type": "message", "role": "assistant", "content": text}]
    return StoredResponse({"id": response_id, "output": output}, [{"role": "user", "content": "q"}])


def ids(count: int) -> list[str]:
    clock = itertools.count(1_700_000_000_000_000_000, 1000)
    return [new_response_id(lambda: next(clock)) for _ in range(count)]


def test_ids_made_later_sort_later_and_are_of_the_checked_form():
    made = ids(50)
    assert sorted(made) == made and len(set(made)) == 50
    assert all(check_response_id(i, "x") == i for i in made)


@pytest.mark.parametrize(
    "bad", ["", "resp_", "../resp_a", "resp_a/../../b", "resp_a.json", "RESP_a", "resp_" + "a" * 97]
)
def test_an_id_of_another_form_is_refused(tmp_path, bad):
    store = ResponseStore(tmp_path / "responses", 10)
    for call in (store.load, store.delete):
        with pytest.raises(InvalidResponseId):
            call(bad)
    assert not (tmp_path / "responses").exists()


def test_the_oldest_go_beyond_the_limit_and_a_new_store_reads_the_rest(tmp_path):
    folder = tmp_path / "responses"
    store = ResponseStore(folder, 3)
    made = ids(5)
    for response_id in reversed(made):  # saved newest first: the order is the ids'
        store.save(stored(response_id))
    assert store.ids() == made[2:]
    assert store.load(made[0]) is None and store.load(made[1]) is None
    again = ResponseStore(folder, 3)  # as after a restart
    assert again.ids() == made[2:]
    found = again.load(made[4])
    assert found is not None and found.conversation()[-1]["content"] == "hi"


def test_a_file_is_replaced_whole_and_a_partial_one_left_by_a_crash_is_cleared(tmp_path):
    folder = tmp_path / "responses"
    store = ResponseStore(folder, 10)
    (first,) = ids(1)
    store.save(stored(first, "one"))
    store.save(stored(first, "two"))
    (folder / f"{first}x.json.partial").write_text('{"resp')  # a write cut short
    store.save(stored(ids(2)[1]))
    assert sorted(p.suffix for p in folder.iterdir()) == [".json", ".json"]
    found = store.load(first)
    assert found is not None and found.response["output"][0]["content"] == "two"


def test_delete_and_unreadable_files(tmp_path):
    store = ResponseStore(tmp_path / "responses", 10)
    first, second = ids(2)
    store.save(stored(first))
    assert store.delete(first) and not store.delete(first)
    (tmp_path / "responses" / f"{second}.json").write_text("not json")
    assert store.load(second) is None  # unreadable: as if absent (and said in the log)


def test_the_oldest_go_once_the_files_pass_max_bytes_together(tmp_path):
    """A count bound alone let 1,000 answers that each echo a big schema fill the disk."""
    folder = tmp_path / "responses"
    made = ids(4)
    size = len(json.dumps({"response": stored(made[0]).response, "input": stored(made[0]).input}))
    store = ResponseStore(folder, 100, max_bytes=2 * size + size // 2)  # room for two
    for response_id in made:
        assert store.save(stored(response_id))
    assert store.ids() == made[2:]
    assert sum(p.stat().st_size for p in folder.iterdir()) <= store.max_bytes
    roomy = ResponseStore(tmp_path / "roomy", 100, max_bytes=10 * size)  # the control
    for response_id in made:
        roomy.save(stored(response_id))
    assert roomy.ids() == made


def test_an_answer_over_max_bytes_alone_is_not_stored_and_the_others_stay(tmp_path):
    store = ResponseStore(tmp_path / "responses", 100, max_bytes=4096)
    small, big = ids(2)
    assert store.save(stored(small))
    assert not store.save(stored(big, "x" * 5000))
    assert store.ids() == [small] and store.load(big) is None


def test_a_limit_of_zero_stores_nothing(tmp_path):
    store = ResponseStore(tmp_path / "responses", 0)
    store.save(stored(ids(1)[0]))
    assert store.ids() == [] and not (tmp_path / "responses").exists()


# -- on a live server -----------------------------------------------------------------------
def test_a_live_store_is_bounded_and_survives_a_restart(tmp_path: Path):
    folder = save_random_llama(tmp_path / "tiny", context=1024)
    settings = make_settings(
        tmp_path,
        device="cpu",
        models=(ModelSpec(name="tiny", kind="generation", path=folder),),
        max_stored_responses=2,
    )

    def ask(client: OpenAI, **fields: object) -> str:
        answer = client.responses.create(model="tiny", max_output_tokens=3, **fields)  # type: ignore[call-overload]
        return answer.id

    with live_server(settings) as live:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        first = ask(client, input="one")
        second = ask(client, input="two", previous_response_id=first)
        third = ask(client, input="three", previous_response_id=second)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(first)  # the oldest, beyond the two kept
        assert len(list((tmp_path / "data" / "responses").iterdir())) == 2
        before = client.responses.retrieve(third).model_dump()
    with live_server(settings) as live:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        assert client.responses.retrieve(third).model_dump() == before
        fourth = client.responses.create(
            model="tiny", input="four", previous_response_id=third, max_output_tokens=3
        )
        page = client.responses.input_items.list(fourth.id, order="asc", limit=100).data
        items = [item.model_dump() for item in page]
        asked = [item["content"][0]["text"] for item in items if item.get("role") == "user"]
        assert asked == ["one", "two", "three", "four"]  # the whole chain, from before
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(second)  # the bound holds across the restart


class StoreOffTheLoop(ResponseStore):
    """The live server's own store, which notes for each call whether it ran on a thread
    with a running event loop (the server's) or not (a worker thread)."""

    def __init__(self, folder: Path, limit: int, max_bytes: int) -> None:
        super().__init__(folder, limit, max_bytes)
        self.calls: list[tuple[str, bool]] = []
        self._noted = threading.Lock()

    def _note(self, call: str) -> None:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        with self._noted:
            self.calls.append((call, on_loop))

    def save(self, stored: StoredResponse) -> bool:
        self._note("save")
        return super().save(stored)

    def load(self, response_id: str) -> StoredResponse | None:
        self._note("load")
        return super().load(response_id)

    def delete(self, response_id: str) -> bool:
        self._note("delete")
        return super().delete(response_id)


def big_schema(chars: int) -> dict[str, object]:
    """An object schema of one string field whose description makes it `chars` long."""
    return {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "x" * chars}},
        "required": ["answer"],
    }


def test_a_live_store_is_read_and_written_off_the_event_loop_and_a_huge_schema_refused(
    tmp_path: Path,
):
    """Every store call runs on a worker thread (a stored conversation can be megabytes
    of JSON, which blocked every stream while it was written); a schema over 256 KiB of
    JSON, echoed into every stored answer, is a 400 with nothing stored, beside its
    twin of 1 KiB, which is served and stored."""
    folder = save_random_llama(tmp_path / "tiny", context=1024)
    settings = make_settings(
        tmp_path, device="cpu", models=(ModelSpec(name="tiny", kind="generation", path=folder),)
    )
    with live_server(settings) as live:
        store = StoreOffTheLoop(tmp_path / "data" / "responses", 10, 2**20)
        live.app.state.responses = store
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
        fmt = {"type": "json_schema", "name": "a", "schema": big_schema(300_000)}
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(
                model="tiny", input="q", max_output_tokens=3, text={"format": fmt}
            )
        assert "at most 262,144 are taken" in refused.value.message
        assert store.ids() == [] and not any(call == "save" for call, _ in store.calls)
        fmt["schema"] = big_schema(1000)
        first = client.responses.create(
            model="tiny", input="q", max_output_tokens=3, text={"format": fmt}
        )
        streamed = client.responses.create(
            model="tiny", input="r", max_output_tokens=3, previous_response_id=first.id, stream=True
        )
        ended = ("response.completed", "response.incomplete")
        done = [event for event in streamed if event.type in ended]
        client.responses.retrieve(first.id)
        client.responses.delete(done[0].response.id)
        assert store.ids() == [first.id]
        made = [call for call, _ in store.calls]
        assert made.count("save") == 2 and "load" in made and "delete" in made
        assert [call for call, on_loop in store.calls if on_loop] == []
