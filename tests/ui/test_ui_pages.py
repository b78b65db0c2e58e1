"""Each page of the UI over the prepared store, through Starlette's TestClient: what it shows, its 404
and 400 pages, and cursor paging of the session list."""

from __future__ import annotations

import asyncio
import html
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import markupsafe
import pytest
from starlette.testclient import TestClient

import statekeel
from helpers import LONG_ID, LONG_PATH, LONG_TEXT, XSS, Kinds, Prepared, run_statekeel, sqlite_url
from statekeel.recovery import RecoveryReport
from statekeel.ui import LOOPBACK_NAMES, create_app

BASE = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def client(prepared: Prepared) -> Iterator[TestClient]:
    with TestClient(create_app(prepared.url, allowed_hosts=LOOPBACK_NAMES), base_url=BASE) as c:
        yield c


def text(page: str) -> str:
    """The page's visible text, roughly: tags dropped, entities decoded, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


@pytest.mark.postgres
def test_every_page_renders_on_postgresql(prepared_pg: Prepared) -> None:
    with TestClient(create_app(prepared_pg.url), base_url=BASE) as c:
        for url in prepared_pg.pages():
            response = c.get(url)
            assert response.status_code == (404 if "missing" in url else 200), url
        audit = c.get("/audit").text
        assert re.findall(r'<tr class="audit-bad" id="e(\d+)"', audit) == [str(prepared_pg.tampered_seq)]
        transcript = c.get("/session", params={"key": "anthropic-blocks"}).text
        assert '<div class="result">' in transcript and "dangling" not in transcript


def test_overview_counts_every_kind_of_state(client: TestClient) -> None:
    page = text(client.get("/").text)
    assert "sqlite store, schema version" in page
    assert re.search(r"Sessions 8 active 6 expired 1 archived 1", page), page
    # 32 entries of the tasks' creations, transitions and steps, 4 of approvals, 2 appended by hand.
    assert "Approvals pending 2" in page and "Audit entries 38" in page


def test_session_list_is_newest_first_and_filters_by_status(client: TestClient) -> None:
    page = client.get("/sessions").text
    keys = re.findall(r'href="/session\?key=([^"]+)"', page)
    assert keys[:2] == ["old-archived", "old-expired"]  # the last sessions changed
    assert len(keys) == 8
    only = client.get("/sessions", params={"status": "archived"}).text
    assert re.findall(r'href="/session\?key=([^"]+)"', only) == ["old-archived"]


def test_session_list_pages_with_a_cursor_not_an_offset(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "many.db")

    async def fill() -> None:
        async with statekeel.open_store(url) as store:
            for i in range(120):
                await store.backend.create_session(f"s-{i:03d}")

    asyncio.run(fill())
    seen: list[str] = []
    with TestClient(create_app(url), base_url=BASE) as c:
        path = "/sessions"
        while True:
            page = c.get(path).text
            seen += re.findall(r'href="/session\?key=([^"]+)"', page)
            older = re.search(r'href="(/sessions\?cursor=[^"]+)">older', page)
            if older is None:
                break
            assert "offset" not in older.group(1)
            path = html.unescape(older.group(1))
    assert seen == [f"s-{i:03d}" for i in reversed(range(120))]


def test_transcript_shows_each_tool_result_under_its_call(client: TestClient) -> None:
    page = client.get("/session", params={"key": "chat-openai"}).text
    call = page[page.index('<div class="call">') :]
    call = call[: call.index('<div class="call dangling">')]
    assert "run_tests" in call and "3 passed, 1 failed: test_parse" in call
    assert "no result yet: the last turn's call" in html.unescape(page)
    moved_on = client.get("/session", params={"key": "moved-on"}).text
    assert '<div class="call dangling">' in moved_on and "the transcript moved on without it" in moved_on
    assert '"agent": "coder"' in html.unescape(page)


@pytest.mark.parametrize(
    ("key", "call", "result"),
    [("responses-items", "get_weather", "18°C, light rain"), ("anthropic-blocks", "list_dir", "README.md")],
)
def test_transcript_pairs_responses_items_and_anthropic_blocks(
    client: TestClient, key: str, call: str, result: str
) -> None:
    page = client.get("/session", params={"key": key}).text
    start = page.index('<div class="call">')
    message = page[start : page.index("</article>", start)]  # the message that made the call
    assert call in message and result in message
    assert '<div class="result">' in message and "dangling" not in page


def test_compressed_messages_are_folded_behind_their_summary(client: TestClient) -> None:
    page = client.get("/session", params={"key": "compressed"}).text
    fold = page[page.index('<details class="fold">') : page.index("</details>")]
    assert "the user and the agent counted to three" in fold
    assert all(f"turn {i}" in fold for i in range(4)) and "turn 4" not in fold
    assert "turn 4" in page and "turn 5" in page


def test_untrusted_text_is_escaped_everywhere(client: TestClient, prepared: Prepared) -> None:
    pages = [
        client.get("/session", params={"key": prepared.evil_key}).text,
        client.get("/sessions").text,
        client.get("/approvals").text,
        client.get("/audit", params={"after": 0}).text,
        client.get("/tasks", params={"status": "failed"}).text,
    ]
    for page in pages:
        assert "<script>" not in page and "<img" not in page
    assert str(markupsafe.escape(prepared.xss)) in pages[0]


def test_tasks_board_shows_each_status_with_lease_holder_and_expiry(client: TestClient) -> None:
    page = text(client.get("/tasks").text)
    for status, count in [("pending", 3), ("queued", 2), ("running", 2), ("interrupted", 1), ("failed", 1)]:
        assert f"{status} {count}" in page
    assert "index the repo" in page and "worker-2" in page and "lease until" in page
    assert "worker-dead" in page and "lease expired" in page


def test_task_page_shows_its_step_journal_recorded_and_in_doubt(
    client: TestClient, prepared: Prepared
) -> None:
    page = text(client.get("/task", params={"id": prepared.task_with_steps}).text)
    assert "read-parser recorded" in page and "write-patch recorded" in page
    assert "push-branch in doubt" in page


def test_workflow_page_draws_its_steps_as_a_dag(client: TestClient, prepared: Prepared) -> None:
    page = client.get("/workflow", params={"id": prepared.workflow_id}).text
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert svg.count("<rect") == 4 and svg.count('class="edge') == 4
    assert 'class="node st-success"' in svg and "publish" in svg


def test_audit_page_flags_the_first_tampered_entry(client: TestClient, prepared: Prepared) -> None:
    page = client.get("/audit").text
    assert f"the chain breaks at entry {prepared.tampered_seq}" in page
    bad_rows = re.findall(r'<tr class="audit-bad" id="e(\d+)"', page)
    assert bad_rows == [str(prepared.tampered_seq)]
    assert 'class="audit-after" id="e4"' in page and 'class="audit-ok" id="e2"' in page


def test_trace_page_draws_a_waterfall_with_attributes_on_hover_and_click(
    client: TestClient, prepared: Prepared
) -> None:
    listed = client.get("/traces").text
    assert listed.count(f'href="/trace?id={prepared.trace_id}"') == 6
    assert re.findall(
        r'href="/trace\?id=([^"]+)"', client.get("/traces", params={"status": "error"}).text
    ) == [prepared.trace_id]
    page = client.get("/trace", params={"id": prepared.trace_id}).text
    svg = page[page.index("<svg") : page.index("</svg>")]
    bars = re.findall(r'<a href="#(span-\d+)" class="bar ([^"]+)">\s*<title>([^<]*)</title>', svg)
    assert len(bars) == 6
    assert [t.split(" (")[0] for _, _, t in bars] == [
        "agent turn",
        "chat gpt-x",
        "run_tests",
        "pytest -q",
        "write summary",
        "orphan span",
    ]
    classes = {t.split(" (")[0]: c for _, c, t in bars}
    assert classes["run_tests"] == "st-error" and classes["write summary"] == "st-unset open"
    hover = dict((t.split(" (")[0], t) for _, _, t in bars)
    assert "model: &#34;gpt-x&#34;" in hover["chat gpt-x"] and "tokens: 812" in hover["chat gpt-x"]
    assert "parent gone not recorded" in hover["orphan span"]
    for anchor, _, _ in bars:  # each bar links to the panel of its attributes
        assert f'<section class="span-detail" id="{anchor}">' in page
    # Attributes are shown as JSON (quotes escaped with a backslash), then HTML-escaped.
    assert "<script>" not in page and "&lt;script&gt;document.title=" in page


def test_pending_approvals_and_recovery_report(client: TestClient) -> None:
    approvals = text(client.get("/approvals").text)
    assert "deploy" in approvals and "shell" in approvals and "merge" not in approvals
    report = text(client.get("/recovery").text)
    assert "The store needs attention" in report and "changes nothing" in report
    # call_lost's turn was followed by a user message: it is still reported (and answered after that
    # message) until it has a result; the session page shows it as dangling.
    assert "Tool calls without a result 2" in report and "call_read" in report and "call_lost" in report
    assert "Running tasks whose lease expired 1" in report and "long build" in report
    assert "Steps in doubt 1" in report and "push-branch" in report


@pytest.mark.parametrize(
    ("path", "params", "status", "phrase"),
    [
        ("/session", {"key": "no-such-session"}, 404, "There is no session with the key 'no-such-session'"),
        ("/task", {"id": "no-such-task"}, 404, "There is no task with the id 'no-such-task'"),
        ("/workflow", {"id": "nope"}, 404, "There is no workflow with the id 'nope'"),
        ("/trace", {"id": "nope"}, 404, "There is no span of a trace 'nope'"),
        ("/traces", {"status": "fine"}, 400, "status must be one of unset, ok, error"),
        ("/no/such/page", {}, 404, "There is no page at /no/such/page"),
        ("/session", {}, 400, "This page needs the session key"),
        ("/sessions", {"status": "sleeping"}, 400, "status must be one of active, expired, archived"),
        ("/sessions", {"cursor": "garbage"}, 400, "cursor"),
        ("/audit", {"after": "-1"}, 400, "after must be 0 or more"),
        ("/session", {"key": "x" * 600}, 400, "InvalidKey"),
    ],
)
def test_bad_input_gets_an_error_page_not_a_traceback(
    client: TestClient, path: str, params: dict[str, str], status: int, phrase: str
) -> None:
    response = client.get(path, params=params)
    assert response.status_code == status
    assert "text/html" in response.headers["content-type"]
    assert phrase in html.unescape(response.text) and "Traceback" not in response.text


def _doctor(url: str, cwd: Path) -> dict[str, Any]:
    result = run_statekeel("doctor", "--json", "--db", url, cwd=cwd)
    assert result.returncode in (0, 1), result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert result.returncode == (0 if report["ok"] else 1)
    return report


def _recovery_page(url: str) -> str:
    with TestClient(create_app(url), base_url=BASE) as c:
        response = c.get("/recovery")
        assert response.status_code == 200
        return text(response.text)


async def _leave_a_tool_call(url: str) -> None:
    async with statekeel.open_store(url) as store:
        session = await store.sessions.get_or_create("lost")
        call = {"id": "call_gone", "type": "function", "function": {"name": "deploy", "arguments": "{}"}}
        session.add_message("assistant", None, tool_calls=[call])
        await store.sessions.save(session)
        await store.approvals.request("repo", "deploy", {"env": "prod"}, requested_by="agent")


def test_recovery_banner_and_doctor_come_from_one_health_model(tmp_path: Path, prepared: Prepared) -> None:
    url = sqlite_url(tmp_path / "h.db")

    async def healthy() -> None:
        async with statekeel.open_store(url) as store:
            await store.audit.append("note", "ops", "s", {"n": 1})

    asyncio.run(healthy())
    page, doctor = _recovery_page(url), _doctor(url, tmp_path)
    assert doctor["ok"] and "No problems found: the store is whole" in page and "needs attention" not in page
    # A tool call left by a process that is gone: the store is not damaged (recover() would call it ok),
    # but doctor reports a problem, so the banner must not say whole above it.
    asyncio.run(_leave_a_tool_call(url))
    page, doctor = _recovery_page(url), _doctor(url, tmp_path)
    problems = [f for f in doctor["findings"] if f["severity"] == "problem"]
    assert not doctor["ok"] and [f["check"] for f in problems] == ["tool calls"]
    assert "whole" not in page
    assert f"The store needs attention: {len(problems)} problem(s)" in page
    for finding in doctor["findings"]:
        assert f"{finding['severity']} {finding['check']}: {finding['detail']}" in page
    assert "lost : call_gone" in page or "lost: call_gone" in page
    # The prepared store, with every kind of problem: the same count of problems on both. A copy: the
    # module's client holds the prepared store open, and another process closing its last connection to
    # the same file would remove the WAL file under it.
    shutil.copyfile(prepared.path, tmp_path / "prepared.db")
    copy = sqlite_url(tmp_path / "prepared.db")
    page, doctor = _recovery_page(copy), _doctor(copy, tmp_path)
    problems = [f for f in doctor["findings"] if f["severity"] == "problem"]
    assert problems and f"The store needs attention: {len(problems)} problem(s)" in page
    for finding in doctor["findings"]:
        assert text(html.escape(f"{finding['severity']} {finding['check']}: {finding['detail']}")) in page


def test_recovery_page_names_each_call_task_step_and_approval(client: TestClient, prepared: Prepared) -> None:
    page = client.get("/recovery").text

    async def found() -> RecoveryReport:
        async with statekeel.open_store(prepared.url, migrate=False) as store:
            return await store.recover(repair=False)

    report = asyncio.run(found())
    assert report.pending_approvals and report.interrupted_tasks and report.steps_in_doubt
    for key, call in report.repaired_calls:
        assert f"<code>{html.escape(call)}</code>" in page and html.escape(key) in page
    for task_id in report.interrupted_task_ids:
        assert f"<code>{task_id}</code>" in page
    for task_id, step_key in report.steps_in_doubt_ids:
        assert f"<code>{html.escape(step_key)}</code></a> of task <code>{task_id}</code>" in page
    for approval_id in report.pending_approval_ids:
        assert f"<code>{approval_id}</code>" in page


def test_threads_lists_langgraph_threads_most_recently_checkpointed_first(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.checkpoint.base")
    from langgraph.checkpoint.base import empty_checkpoint

    from statekeel.integrations.langgraph import StatekeelSaver

    url = sqlite_url(tmp_path / "threads.db")

    async def fill() -> None:
        async with statekeel.open_store(url) as store:
            saver = StatekeelSaver(store)
            for thread, namespaces in (("older", [""]), ("newer", ["", "inner"]), ("newer", [""])):
                for ns in namespaces:
                    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
                    await saver.aput(config, empty_checkpoint(), {"source": "input", "step": -1}, {})

    asyncio.run(fill())
    with TestClient(create_app(url), base_url=BASE) as c:
        page = c.get("/threads").text
        assert re.findall(r"<tr>\s*<td><code>([^<]+)</code>", page) == ["newer", "older"]
        assert "newer 3 2" in text(page) and "older 1 1" in text(page)
    empty_url = sqlite_url(tmp_path / "empty.db")

    async def create() -> None:
        async with statekeel.open_store(empty_url):
            pass

    asyncio.run(create())
    with TestClient(create_app(empty_url), base_url=BASE) as c:
        assert "No LangGraph threads in this store." in c.get("/threads").text


def test_session_list_counts_each_sessions_open_tool_calls(client: TestClient, prepared: Prepared) -> None:
    async def counted() -> dict[str, int]:
        async with statekeel.open_store(prepared.url, migrate=False) as store:
            page = await store.sessions.list(limit=100)
            return {s.key: s.open_calls for s in page.items}

    expected = asyncio.run(counted())
    assert any(n > 0 for n in expected.values())  # the prepared store leaves a call without result
    page = client.get("/sessions").text
    assert "open calls" in page
    for row in re.findall(r"<tr>(.*?)</tr>", page, re.S)[1:]:
        key = html.unescape(re.search(r"<a [^>]*>(.*?)</a>", row, re.S).group(1))  # type: ignore[union-attr]
        cells = re.findall(r'<td class="num">(.*?)</td>', row, re.S)
        shown = text(cells[1])
        assert shown == ("?" if expected[key] < 0 else str(expected[key]) if expected[key] else ""), key


def test_sessions_page_searches_by_key_with_a_get_form_to_the_session_page(prepared: Prepared) -> None:
    with TestClient(create_app(prepared.url), base_url=BASE) as c:
        page = c.get("/sessions").text
        assert re.search(r'<form class="search" method="get" action="/session"', page)
        assert '<input name="key"' in page and 'name="token"' not in page
        found = c.get("/session", params={"key": "chat-openai"})
        assert found.status_code == 200 and "chat-openai" in found.text
        assert c.get("/session", params={"key": "no-such-key"}).status_code == 404
    with TestClient(create_app(prepared.url, token="s3cret"), base_url=BASE) as c:
        page = c.get("/sessions", params={"token": "s3cret"}).text
        # A GET form drops its action's query: the token rides in a hidden field.
        assert '<input type="hidden" name="token" value="s3cret">' in page


def test_transcript_shows_when_each_message_was_stored(client: TestClient, prepared: Prepared) -> None:
    async def stored_at() -> dict[int, str]:
        async with statekeel.open_store(prepared.url, migrate=False) as store:
            found = await store.backend.load_session_with_messages("chat-openai", include_archived=True)
            assert found is not None
            return {m.seq: m.created_at.isoformat() for m in found[1]}

    expected = asyncio.run(stored_at())
    page = client.get("/session", params={"key": "chat-openai"}).text
    shown = dict(
        re.findall(
            r'<article class="msg[^"]*" id="m(\d+)">\s*<header>.*?<time datetime="([^"]+)"', page, re.S
        )
    )
    assert expected and {int(seq): when for seq, when in shown.items()} == expected


# --- memories, files, vectors, usage, branches, traces of a session -----------------------------------


def _links(page: str, path: str, name: str) -> list[str]:
    """The ``name`` parameter of every link to ``path`` in ``page``, decoded."""
    return [unquote(html.unescape(v)) for v in re.findall(rf'href="{re.escape(path)}\?{name}=([^"&]+)', page)]


def _rows(page: str, table: str) -> list[str]:
    """The visible text of each body row of the first ``<table class="{table} …">``."""
    start = page.index(f'<table class="{table}')
    body = page[page.index("<tbody>", start) : page.index("</tbody>", start)]
    return [text(r) for r in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def test_memories_page_lists_live_memories_by_type_and_scope(kinds: Kinds) -> None:
    with TestClient(create_app(kinds.url), base_url=BASE) as c:
        page = c.get("/memories").text
        ids = re.findall(r'href="/memory\?id=([0-9a-f]+)"', page)
        assert kinds.drink in ids and kinds.evil in ids and kinds.long in ids
        assert kinds.old not in ids and kinds.gone not in ids  # superseded, forgotten
        users = _rows(c.get("/memories", params={"type": "user"}).text, "memories")
        assert len(users) == 1 and users[0].startswith("drink user user:42 coffee 1.0 2")
        scoped = c.get("/memories", params={"scope": LONG_ID}).text
        assert re.findall(r'href="/memory\?id=([0-9a-f]+)"', scoped.split("<h2>Scopes")[0]) == [kinds.long]
        assert LONG_TEXT in scoped
        scopes = page[page.index("<h2>Scopes") :]
        assert "user:42" in scopes and LONG_ID in scopes and "team" not in scopes  # team's one is forgotten
        everything = c.get("/memories", params={"all": "1"}).text
        states = {r.split()[0]: r for r in _rows(everything, "memories")}
        assert "forgotten" in states["deploy"] and "superseded" in states["drink-then"]
        assert c.get("/memories", params={"type": "bogus"}).status_code == 400


def test_memory_page_shows_every_version_and_its_open_contradictions(kinds: Kinds) -> None:
    with TestClient(create_app(kinds.url), base_url=BASE) as c:
        page = c.get("/memory", params={"id": kinds.drink}).text
        history = _rows(page, "history")
        assert [h.split()[:2] for h in history] == [["1", "ADD"], ["2", "UPDATE"]]
        assert "tea coffee" in history[1] and "said so today" in history[1]
        contradictions = page[page.index("Open contradictions") :]
        assert f'href="/memory?id={kinds.evil}"' in contradictions and "tea or coffee?" in contradictions
        listed = c.get("/memories").text
        assert text(listed).count("tea or coffee?") == 1  # the open contradiction, on the list too
        old = text(c.get("/memory", params={"id": kinds.old}).text)
        assert "superseded" in old and "SUPERSEDE" in old
        assert c.get("/memory", params={"id": "nope"}).status_code == 404


def test_files_page_compares_each_recorded_file_with_the_root(kinds: Kinds) -> None:
    with TestClient(create_app(kinds.url, files_root=kinds.root), base_url=BASE) as c:
        page = c.get("/files").text
        rows = {r.split()[0]: r.split()[-1] for r in _rows(page, "files")}
        assert rows == {
            LONG_PATH: "unchanged",
            "docs/gone.md": "missing",
            "src/app.py": "unchanged",
            "src/changed.py": "changed",
        }
        assert "1 changed, 1 missing, 2 unchanged on this page" in re.sub(r" ([,.])", r"\1", text(page))
        one = text(c.get("/files", params={"path": "src/changed.py"}).text)
        assert "changed — on disk now 6 bytes" in one
    with TestClient(create_app(kinds.url), base_url=BASE) as c:  # no root: the ledger only
        page = c.get("/files").text
        assert "on disk" not in page and "statekeel ui --root DIR" in text(page)
        assert len(_rows(page, "files")) == 4


def test_recovery_page_checks_drift_against_the_root_as_doctor_does(kinds: Kinds, tmp_path: Path) -> None:
    with TestClient(create_app(kinds.url, files_root=kinds.root), base_url=BASE) as c:
        page = text(c.get("/recovery").text)
    doctor = run_statekeel(
        "doctor", "--json", "--db", kinds.url, "--files-root", str(kinds.root), cwd=tmp_path
    )
    drift = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "drift"]
    assert len(drift) == 1 and f"problem drift: {drift[0]['detail']}" in page


def test_vectors_page_lists_models_and_lagging_sources(kinds: Kinds) -> None:
    with TestClient(create_app(kinds.url), base_url=BASE) as c:
        page = c.get("/vectors").text
        assert _rows(page, "models") == ["embed-small 3 2 0"]
        lag = {r.split()[0]: r for r in _rows(page, "lag")}
        assert lag[kinds.drink].split()[1:5] == ["vectors", "memory", "2", "1"]  # memory v2, vector v1
        assert lag["doc:readme"].split()[1:5] == ["vectors", "external", "3", "none"]
        assert kinds.long not in lag  # its vector is of its version
        found = c.get("/vectors", params={"source": kinds.drink}).text
        assert _rows(found, "vectors")[0].startswith("v-drink embed-small 3 1")


def test_transcript_shows_each_messages_usage_and_the_sessions_totals(kinds: Kinds) -> None:
    with TestClient(create_app(kinds.url), base_url=BASE) as c:
        page = c.get("/session", params={"key": "chat"}).text
    headers = re.findall(r'id="m(\d+)">\s*<header>(.*?)</header>', page, re.S)
    shown = {int(seq): re.findall(r'<span class="usage"[^>]*>([^<]*)</span>', h) for seq, h in headers}
    assert {seq: used[0] for seq, used in shown.items() if used} == {
        1: "gpt-a · 812 in · 95 out · cost 0.0031",
        3: "gpt-b · 40 in · 7 out",
    }
    facts = text(page[page.index('<dl class="facts">') : page.index("</dl>")])
    assert "usage 2 turn(s): 852 input and 102 output tokens, cost 0.0031" in facts
    assert "gpt-a 1 812 95 0.0031" in facts and "gpt-b 1 40 7 0" in facts


def test_branch_switcher_links_a_fork_to_its_parent_its_siblings_and_its_forks(kinds: Kinds) -> None:
    with TestClient(create_app(kinds.url), base_url=BASE) as c:
        parent = c.get("/session", params={"key": "chat"}).text
        fork = c.get("/session", params={"key": "chat/retry"}).text
    switcher = parent[
        parent.index('<nav class="branches"') : parent.index("</nav>", parent.index("branches"))
    ]
    assert _links(switcher, "/session", "key") == ["chat/other", "chat/retry"]
    # Each fork point is marked in the parent's transcript, before the first message the fork replaces.
    assert re.search(
        r"branch <a [^>]*key=chat%2Fretry[^>]*>.*?</div>\s*<article [^>]*id=\"m2\"", parent, re.S
    )
    assert re.search(
        r"branch <a [^>]*key=chat%2Fother[^>]*>.*?</div>\s*<article [^>]*id=\"m1\"", parent, re.S
    )
    nav = text(fork[fork.index('<nav class="branches"') : fork.index("</nav>", fork.index("branches"))])
    assert "fork of chat at #2" in nav and "chat/other sibling, at #1" in nav
    assert 'id="fork-point"' in fork
    inherited = re.findall(r'<article class="msg [^"]*inherited" id="m(\d+)"', fork)
    assert inherited == ["0", "1"]
    assert fork.index('id="fork-point"') < fork.index('id="m2"')


def test_a_session_links_to_its_traces_and_a_trace_back_to_its_session(kinds: Kinds) -> None:
    with TestClient(create_app(kinds.url), base_url=BASE) as c:
        chat = c.get("/session", params={"key": "chat"}).text
        retry = c.get("/session", params={"key": "chat/retry"}).text
        assert _links(chat, "/trace", "id") == ["chat"]  # the trace named after it
        assert _links(retry, "/trace", "id") == ["t-retry"]  # named in a span's attributes
        for trace_id, key in (("chat", "chat"), ("t-retry", "chat/retry")):
            page = c.get("/trace", params={"id": trace_id}).text
            back = page[page.index('<p class="trace-sessions">') :]
            assert _links(back.split("</p>")[0], "/session", "key") == [key]


def test_memory_text_with_markup_is_escaped_on_every_page_that_shows_it(kinds: Kinds) -> None:
    with TestClient(create_app(kinds.url, files_root=kinds.root), base_url=BASE) as c:
        for url in kinds.pages():
            page = c.get(url)
            assert page.status_code == 200, url
            assert "<script>" not in page.text and "<img" not in page.text, url
        evil = c.get("/memory", params={"id": kinds.evil}).text
        assert evil.count(str(markupsafe.escape(XSS))) >= 3  # content, source, the history's ADD


def test_every_new_page_of_an_empty_store_says_there_is_nothing(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "empty.db")

    async def create() -> None:
        async with statekeel.open_store(url):
            pass

    asyncio.run(create())
    with TestClient(create_app(url, files_root=tmp_path), base_url=BASE) as c:
        expected = {
            "/memories": ["No memories.", "No scope holds a live memory.", "None: no two memories"],
            "/files": ["No file is recorded in the ledger."],
            "/vectors": ["No vector is stored.", "None: every source known to the index"],
            "/vectors?source=x": ["No vector of the source x ."],
            "/files?path=a.txt": ["The ledger holds no record of this path."],
        }
        for url_, phrases in expected.items():
            page = c.get(url_)
            assert page.status_code == 200, url_
            assert all(p in text(page.text) for p in phrases), (url_, text(page.text))


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("/memories", "memories"),
        ("/memory?id=m", "memories"),
        ("/files", "the file ledger"),
        ("/vectors", "vectors"),
        ("/tasks", "tasks"),
        ("/task?id=t", "tasks"),
        ("/workflows", "workflows"),
        ("/approvals", "approvals"),
        ("/threads", "LangGraph checkpoints"),
    ],
)
def test_a_page_of_a_kind_the_store_does_not_hold_says_so(nats_url: str, path: str, what: str) -> None:
    async def create() -> None:  # the viewer opens a store with migrate=False: its streams must exist
        async with statekeel.open_store(nats_url):
            pass

    asyncio.run(create())
    with TestClient(create_app(nats_url), base_url=BASE) as c:
        page = c.get(path)
    assert page.status_code == 200
    assert f"does not hold {what}:" in text(page.text)


def test_the_recovery_report_of_a_plain_nats_store_covers_the_kinds_it_holds(nats_url: str) -> None:
    async def create() -> None:
        async with statekeel.open_store(nats_url) as store:
            s = await store.sessions.get_or_create("on-nats")
            s.add_message("user", "run it")
            s.add_message("assistant", None, tool_calls=[{"id": "call_gone", "type": "function"}])
            await store.sessions.save(s)

    asyncio.run(create())
    with TestClient(create_app(nats_url), base_url=BASE) as c:
        page = c.get("/recovery")
    assert page.status_code == 200
    report = text(page.text)
    assert "Tool calls without a result 1" in report and "call_gone" in report
    assert "verifies (0 entries" in report and "does not hold" not in report


def test_a_session_of_a_store_without_branches_or_usage_still_shows_its_transcript(nats_url: str) -> None:
    async def fill() -> None:
        async with statekeel.open_store(nats_url) as store:
            s = await store.sessions.get_or_create("on-nats")
            s.add_message("user", "hello")
            await store.sessions.save(s)

    asyncio.run(fill())
    with TestClient(create_app(nats_url), base_url=BASE) as c:
        page = c.get("/session", params={"key": "on-nats"})
        listed = c.get("/sessions")
    assert page.status_code == 200 and "hello" in page.text
    assert 'class="branches"' not in page.text and "<dt>usage</dt>" not in page.text
    assert listed.status_code == 200 and "on-nats" in listed.text


def test_ui_refuses_a_files_root_that_is_not_a_directory(tmp_path: Path, prepared: Prepared) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="is not a directory"):
        create_app(prepared.url, files_root=tmp_path / "nowhere")
