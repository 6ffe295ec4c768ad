"""The web console in a real headless Chromium (Debian's, driven by Selenium through
/usr/bin/chromedriver: nothing is downloaded) against a real `inferflux serve` with
API keys of each scope and two real models (SmolLM2 serving as `chat`, Gemma 3 270M in
the models folder for the swap).

One server and one browser for the module; the tests run in order. Each page's
screenshot goes to a temporary folder, or to docs/console/ with
INFERFLUX_CONSOLE_SCREENSHOTS=1 (how the pictures in docs/console.md are made).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.integration.model_registry_setup import entry, link_into, sha256_file, write_manifest
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "sk-test-console-admin-0123456789"
READ_KEY = "sk-test-console-read-0123456789"
GENERATE_KEY = "sk-test-console-generate-0123456789"
IDLE_TIMEOUT_S = 12.0
XSS = "<img src=x onerror=window.__xss=1><script>window.__xss=2</script>"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Run in the page: fetch() answers /debug/requests with 10,000 finished requests.
TEN_THOUSAND_ENTRIES = """
const real = window.fetch;
const row = (i) => ({
  request_id: `req-${i}`, tenant: "t", model: "chat", phase: "finished", priority: "normal",
  queue_wait_s: 0.001, time_to_first_token_s: 0.01, elapsed_s: 0.2, num_prompt_tokens: 10,
  num_cached_tokens: 0, num_output_tokens: 5, finish_reason: "stop"});
const recent = Array.from({length: 10000}, (_, i) => row(i));
const body = JSON.stringify({active: [], recent});
const headers = {"content-type": "application/json"};
window.fetch = (url, init) => String(url).startsWith("/debug/requests")
  ? Promise.resolve(new Response(body, {status: 200, headers}))
  : real(url, init);
