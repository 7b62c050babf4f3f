"""The app end to end in a real headless Chromium: start `streamlit run`, open every page, intervene.

Uses Debian's Chromium (`apt-get install chromium`) through Playwright; no browser is downloaded.
Screenshots land in test-artifacts/ (gitignored) for a person to look at.
"""

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.streamlit_server import streamlit_app
from tests.test_app import make_probe_report, make_sae

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
# Chromium flags for a sandboxed CI box with no network, no GPU and no first-run UI.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 90_000  # a loaded 2-core machine

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's Chromium at /usr/bin/chromium "
                                                     "(apt-get install chromium); `make test` installs it as root"),
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module")
def app_url(tiny, tmp_path_factory):
    """`streamlit run apps/main.py` (apps/.streamlit/config.toml: 127.0.0.1 only) on a free port."""
    run = make_probe_report(tiny, tmp_path_factory.getbasetemp() / "app-probe")
    sae = make_sae(tiny, tmp_path_factory.getbasetemp() / "app-sae")
    env = {**os.environ, "WORKBENCH_APP_RUN": str(run), "WORKBENCH_APP_MODEL": "tiny", "WORKBENCH_APP_SAES": str(sae.parent),
           "WORKBENCH_CACHE": str(tmp_path_factory.mktemp("cache")), "OMP_NUM_THREADS": "1"}
    with streamlit_app("apps/main.py", REPO, env, tmp_path_factory.getbasetemp() / "streamlit.log") as (url, _):
        yield url


@pytest.fixture(scope="module")
def browser():
    try:  # Chromium present but no driver is a broken set-up, not a reason to skip
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[app]' (it drives /usr/bin/chromium)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(shutil.which(str(CHROMIUM)) or CHROMIUM), args=ARGS,
                                      headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    yield page
    context.close()


def open_page(page, url: str, path: str, title: str):
    page.goto(f"{url}/{path}")
    page.get_by_role("heading", name=title).first.wait_for()
    return page


def shoot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    # Streamlit scrolls inside its main block, so grow the window to the content for a whole-page picture.
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(max(height, 1000), 6000)})
    page.wait_for_timeout(1500)  # let plotly redraw at the new size
    page.screenshot(path=str(ARTIFACTS / f"app-{name}.png"), full_page=True)


def assert_no_exception(page):
    assert page.locator('[data-testid="stException"]').count() == 0


def test_runs_page(page, app_url):
    open_page(page, app_url, "", "Runs")
    page.locator('[data-testid="stDataFrame"]').first.wait_for()
    page.get_by_text("Run a quick probe").wait_for()
    assert_no_exception(page)
    shoot(page, "runs")
    # the committed example (apps/examples) is among the runs a fresh install finds: open it
    page.locator('[data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name=re.compile("probe-smollm2-135m-quick")).click()
    page.get_by_role("heading", name=re.compile("smollm2-135m")).wait_for()
    assert_no_exception(page)


def test_topology_page_draws_diagrams_and_follows_the_layer(page, app_url):
    open_page(page, app_url, "topology", "Topology")
    page.locator(".js-plotly-plot .scatterlayer .point").first.wait_for()  # markers of a persistence diagram
    assert page.locator(".js-plotly-plot").count() >= 6
    page.get_by_role("slider").first.focus()
    for key, layer in (("Home", 0), ("End", 3)):  # the captured layers are 0, 1, 3
        page.keyboard.press(key)
        page.get_by_role("heading", name=f"Persistence at layer {layer}").wait_for()
    assert_no_exception(page)
    shoot(page, "topology")


def test_features_page_shows_a_feature(page, app_url):
    open_page(page, app_url, "features", "Features")
    page.get_by_role("heading", name="Top contexts").wait_for()
    page.locator("mark").first.wait_for()  # the activating token, highlighted
    page.locator(".js-plotly-plot .barlayer .point").first.wait_for(state="attached")  # activation histogram
    assert page.locator(".js-plotly-plot .barlayer .point").count() > 0
    page.get_by_text("Most interfering").wait_for()
    assert_no_exception(page)
    shoot(page, "features")


def test_playground_intervention_draws_bars(page, app_url):
    open_page(page, app_url, "playground", "Intervention playground")
    load, ready = page.get_by_role("button", name="Load tiny"), page.get_by_text("neuron", exact=True)
    load.or_(ready).first.wait_for()
    if load.count():  # this app process does not hold the model yet: the page asks before loading it
        load.click()
    page.get_by_text("neuron", exact=True).click()
    page.get_by_role("group", name="scale").wait_for()
    page.get_by_role("button", name="Intervene").click()
    page.locator(".js-plotly-plot .barlayer .point").first.wait_for()
    page.get_by_text("KL(after || before)").wait_for()
    assert page.locator(".js-plotly-plot .barlayer .point").count() >= 6  # before and after bars
    assert_no_exception(page)
    shoot(page, "playground")


def test_model_tools_page(page, app_url):
    open_page(page, app_url, "tools", "Model tools")
    page.get_by_role("tab", name="Quantization").wait_for()
    page.locator(".js-plotly-plot").first.wait_for()  # the committed study's figure
    assert_no_exception(page)
    shoot(page, "tools")
