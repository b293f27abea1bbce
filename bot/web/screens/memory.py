"""Memory: the long-term memory files and skills (view, edit with a diff preview, save as a
commit), their history (the log with diffs, revert), the archive by day, search with
citations, and a Dream run in the running gateway.

Every reading and writing goes through the functions ``memobot memory ...`` uses
(:mod:`bot.memory.versioning`, :mod:`bot.memory.search`) and :mod:`bot.memory.editing`,
which reads the workspace as the model's hostile data (no link followed, no huge file read).
This module is the routes; what they show is gathered in :mod:`bot.web.memory_data` and
rendered in :mod:`bot.web.memory_views`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import date
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from aiohttp import web

from bot.config import Config
from bot.memory.editing import EditError, Stale, from_form, read_current
from bot.memory.editing import save as save_file
from bot.memory.versioning import MemoryRepo, MemoryRepoError
from bot.web.memory_data import (
    Found,
    archive_day,
    change_log,
    file_listing,
    one_change,
    run_search,
)
from bot.web.memory_views import (
    archive_page,
    commit_page,
    edit_page,
    files_page,
    log_page,
    preview_page,
    problem_page,
    search_page,
    view_page,
)
from bot.web.server import page_response
from bot.web.views import Frame

if TYPE_CHECKING:
    from bot.web.server import Panel

log = logging.getLogger(__name__)
NAV = ("/memory", "Memory")


def routes(panel: Panel) -> list[web.RouteDef]:
    async def settings() -> Config:
        cfg, _ = await panel.config()
        # The workspace this process started with: the one the running gateway's agent and
        # Dream write, and the memory history versions (a new agent.workspace saved in
        # Settings takes a restart; until then an edit here must not go to another folder).
        cfg.agent.workspace = panel.cfg.agent.workspace
        return cfg

    async def places(request: web.Request) -> tuple[Config, Frame]:
        cfg = await settings()
        return cfg, panel.frame(request, await panel.gateway_running())

    async def no_workspace(cfg: Config, frame: Frame) -> web.Response | None:
        workspace = cfg.agent.workspace_path  # the owner's path, from the config
        if await asyncio.to_thread(workspace.is_dir):
            return None
        why = f"The workspace {workspace} does not exist yet: “memobot onboard” creates it."
        return page_response(problem_page("no workspace", why, frame))

    async def files(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        if (missing := await no_workspace(cfg, frame)) is not None:
            return missing
        listing = await asyncio.to_thread(file_listing, cfg)
        return page_response(files_page(listing, frame, panel.gateway is not None))

    async def view(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        rel = request.query.get("path", "")
        try:
            current = await asyncio.to_thread(read_current, cfg.agent.workspace_path, rel)
        except EditError as exc:
            return page_response(problem_page(rel, str(exc), frame), 404)
        return page_response(await asyncio.to_thread(view_page, current, frame))

    async def edit(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        rel = request.query.get("path", "")
        try:
            current = await asyncio.to_thread(read_current, cfg.agent.workspace_path, rel)
        except EditError as exc:
            return page_response(problem_page(rel, str(exc), frame), 404)
        return page_response(edit_page(current, current.text, current.digest, frame))

    async def preview(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        form = await request.post()
        rel, seen = str(form.get("path", "")), str(form.get("seen", ""))
        try:
            current = await asyncio.to_thread(read_current, cfg.agent.workspace_path, rel)
        except EditError as exc:
            return page_response(problem_page(rel, str(exc), frame), 409)
        text = from_form(str(form.get("text", "")), current.text)
        warning = ""
        if current.digest != seen:
            warning = (
                f"{rel} changed after you opened it (the model, Dream or another edit wrote "
                "it): the changes below are against the file as it is now, and saving undoes "
                "what was written meanwhile where your text differs."
            )
        # In a worker: a diff of two 64 KiB texts can take seconds (difflib), and rendering
        # makes every invisible character visible, character by character.
        body = await asyncio.to_thread(
            preview_page, current, text, frame, warning, budget=cfg.memory.max_chars
        )
        return page_response(body)

    async def save(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        workspace, state = cfg.agent.workspace_path, panel.state_dir
        form = await request.post()
        rel, seen = str(form.get("path", "")), str(form.get("seen", ""))
        sent = str(form.get("text", ""))
        try:
            current = await asyncio.to_thread(read_current, workspace, rel)
            text = from_form(sent, current.text)
            saved = await asyncio.to_thread(save_file, workspace, state, rel, text, seen)
        except Stale as exc:
            log.info("memory: a save of %s by web refused: it changed meanwhile", rel)
            try:
                now = await asyncio.to_thread(read_current, workspace, rel)
            except EditError as problem:  # replaced meanwhile by a link, a huge file...
                return page_response(problem_page(rel, f"{exc} {problem}", frame), 409)
            text = from_form(sent, now.text)
            budget = cfg.memory.max_chars
            body = await asyncio.to_thread(
                preview_page, now, text, frame, str(exc), stale=True, budget=budget
            )
            return page_response(body, 409)
        except (EditError, OSError) as exc:
            return page_response(problem_page(rel, str(exc), frame), 409)
        where = "/memory/file?" + urlencode({"path": rel})
        if not saved.written:
            return panel.back(where, f"{rel} is unchanged: nothing to save.")
        if saved.commit is None:
            log.info("memory: %s edited by web, back to its last commit", rel)
            return panel.back(where, f"Saved {rel}: it is as its last commit has it again.")
        log.info("memory: %s edited by web, commit %s", rel, saved.commit[:7])
        return panel.back(where, f"Saved {rel}: commit {saved.commit[:7]} (by web).")

    async def history_log(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        # One page of LOG_PAGE commits at a time, each diffed: never a thousand at once.
        skip = _int(request.query.get("skip"), 0, 0, 1_000_000)
        try:
            commits = await asyncio.to_thread(change_log, cfg, skip)
        except (OSError, MemoryRepoError) as exc:
            return page_response(problem_page("the memory history", str(exc), frame), 500)
        return page_response(await asyncio.to_thread(log_page, commits, skip, frame))

    async def commit_view(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        rev = request.query.get("rev", "HEAD")
        try:
            [change] = await asyncio.to_thread(one_change, cfg, rev)
        except (OSError, MemoryRepoError) as exc:
            return page_response(problem_page(rev, str(exc), frame), 404)
        return page_response(await asyncio.to_thread(commit_page, change, frame))

    async def revert(request: web.Request) -> web.Response:
        from bot.memory.versioning import revert_commit

        cfg = await settings()
        rev = str((await request.post()).get("rev", ""))
        repo = MemoryRepo(cfg.agent.workspace_path, panel.state_dir)
        try:
            done = await asyncio.to_thread(revert_commit, repo, rev, "web")
        except (OSError, MemoryRepoError) as exc:
            return panel.back("/memory/log", f"Not reverted: {exc}")
        log.info("memory: %s (by web)", done)
        return panel.back("/memory/log", f"{done} (by web).")

    async def archive(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        if (missing := await no_workspace(cfg, frame)) is not None:
            return missing
        cursor = _int(request.query.get("cursor"), 0, 0, 1 << 62)
        try:
            day = date.fromisoformat(request.query["day"]) if "day" in request.query else None
        except ValueError:
            day = None
        shown = await asyncio.to_thread(archive_day, cfg.agent.workspace_path, day, cursor)
        return page_response(await asyncio.to_thread(archive_page, shown, frame))

    async def search(request: web.Request) -> web.Response:
        cfg, frame = await places(request)
        if (missing := await no_workspace(cfg, frame)) is not None:
            return missing
        query = request.query.get("q", "").strip()
        since_text, until_text = request.query.get("since", ""), request.query.get("until", "")
        found = Found(query, since_text, until_text)
        if query:
            gateway = panel.gateway
            embeddings = gateway.stack.embeddings if gateway is not None else None
            found = await run_search(cfg, found, embeddings)
        return page_response(search_page(found, frame))

    async def dream(request: web.Request) -> web.Response:
        gateway = panel.gateway
        if gateway is None:
            return panel.back(
                "/memory",
                "Dream runs in the gateway, and it is not running: start it, or run "
                "“memobot dream” in a terminal.",
            )
        runner = gateway.stack.loop.dream
        if runner.running:
            return panel.back("/memory", "Dream is running already: wait for it to finish.")
        log.info("dream: run by web")
        # A browser that goes away does not cut a run short (its edits land whole or not).
        result = await asyncio.shield(runner.run())
        said = result.describe()
        if result.commit:
            return panel.back("/memory/commit?" + urlencode({"rev": result.commit}), said)
        if result.proposal:  # memory.dreamReview: the edit waits there for an answer
            return panel.back("/approvals", said)
        return panel.back("/memory", said)

    return [
        web.get("/memory", files),
        web.get("/memory/file", view),
        web.get("/memory/edit", edit),
        web.post("/memory/preview", preview),
        web.post("/memory/save", save),
        web.get("/memory/log", history_log),
        web.get("/memory/commit", commit_view),
        web.post("/memory/revert", revert),
        web.get("/memory/archive", archive),
        web.get("/memory/search", search),
        web.post("/memory/dream", dream),
    ]


def _int(text: str | None, default: int, low: int, high: int) -> int:
    try:
        return max(low, min(high, int(text or default)))
    except ValueError:
        return default