"""


@dataclass
class Console:
    url: str
    folder: Path
    gemma: str
    driver: WebDriver
    shots: Path

    def open(self, page: str = "") -> None:
        self.driver.get(f"{self.url}/ui#{page}")

    def wait(self, condition: Callable[[WebDriver], object], timeout_s: float = 30.0) -> object:
        try:
            # NOTE: polling pages re-render: an element found a moment ago may be gone
            ignored = [StaleElementReferenceException]
            wait = WebDriverWait(self.driver, timeout_s, 0.1, ignored_exceptions=ignored)
            return wait.until(condition)
        except TimeoutException:
            logs = self.driver.get_log("browser")
            raise AssertionError(f"timed out; browser console: {logs[-10:]}") from None

    def find(self, css: str):
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        """The rendered text of `css`, read in one step (no stale element in between)."""
        return self.driver.execute_script(
            "return document.querySelector(arguments[0]).innerText", css
        )

    def shot(self, name: str) -> None:
        self.driver.save_screenshot(str(self.shots / f"{name}.png"))

    def sign_in(self, key: str) -> None:
        self.driver.delete_all_cookies()  # of the page's origin: the console's
        self.driver.get("about:blank")  # a fresh page, not a same-document hash change
        self.open()
        field = self.wait(lambda d: d.find_element(By.ID, "credential"))
        field.send_keys(key)
        self.find("#sign-in-button").click()
        self.wait(lambda d: d.find_element(By.ID, "who").text)

    def nav(self) -> list[str]:
        return [
            a.get_attribute("data-page")
            for a in self.driver.find_elements(By.CSS_SELECTOR, "#nav a")
        ]


def _config(folder: Path, manifest: Path) -> Path:
    config = {
        "registry": {"path": str(manifest), "poll_interval_ms": 500},
        "auth": {
            "api_keys": [
                {"key": ADMIN_KEY, "id": "ops", "roles": ["admin"]},
                {"key": READ_KEY, "id": "viewer", "scopes": ["read"]},
                {"key": GENERATE_KEY, "id": "app", "scopes": ["generate"]},
            ]
        },
        "console": {"idle_timeout_s": IDLE_TIMEOUT_S},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _browser() -> WebDriver:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("chromium and chromium-driver are not installed: run `make setup`")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    flags = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu")
    quiet = ("--disable-extensions", "--disable-background-networking", "--no-first-run")
    for flag in (*flags, *quiet):
        options.add_argument(flag)
    options.add_argument("--window-size=1200,800")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


@pytest.fixture(scope="module")
def console(tmp_path_factory, smollm2_model_path, gemma3_model_path) -> Iterator[Console]:
    folder = tmp_path_factory.mktemp("console")
    smol = link_into(folder, smollm2_model_path, "smollm2.gguf")
    link_into(folder, gemma3_model_path, "gemma.gguf")
    manifest = folder / "manifest.yaml"
    write_manifest(manifest, [entry("chat", smol, smollm2_model_path, n_ctx=1024)])
    log = folder / "server.log"
    server = ServerProcess("--config", str(_config(folder, manifest)), log_path=log)
    driver = None
    shots = ROOT / "docs" / "console" if os.environ.get("INFERFLUX_CONSOLE_SCREENSHOTS") else folder
    shots.mkdir(parents=True, exist_ok=True)
    try:
        server.wait_ready(180)
        driver = _browser()
        yield Console(server.url, folder, gemma3_model_path, driver, shots)
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-4000:]}")
    finally:
        if driver is not None:
            driver.quit()
        server.close()


def test_sign_in_shows_the_pages_each_scope_allows_and_sign_out_ends_it(console):
    console.open()
    console.wait(lambda d: d.find_element(By.ID, "sign-in"))
    console.shot("sign-in")
    console.find("#credential").send_keys("sk-wrong-key-0123456789")
    console.find("#sign-in-button").click()
    console.wait(lambda d: "invalid" in d.find_element(By.CSS_SELECTOR, ".status.error").text)
    expected = {
        GENERATE_KEY: ["playground"],
        READ_KEY: ["dashboard"],
        ADMIN_KEY: ["playground", "dashboard", "requests", "models", "keys", "usage"],
    }
    for key, pages in expected.items():
        console.sign_in(key)
        assert console.nav() == pages
        cookie = console.driver.get_cookie("inferflux_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert key not in json.dumps(console.driver.get_cookies())
        stored = console.driver.execute_script(
            "return JSON.stringify([localStorage, sessionStorage, document.cookie])"
        )
        assert key not in stored and "inferflux_session" not in stored
    console.find("#sign-out").click()
    console.wait(lambda d: d.find_element(By.ID, "sign-in"))
    assert console.driver.get_cookie("inferflux_session") is None
    assert console.nav() == []


def test_a_streamed_playground_answer(console):
    console.sign_in(GENERATE_KEY)
    console.open("playground")
    console.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#pg-model option"))
    console.find("#pg-system").send_keys("You are terse.")
    console.find("#pg-prompt").send_keys("Name three colors.")
    console.find("#pg-send").click()
    console.wait(lambda d: "finish:" in d.find_element(By.ID, "pg-stats").text, 90)
    answer = console.driver.find_elements(By.CSS_SELECTOR, ".message.assistant .text")[-1]
    assert answer.text.strip()
    stats = console.text("#pg-stats")
    assert "TTFT" in stats and "tokens/s" in stats and "cached prompt tokens" in stats
    assert "curl" in console.text("#pg-code")
    console.find("#pg-show-sdk").click()
    assert "from openai import OpenAI" in console.text("#pg-code")
    console.shot("playground")


def test_model_and_user_text_render_as_text(console):
    console.sign_in(GENERATE_KEY)
    console.open("playground")
    console.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#pg-model option"))
    regex = XSS.replace(".", r"\.")
    extra = {"grammar": regex, "grammar_syntax": "regex", "max_tokens": 64}
    console.find("#pg-extra").send_keys(json.dumps(extra))
    console.find("#pg-prompt").send_keys('<img src=x onerror="window.__xss=3"> <b>bold</b>')
    console.find("#pg-send").click()
    console.wait(lambda d: "finish:" in d.find_element(By.ID, "pg-stats").text, 90)
    texts = [e.text for e in console.driver.find_elements(By.CSS_SELECTOR, ".message .text")]
    assert texts[0].startswith("<img src=x onerror=")  # the user's text, shown as typed
    assert texts[-1] == XSS  # the model's output, forced by the grammar, shown as text
    transcript = console.find("#pg-transcript")
    assert transcript.find_elements(By.CSS_SELECTOR, "img, script, b") == []
    assert console.driver.execute_script("return window.__xss") is None


def test_the_dashboard_updates(console):
    console.sign_in(READ_KEY)
    console.open("dashboard")
    console.wait(lambda d: d.find_element(By.ID, "dash-updated").get_attribute("data-refreshes"))
    before = int(console.text("#dash-requests .value"))
    for _ in range(3):
        reply = httpx.post(
            f"{console.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {GENERATE_KEY}"},
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert reply.status_code == 200
    console.wait(lambda d: int(console.text("#dash-requests .value")) > before)
    refreshes = int(console.find("#dash-updated").get_attribute("data-refreshes"))
    console.wait(
        lambda d: (
            int(d.find_element(By.ID, "dash-updated").get_attribute("data-refreshes")) > refreshes
        )
    )
    assert console.text("#dash-ttft .value") != "– / – / –"
    assert console.driver.find_elements(By.CSS_SELECTOR, "#dash-worker-table tbody tr")
    console.shot("dashboard")


def test_a_key_created_and_revoked(console):
    console.sign_in(ADMIN_KEY)
    console.open("keys")
    console.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#keys-rows tbody tr"))
    console.find("#key-name").send_keys("from-the-console")
    console.find("#key-create").click()
    secret = console.wait(lambda d: d.find_element(By.ID, "key-secret-value").text)
    assert secret.startswith("sk-inf-")

    def check() -> int:
        headers = {"authorization": f"Bearer {secret}"}
        return httpx.get(f"{console.url}/v1/models", headers=headers, timeout=10).status_code

    # the default scope box is `generate`: no read, but a known key (403, not 401)
    assert check() == 403
    console.wait(lambda d: "from-the-console" in d.find_element(By.ID, "keys-rows").text)
    console.shot("keys")
    rows = console.driver.find_elements(By.CSS_SELECTOR, "#keys-rows tbody tr")
    (row,) = [r for r in rows if "from-the-console" in r.text]
    row.find_element(By.CSS_SELECTOR, "button.revoke").click()
    console.wait(lambda d: "done" in d.find_element(By.CSS_SELECTOR, ".status").text)
    assert check() == 401
    audit = httpx.get(
        f"{console.url}/v1/admin/api_keys", headers={"authorization": f"Bearer {ADMIN_KEY}"}
    ).json()["data"]
    (record,) = [k for k in audit if k["name"] == "from-the-console"]
    assert record["revoked"]


def test_a_model_swapped(console):
    console.sign_in(ADMIN_KEY)
    console.open("models")
    console.wait(lambda d: "smollm2.gguf" in d.find_element(By.ID, "models-rows").text)
    console.find("#model-id").send_keys("chat")
    console.find("#model-path").send_keys("gemma.gguf")
    console.find("#model-sha256").send_keys(sha256_file(console.gemma))
    console.find("#model-apply").click()
    console.wait(lambda d: "Apply: done" in d.find_element(By.CSS_SELECTOR, ".status").text, 120)
    console.wait(lambda d: "gemma.gguf" in d.find_element(By.ID, "models-rows").text)
    console.shot("models")
    served = httpx.get(
        f"{console.url}/v1/admin/models", headers={"authorization": f"Bearer {ADMIN_KEY}"}
    ).json()["data"]
    assert any(m["id"] == "chat" and m["path"].endswith("gemma.gguf") for m in served)


def test_live_requests_and_usage_pages(console):
    console.sign_in(ADMIN_KEY)
    console.open("requests")
    console.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#rq-rows tbody tr"))
    console.find("#rq-auto").click()  # stop the auto-refresh: the rows stay put
    assert "chat" in console.text("#rq-rows")  # the model column
    console.driver.find_element(By.CSS_SELECTOR, "#rq-rows tbody tr a").click()
    console.wait(lambda d: "redacted" in d.find_element(By.ID, "rq-detail").text)
    console.shot("requests")
    console.open("usage")
    console.wait(lambda d: "app" in d.find_element(By.ID, "us-table").text)
    console.shot("usage")


def test_ten_thousand_history_entries_stay_responsive(console):
    """The history is fetched whole but rendered PAGE_SIZE rows at a time: a patched
    fetch answers /debug/requests with 10,000 entries."""
    console.sign_in(ADMIN_KEY)
    console.open("dashboard")
    console.driver.execute_script(TEN_THOUSAND_ENTRIES)
    started = time.monotonic()
    console.driver.execute_script("location.hash = '#requests'")
    console.wait(lambda d: "10000 recent" in d.find_element(By.ID, "rq-summary").text)
    assert len(console.driver.find_elements(By.CSS_SELECTOR, "#rq-rows tbody tr")) == 50
    console.find("#rq-next").click()
    assert "page 2 of 200" in console.text("#rq-page")
    assert "req-50" in console.text("#rq-rows")
    assert time.monotonic() - started < 10  # generous: a frozen page takes far longer


def test_a_forged_request_is_refused(console):
    """The browser's own cookie without the CSRF header (what a forged request carries)."""
    console.sign_in(ADMIN_KEY)
    status = console.driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch("/v1/admin/api_keys", {method: "POST", credentials: "same-origin",
          headers: {"Content-Type": "application/json"}, body: JSON.stringify({scopes: ["admin"]})})
          .then(async (r) => done([r.status, (await r.json()).error.code]));
        """
    )
    assert status == [403, "csrf_token_invalid"]
    cookies = {"inferflux_session": console.driver.get_cookie("inferflux_session")["value"]}
    forged = httpx.post(
        f"{console.url}/v1/admin/api_keys", json={"scopes": ["admin"]}, cookies=cookies
    )
    assert forged.status_code == 403
    assert forged.json()["error"]["code"] == "csrf_token_invalid"


def test_an_expired_session_asks_to_sign_in_again(console):
    console.sign_in(ADMIN_KEY)
    console.open("models")  # a page that does not poll
    console.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "#models-rows tbody tr"))
    time.sleep(IDLE_TIMEOUT_S + 1)
    console.find("#nav-keys").click()
    console.wait(lambda d: d.find_elements(By.ID, "sign-in"))
    assert "expired" in console.text("#sign-in .status")
