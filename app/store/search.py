"""Which model fits this machine, searched for: `vramgate search QUERY`,
`GET /admin/models/search` and the dashboard's Library.

The Hub's own search (huggingface_hub's `list_models`, GGUF repos only, most downloaded
first) names the repos; each is then answered as `vramgate fits` answers one
(app.store.fits): its quantisations with their file sizes, each planned by the load's own
planner against this machine's rooms, from the header of the one a pull would fetch read
with HTTP Ranges. So a search fetches the listing and one header a repo, never weights. A
repo that cannot be planned (no GGUF file, a header we cannot read) is listed with why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from app.store.fits import Fits, GiB, fits, said
from app.store.machine import Machine
from app.store.sources import PullError

SEARCH_LIMIT = 10  # repos a search plans by default: one header each
MOST_REPOS = 50


@dataclass(frozen=True)
class Found:
    """One repo of a search: its quantisations planned here, or why it could not be."""

    repo: str
    downloads: int
    fits: Fits | None
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        """As `GET /admin/models/search` lists it: `fits` as `/admin/models/fits` answers
        it, with each quantisation's verdicts in words (`said`)."""
        document: dict[str, Any] = {"repo": self.repo, "downloads": self.downloads}
        document["error"] = self.error
        if self.fits is None:
            return document | {"fits": None}
        planned = self.fits
        words = {q.label: {"now": said(q.now), "most": said(q.most)} for q in planned.quants}
        return document | {"fits": {**asdict(planned), "said": words}}


def hub_search(query: str, limit: int) -> list[tuple[str, int]]:
    """The Hub's GGUF repos for `query`, most downloaded first: (repo, downloads)."""
    from huggingface_hub import HfApi

    try:
        found = HfApi().list_models(search=query, filter="gguf", sort="downloads", limit=limit)
        return [(model.id, int(model.downloads or 0)) for model in found]
    except Exception as exc:
        raise PullError(f"could not search the Hugging Face hub for {query!r}: {exc}") from exc


def search(
    query: str, machine: Machine, context: int | None = None, limit: int = SEARCH_LIMIT
) -> list[Found]:
    """The Hub's GGUF repos for `query`, each with its quantisations planned here."""
    results = []
    for repo, downloads in hub_search(query, max(1, min(limit, MOST_REPOS))):
        try:
            results.append(Found(repo, downloads, fits(f"hf:{repo}", machine, context), None))
        except PullError as exc:
            results.append(Found(repo, downloads, None, str(exc)))
    return results


def format_search(document: dict[str, Any]) -> str:
    """`vramgate search`' answer (`GET /admin/models/search`'s): this machine's rooms, then
    each repo, its quantisations and where each fits here."""
    planned = [Fits.of(one["fits"]) for one in document["results"] if one["fits"]]
    if not document["results"]:
        return f"no GGUF repo on the Hugging Face hub matches {document['query']!r}"
    lines = []
    if planned:
        machine = planned[0].machine
        lines.append(
            f"on {machine.device}: {machine.free_bytes / GiB:.2f} GiB free for a model now, "
            f"{machine.most_bytes / GiB:.2f} GiB at most"
        )
    for one in document["results"]:
        lines.append(f"hf:{one['repo']} ({one['downloads']} downloads)")
        if one["fits"] is None:
            lines.append(f"  cannot be planned: {one['error']}")
            continue
        found = planned.pop(0)
        for fit in found.quants:
            mark = "*" if fit.label == found.chosen else " "
            guess = "" if fit.from_header else " (scaled by file size)"
            lines.append(
                f"  {mark} {fit.label:<12} {fit.file_bytes / GiB:6.2f} GiB{guess}: now "
                f"{said(fit.now)}; at most {said(fit.most)}"
            )
    lines.append("* what `vramgate pull hf:REPO` fetches; another with hf:REPO:QUANT")
    return "\n".join(lines)
