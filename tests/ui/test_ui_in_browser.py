"""The UI in a real browser: headless Chromium loads each page from a ``statekeel ui`` process over the
prepared store; the tests assert on the DOM Chromium built (``--dump-dom``) and take screenshots.

Outside CI, a machine without Chromium skips these tests with the reason; with ``CI=true`` they must run
(``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import hashlib
import html.parser
import os
import re
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from helpers import Prepared, ui_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


@pytest.fixture(scope="module")
def browser() -> str:
    if CHROMIUM is None:
        if IN_CI:
            pytest.fail(
                "CI=true requires Chromium for the browser tests (.ci/run installs Debian's chromium)"
            )
        pytest.skip("Chromium is not installed (apt-get install chromium); the browser tests need it")
    return CHROMIUM


@pytest.fixture(scope="module")
def site(prepared: Prepared, browser: str) -> Iterator[str]:
    with ui_process("--db", prepared.url) as base:
        yield base


class Node:
    """An element of the DOM Chromium dumped: tag, attributes, children (elements and text)."""

    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag = tag
        self.attrs = attrs
        self.children: list[Node | str] = []

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return " ".join(
            " ".join(c.split()) if isinstance(c, str) else c.text() for c in self.children
        ).strip()

    def iter(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None) -> list[Node]:
        return [n for n in self.iter() if (tag is None or n.tag == tag) and (cls is None or cls in n.classes)]


VOID = {"meta", "link", "br", "img", "input", "hr", "source", "col", "wbr", "area", "base", "embed"}


class _Builder(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def load(browser: str, url: str, profile: Path) -> Node:
    """The DOM of ``url`` after Chromium loaded it, parsed."""
    done = subprocess.run(
        [browser, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    builder = _Builder()
    builder.feed(done.stdout)
    return builder.root


def screenshot(
    browser: str, url: str, target: Path, profile: Path, size: str = "1280,860"
) -> tuple[int, int]:
    """Save a PNG of ``url``; its width and height."""
    done = subprocess.run(
        [
            browser,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={size}",
            f"--screenshot={target}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and target.exists(), done.stderr[-2000:]
    head = target.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def title(dom: Node) -> str:
    return dom.find_all("title")[0].text()


def test_transcript_shows_each_tool_result_under_its_call(site: str, browser: str, tmp_path: Path) -> None:
    dom = load(browser, site + "session?key=chat-openai", tmp_path)
    calls = dom.find_all("div", "call")
    assert len(calls) == 2
    answered, dangling = calls
    assert "run_tests" in answered.text() and "dangling" not in answered.classes
    results = answered.find_all("div", "result")
    assert len(results) == 1 and "3 passed, 1 failed: test_parse" in results[0].text()
    assert "dangling" in dangling.classes and "read_file" in dangling.text()
    assert "no result yet" in dangling.find_all("div", "no-result")[0].text()


@pytest.mark.parametrize(
    ("key", "tool", "result"),
    [("responses-items", "get_weather", "18°C, light rain"), ("anthropic-blocks", "list_dir", "README.md")],
)
def test_responses_and_anthropic_results_sit_under_their_calls(
    site: str, browser: str, tmp_path: Path, key: str, tool: str, result: str
) -> None:
    dom = load(browser, site + "session?key=" + key, tmp_path)
    (call,) = dom.find_all("div", "call")
    assert tool in call.text() and result in call.find_all("div", "result")[0].text()


def test_script_in_a_message_renders_as_text_and_never_runs(
    site: str, browser: str, prepared: Prepared, tmp_path: Path
) -> None:
    dom = load(browser, site + "session?key=" + quote(prepared.evil_key, safe=""), tmp_path)
    # The payload sets document.title when it runs: the title is still the page's own.
    assert title(dom) == f"Session {prepared.evil_key} · statekeel"
    assert dom.find_all("script") == [] and dom.find_all("img") == []
    user = next(m for m in dom.find_all("article", "msg") if "role-user" in m.classes)
    assert prepared.xss in user.text()


def test_the_tampered_audit_entry_is_flagged(
    site: str, browser: str, prepared: Prepared, tmp_path: Path
) -> None:
    dom = load(browser, site + "audit", tmp_path)
    banner = dom.find_all("p", "verified")[0]
    assert "bad" in banner.classes and f"breaks at entry {prepared.tampered_seq}" in banner.text()
    flagged = [row for row in dom.find_all("tr") if "audit-bad" in row.classes]
    assert [row.attrs["id"] for row in flagged] == [f"e{prepared.tampered_seq}"]
    assert "tampered" in flagged[0].text() and "mallory" in flagged[0].text()


def test_trace_waterfall_nests_spans_and_links_each_bar_to_its_attributes(
    site: str, browser: str, prepared: Prepared, tmp_path: Path
) -> None:
    dom = load(browser, site + f"trace?id={prepared.trace_id}#span-1", tmp_path)
    bars = dom.find_all("a", "bar")
    assert len(bars) == 6
    names = [b.find_all("text", "span-name")[0] for b in bars]
    indent = {n.text(): float(n.attrs["x"]) for n in names}
    assert indent["agent turn"] < indent["chat gpt-x"] == indent["run_tests"] < indent["pytest -q"]
    rects = {n.text(): b.find_all("rect")[0] for n, b in zip(names, bars, strict=True)}
    root, tool = rects["agent turn"], rects["run_tests"]
    assert (
        float(root.attrs["x"]) < float(tool.attrs["x"]) < float(root.attrs["x"]) + float(root.attrs["width"])
    )
    hover = bars[1].find_all("title")[0].text()
    assert "gpt-x" in hover and "812" in hover
    panels = {p.attrs["id"]: p for p in dom.find_all("section", "span-detail")}
    target = panels[bars[1].attrs["href"].lstrip("#")]
    assert "chat gpt-x" in target.text() and '"tokens": 812' in target.text()


def test_every_page_loads_in_the_browser_and_leaves_the_database_unchanged(
    site: str, browser: str, prepared: Prepared, tmp_path: Path
) -> None:
    before = hashlib.sha256(prepared.path.read_bytes()).hexdigest()
    pages = {
        "": "Overview",
        "sessions": "Sessions",
        "session?key=compressed": "Session compressed",
        "tasks": "Tasks",
        f"task?id={prepared.task_with_steps}": "Task fix the parser",
        "workflows": "Workflows",
        f"workflow?id={prepared.workflow_id}": "Workflow release",
        "approvals": "Pending approvals",
        "traces": "Traces",
        "threads": "Threads",
        "recovery": "Recovery report",
        "session?key=nobody": "Session not found",
    }
    for path, heading in pages.items():
        dom = load(browser, site + path, tmp_path)
        assert dom.find_all("h1")[0].text().startswith(heading), path
        assert dom.find_all("link")[0].attrs["href"] == "/static/style.css"
    wf = load(browser, site + f"workflow?id={prepared.workflow_id}", tmp_path)
    nodes = wf.find_all("a", "node")
    assert sorted(n.find_all("text", "name")[0].text() for n in nodes) == [
        "build",
        "lint",
        "publish",
        "unit-tests",
    ]
    assert hashlib.sha256(prepared.path.read_bytes()).hexdigest() == before


def test_screenshots_of_the_transcript_and_the_task_board(
    browser: str, prepared: Prepared, tmp_path: Path
) -> None:
    # STATEKEEL_UI_SCREENSHOTS=docs keeps them (that is how docs/ui-*.png are made). The server runs in
    # the store's directory with a relative URL, so the pictures show no path of this machine.
    target = Path(os.environ.get("STATEKEEL_UI_SCREENSHOTS") or tmp_path).resolve()
    with ui_process("--db", f"sqlite:///{prepared.path.name}", cwd=prepared.path.parent) as site:
        for name, path in (("ui-transcript.png", "session?key=chat-openai"), ("ui-tasks.png", "tasks")):
            width, height = screenshot(browser, site + path, target / name, tmp_path / "profile")
            assert (width, height) == (1280, 860)
            assert 10_000 < (target / name).stat().st_size < 400_000


LONG_WORKER = "worker-" + "9f8e7d6c5b4a" * 10  # an id with no place to break a line


def _layout_store(path: Path) -> tuple[str, str]:
    """A store with a task held by a worker of a very long id, and a task whose step is recorded."""
    import asyncio

    import statekeel

    async def fill() -> tuple[str, str]:
        async with statekeel.open_store(f"sqlite:///{path}") as store:
            await store.tasks.create("held by a long id", status="queued")
            held = await store.tasks.claim(LONG_WORKER, lease_seconds=3600)
            assert held is not None
            done = await store.tasks.create("with a recorded step")
            await store.tasks.transition(done.id, "running")
            await store.tasks.step(done.id, "fetch", lambda: {"rows": 3})
            return held.id, done.id

    return asyncio.run(fill())


# Runs in the page once Chromium laid it out: what each check measures, written into the DOM it dumps.
_MEASURE = """<script>
const out = {cards: [], rows: [], board: null};
const board = document.querySelector('.board');
if (board) out.board = {scroll: board.scrollWidth, client: board.clientWidth};
for (const card of document.querySelectorAll('.card')) {
  const box = card.getBoundingClientRect();
  const text = document.createRange();  // every line of text in the card, where it is drawn
  text.selectNodeContents(card);
  const widest = text.getBoundingClientRect().right;
  out.cards.push({text: card.textContent.trim().slice(0, 40), right: box.right, widest: widest,
                  column: card.closest('.column').getBoundingClientRect().right});
}
for (const tr of document.querySelectorAll('table.steps tbody tr')) {
  out.rows.push({row: getComputedStyle(tr).backgroundColor,
                 cell: getComputedStyle(tr.cells[0]).backgroundColor,
                 badge: getComputedStyle(tr.querySelector('.badge')).backgroundColor});
}
const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def measured(
    browser: str, site: str, path: str, tmp_path: Path, width: int, script: str = _MEASURE
) -> dict[str, Any]:
    """The page at ``path`` of ``site`` laid out by Chromium at ``width`` pixels, measured by ``script``
    (``_MEASURE``): the page's own markup and stylesheet, saved as a file so that the script may run."""
    import json
    import urllib.request

    with urllib.request.urlopen(site + path) as page:
        markup = page.read().decode("utf-8")
    with urllib.request.urlopen(site + "static/style.css") as css:
        (tmp_path / "style.css").write_bytes(css.read())
    markup = re.sub(r'href="[^"]*style\.css[^"]*"', 'href="style.css"', markup)
    (tmp_path / "page.html").write_text(markup.replace("</body>", script + "</body>"))
    done = subprocess.run(
        [browser, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},900",
         "--dump-dom", (tmp_path / "page.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S)
    assert found, "the measuring script did not run"
    return dict(json.loads(html.unescape(found.group(1))))


def test_a_long_worker_id_stays_inside_its_task_card(browser: str, tmp_path: Path) -> None:
    held, _ = _layout_store(tmp_path / "layout.db")
    with ui_process("--db", f"sqlite:///{tmp_path / 'layout.db'}") as site:
        for width in (1280, 900):
            found = measured(browser, site, "tasks", tmp_path, width)
            cards = found["cards"]
            if width == 1280:  # the board fits a wide page: no column widened by a line that cannot break
                assert found["board"]["scroll"] <= found["board"]["client"], found["board"]
            [card] = [c for c in cards if c["text"].startswith("held by a long id")]
            assert card["widest"] <= card["right"] + 0.5, (width, card)
            assert card["right"] <= card["column"] + 0.5, (width, card)
            width_, height = screenshot(
                browser, site + "tasks", tmp_path / f"board-{width}.png", tmp_path / "p"
            )
            assert (width_, height) == (1280, 860)
    assert held


def test_a_recorded_step_is_a_green_badge_on_an_unpainted_row(browser: str, tmp_path: Path) -> None:
    _, done = _layout_store(tmp_path / "layout.db")
    with ui_process("--db", f"sqlite:///{tmp_path / 'layout.db'}") as site:
        [row] = measured(browser, site, f"task?id={done}", tmp_path, 1280)["rows"]
        screenshot(browser, site + f"task?id={done}", tmp_path / "task.png", tmp_path / "p")
    transparent = ("rgba(0, 0, 0, 0)", "transparent")
    assert row["row"] in transparent and row["cell"] in transparent, row
    assert row["badge"] not in transparent, row  # the state still shows, on its badge


# Whatever sticks out of the window: the page's own width, and each element or line of text in <main>
# whose right edge is past the window's (inside a box that scrolls sideways on purpose, such as a trace's
# waterfall, it may).
_OVERFLOW = """<script>
const view = document.documentElement.clientWidth;
const out = {scroll: document.documentElement.scrollWidth, view: view, outside: []};
const scrolls = (el) => { for (let p = el.parentElement; p; p = p.parentElement) {
  const x = getComputedStyle(p).overflowX; if (x === 'auto' || x === 'scroll') return true; } return false; };
for (const el of document.querySelectorAll('main *')) {
  if (scrolls(el)) continue;
  const text = document.createRange(); text.selectNodeContents(el);
  const own = getComputedStyle(el).overflowX;  // a box that scrolls: only the box itself must fit
  const inner = own === 'auto' || own === 'scroll' ? 0 : text.getBoundingClientRect().right;
  const right = Math.max(el.getBoundingClientRect().right, inner);
  if (right > view + 0.5) out.outside.push({tag: el.tagName, cls: el.className, right: right,
                                            text: el.textContent.trim().slice(0, 60)});
}
const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def test_the_memories_files_vectors_and_branch_pages_fit_the_window(browser: str, tmp_path: Path) -> None:
    import asyncio

    from helpers import LONG_PATH, fill_kinds_store

    root = tmp_path / "project"
    root.mkdir()
    kinds = asyncio.run(fill_kinds_store(f"sqlite:///{tmp_path / 'kinds.db'}", root))
    target = tmp_path  # they show this machine's paths (the store's, the root's): not for the docs
    pages = {
        "ui-memories.png": "memories?all=1",
        "ui-memory.png": f"memory?id={kinds.long}",
        "ui-memory-history.png": f"memory?id={kinds.drink}",
        "ui-files.png": "files",
        "ui-file.png": "files?path=" + quote(LONG_PATH, safe=""),
        "ui-vectors.png": f"vectors?source={kinds.drink}",
        "ui-branches.png": "session?key=chat",
        "ui-fork.png": "session?key=" + quote("chat/retry", safe=""),
        "ui-trace-session.png": "trace?id=t-retry",
    }
    with ui_process("--db", kinds.url, "--root", str(root)) as site:
        for name, path in pages.items():
            for width in (1280, 900):
                found = measured(browser, site, path, tmp_path, width, _OVERFLOW)
                assert found["scroll"] <= found["view"], (path, width, found["outside"][:5])
                assert found["outside"] == [], (path, width, found["outside"][:5])
            shot = screenshot(browser, site + path, target / name, tmp_path / "profile")
            assert shot == (1280, 860) and 10_000 < (target / name).stat().st_size < 400_000, name
        dom = load(browser, site + "memories", tmp_path)
        assert dom.find_all("a", "here")[0].text() == "Memories"  # the navigation names the page
        assert [a.text() for a in dom.find_all("nav")[0].find_all("a")][-6:] == [
            "Memories",
            "Files",
            "Vectors",
            "Approvals",
            "Audit",
            "Recovery",
        ]


def test_a_memory_holding_a_script_renders_it_as_text_and_never_runs_it(browser: str, tmp_path: Path) -> None:
    import asyncio

    from helpers import XSS, fill_kinds_store

    root = tmp_path / "project"
    root.mkdir()
    kinds = asyncio.run(fill_kinds_store(f"sqlite:///{tmp_path / 'kinds.db'}", root))
    with ui_process("--db", kinds.url) as site:
        for path in (f"memory?id={kinds.evil}", "memories", f"memory?id={kinds.drink}"):
            dom = load(browser, site + path, tmp_path)
            # The payload sets document.title when it runs: the title is still the page's own.
            assert title(dom).endswith(" · statekeel") and "pwned" not in title(dom), path
            assert dom.find_all("script") == [] and dom.find_all("img") == [], path
            assert XSS in dom.find_all("main")[0].text(), path
