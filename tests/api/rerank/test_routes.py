"""Reranking over real HTTP with a random cross-encoder built on the spot (saved by
sentence-transformers' own CrossEncoder.save): the scores are CrossEncoder.predict's for
the same pairs, sorted, cut to top_n; bad input is a 400 before anything is queued;
concurrent requests run in one forward."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings
from tests.support.random_models import save_random_cross_encoder

QUERY = "where do cats sleep"
DOCS = ["cats sleep on the sofa", "the stock market fell", "dogs bark at night", "a cat nap"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory) -> Iterator[tuple[Live, object]]:
    from sentence_transformers import CrossEncoder

    root = tmp_path_factory.mktemp("rerank")
    folder = save_random_cross_encoder(root / "ce")
    spec = ModelSpec(name="ce", kind="rerank", path=folder, max_batch=32)
    settings = make_settings(root, device="cpu", models=(spec,), max_batch_wait_ms=20)
    with live_server(settings) as live:
        yield live, CrossEncoder(str(folder), device="cpu")


def test_scores_are_the_cross_encoders_sorted_and_cut_to_top_n(reranker):
    live, cross = reranker
    want = np.asarray(cross.predict([(QUERY, d) for d in DOCS]))
    assert len(set(np.round(want, 4))) == len(DOCS)  # distinct: the order means something
    answer = httpx.post(
        live.url + "/v1/rerank",
        json={"model": "ce", "query": QUERY, "documents": DOCS, "return_documents": True},
    )
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == list(np.argsort(-want))
    for row in results:
        assert abs(row["relevance_score"] - float(want[row["index"]])) < 1e-5
        assert row["document"] == {"text": DOCS[row["index"]]}
    assert answer.headers["X-Vramgate-Price-Bytes"]
    objects = [{"text": d} for d in DOCS]
    top = httpx.post(
        live.url + "/rerank", json={"model": "ce", "query": QUERY, "documents": objects, "top_n": 2}
    ).json()["results"]
    assert [r["index"] for r in top] == [r["index"] for r in results[:2]]
    assert "document" not in top[0]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": QUERY, "documents": []}, "documents"),
        ({"query": QUERY, "documents": ["x"] * 1001}, "documents"),
        ({"query": "", "documents": DOCS}, "query"),
        ({"query": "w " * 600_000, "documents": DOCS}, "documents"),  # over max_input_chars
        ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
    ],
)
def test_bad_input_is_a_400_before_anything_runs(reranker, body, param):
    live, _ = reranker
    calls = live.service.registry.get("ce").forward_calls
    refused = httpx.post(live.url + "/v1/rerank", json={"model": "ce", **body})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"].startswith(param)
    assert live.service.registry.get("ce").forward_calls == calls


def test_a_model_that_is_no_cross_encoder_is_told_so(server_factory):
    live = server_factory(device="cpu")
    refused = httpx.post(
        live.url + "/v1/rerank",
        json={"model": "all-MiniLM-L6-v2", "query": "q", "documents": ["d"]},
    )
    assert refused.status_code == 400 and "rerank" in refused.json()["error"]["message"]


def test_concurrent_rerank_requests_run_together(reranker):
    live, _ = reranker
    calls = live.service.registry.get("ce").forward_calls

    async def many() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            body = {"model": "ce", "query": QUERY, "documents": DOCS}
            return await asyncio.gather(*(client.post("/v1/rerank", json=body) for _ in range(8)))

    answers = asyncio.run(many())
    assert [a.status_code for a in answers] == [200] * 8
    ran = live.service.registry.get("ce").forward_calls - calls
    assert ran < 8  # at least two requests shared a forward
    assert max(int(a.headers["X-Vramgate-Batch"]) for a in answers) > 1
    first = answers[0].json()["results"]
    assert all(a.json()["results"] == first for a in answers)  # batched, same scores
