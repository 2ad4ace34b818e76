"""The Responses API's store: one file per answer, ids that sort oldest first, at most
`max_stored_responses` kept, an id of another form refused before it names a file; and
on a live server (a small random Llama on the torch engine) the bound holds and stored
answers, and the conversations they carry, survive a restart."""

from __future__ import annotations

import itertools
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
