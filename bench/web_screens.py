"""Screenshots of every page of the control panel, at desktop and phone width, so a reviewer
can look at the panel without running it.

Starts a real gateway (``memobot gateway``, Telegram on, the panel on) against the fake LLM and
the fake Telegram Bot API, with a small sample: the owner's chat with an answer, a stranger
waiting with a pairing code, a scheduled job. Then Chromium (Debian's, through Playwright)
logs in with a one-time link and saves each page of the nav, and every page listed with
``--extra``, full length, at 1280 and 390 px wide.

    .venv/bin/python bench/web_screens.py [--out bench/out/web_screens] [--extra /chat?c=x]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_cold_start import _free_port, memobot_cmd  # noqa: E402
from tests.fakes.llm_server import FakeLLMProcess  # noqa: E402
from tests.fakes.telegram_api import FakeBotAPI, FakeBotAPIThread  # noqa: E402

OWNER, STRANGER = 1001, 2002
WIDTHS = {"desktop": (1280, 800), "phone": (390, 844)}


def sample_config(tmp: Path, llm_url: str, api: FakeBotAPI) -> Path:
    config = tmp / "config.json"
    telegram = {
        "enabled": True,
        "token": api.token,
        "baseUrl": api.base_url,
        "allowFrom": [str(OWNER)],
        "dmPolicy": "pairing",
    }
    config.write_text(
        json.dumps(
            {
                "llm": {"baseUrl": llm_url, "apiKey": "sk-sample", "model": "fake-model"},
                "agent": {"workspace": str(tmp / "workspace"), "stateDir": str(tmp / "state")},
                "channels": {"telegram": telegram},
                "web": {"enabled": True, "listen": f"127.0.0.1:{_free_port()}"},
            }
        )
    )
    config.chmod(0o600)
    return config


def memobot(config: Path, *args: str) -> str:
    done = subprocess.run(
        [*memobot_cmd(), "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def wait(what: str, ok, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


async def shoot(base: str, link: str, pages: list[str], out: Path) -> list[Path]:
    from playwright.async_api import async_playwright

    from tests.helpers.browser import find_chromium

    executable = find_chromium()
    if executable is None:
        raise SystemExit("no Chromium: apt-get install chromium")
    saved = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, headless=True)
        for kind, (width, height) in WIDTHS.items():
            context = await browser.new_context(viewport={"width": width, "height": height})
            page = await context.new_page()
            if kind == "desktop":
                await page.goto(link)
                await page.wait_for_url(base + "/")
                cookies = await context.cookies()
            else:
                await context.add_cookies(cookies)
            for path in pages:
                await page.goto(base + path)
                await page.wait_for_load_state("networkidle")
                name = re.sub(r"[^a-z0-9]+", "-", path.strip("/").lower()) or "overview"
                target = out / f"{name}-{kind}.png"
                await page.screenshot(path=str(target), full_page=True)
                saved.append(target)
            await context.close()
        await browser.close()
    return saved


def main() -> None:
    from bot.web import screens

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "web_screens")
    ap.add_argument("--extra", action="append", default=[], help="another page path to save")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pages = [path for path, _ in screens.nav()] + args.extra
    with (
        tempfile.TemporaryDirectory() as d,
        FakeLLMProcess.spawn(Path(d)) as llm,
        FakeBotAPIThread(FakeBotAPI()) as api,
    ):
        tmp = Path(d)
        config = sample_config(tmp, llm.base_url, api)
        memobot(
            config,
            "cron",
            "add",
            "--cron",
            "0 8 * * 1",
            "-s",
            f"telegram:{OWNER}",
            "-m",
            "Summarise the week's notes",
        )
        gateway = subprocess.Popen(
            [*memobot_cmd(), "--config", str(config), "gateway"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        try:
            wait("the gateway to connect", lambda: len(api.calls("getUpdates")) >= 2)
            api.private_text("Hello! What can you do?", user_id=OWNER, username="alice")
            api.wait_sent(1, OWNER, 60)
            api.private_text("hi, who are you?", user_id=STRANGER, username="eve")
            api.wait_sent(1, STRANGER, 60)  # the pairing code
            link = memobot(config, "web").strip()
            base = link.split("/login")[0]
            saved = asyncio.run(shoot(base, link, pages, args.out))
        finally:
            gateway.terminate()
            gateway.wait(30)
    for path in saved:
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    print(f"{len(saved)} screenshots of {len(pages)} pages in {args.out}")


if __name__ == "__main__":
    main()
