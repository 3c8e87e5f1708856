"""Small things a newcomer tripped on, in a real browser against the live portal (see conftest.py):
charts that draw at once, as steps, in 24-hour time; a form's refusal in full width with the focus
on the refused field; the workspace switcher's full names; the phone's navigation that shows it
scrolls; the console's stat cards in as many columns as there are cards; and the tokens page without
a live indicator. Each page is kept as pictures at 1280 and 390 px (tests/browser/conftest.py SCREENSHOTS)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, Page, expect

from apps.workspaces.models import Workspace
from tests.browser.conftest import SCREENSHOTS, Portal, sign_in
from tests.personas import PASSWORD, World, make_world

pytestmark = pytest.mark.slow
WIDTHS = {"1280": {"width": 1280, "height": 860}, "390": {"width": 390, "height": 844}}
# Whether a select shows its chosen option's whole text: the text's width, its padding and its arrow fit.
WHOLE_NAME = """(s) => {
  const style = getComputedStyle(s), pen = document.createElement("canvas").getContext("2d");
  pen.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  const text = pen.measureText(s.options[s.selectedIndex].text).width;
  return text + parseFloat(style.paddingLeft) + parseFloat(style.paddingRight) + 16 <= s.clientWidth;
}"""
CLOCK = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")

# Each chart of the page: whether it animates, its x labels, and how each dataset is drawn.
CHARTS = """() => [...document.querySelectorAll('[data-chart-url] canvas')].map((canvas) => {
  const chart = Chart.getChart(canvas);
  return chart && { animation: chart.options.animation, labels: chart.data.labels,
    datasets: chart.data.datasets.map((d) => ({ label: d.label, stepped: d.stepped, tension: d.tension })) };
})"""


@pytest.fixture
def people(portal: Portal) -> World:
    return make_world()


def pictures(page: Page, name: str) -> None:
    for width, size in WIDTHS.items():
        page.set_viewport_size(size)
        page.wait_for_timeout(300)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size(WIDTHS["1280"])


def charts_of(page: Page) -> list[dict[str, object]]:
    page.wait_for_function("() => document.querySelector('[data-chart-url][data-loaded]')", timeout=30_000)
    charts = page.evaluate(CHARTS)
    assert charts and all(charts), charts
    return list(charts)


def test_charts_draw_at_once_as_steps_in_24_hour_time(
    page: Page, browser: Browser, portal: Portal, people: World
) -> None:
    sign_in(page, portal.url, "alice", PASSWORD)
    page.goto(f"{portal.url}/w/team-a/")
    for chart in charts_of(page):
        assert chart["animation"] is False
        labels = chart["labels"]
        assert isinstance(labels, list) and labels and all(CLOCK.match(label) for label in labels), labels
        held = [d for d in chart["datasets"] if d["label"].endswith(" in use")]  # type: ignore[index]
        assert held and all(d["stepped"] == "before" and d["tension"] == 0 for d in held), chart
    pictures(page, "polish-workspace-dashboard")

    admin = browser.new_page()
    sign_in(admin, portal.url, "admin", PASSWORD)
    admin.goto(f"{portal.url}/console/")
    for chart in charts_of(admin):
        assert chart["animation"] is False and all(CLOCK.match(label) for label in chart["labels"])  # type: ignore[attr-defined]
        assert all(d["stepped"] == "before" for d in chart["datasets"] if d["label"].endswith(" in use"))  # type: ignore[index]
    admin.close()


def test_a_refused_gpu_count_reads_in_full_width_with_the_focus_on_it(
    page: Page, portal: Portal, people: World
) -> None:
    sign_in(page, portal.url, "alice", PASSWORD)
    page.goto(f"{portal.url}/w/team-a/jobs/new/")
    page.get_by_label("Name").fill("train")
    page.get_by_label("Command").fill("true")
    page.get_by_label("GPUs per replica").fill("0.3")
    page.get_by_role("button", name="Submit").click()

    error = page.locator("#gpus_per_replica-error")
    expect(error).to_contain_text("0.3 GPUs: a share of one device is 0.25, 0.333, 0.5, 0.667 or 0.75")
    expect(page.get_by_label("GPUs per replica")).to_be_focused()
    row = page.locator("#gpus_per_replica-error").locator("xpath=ancestor::div[contains(@class,'row')][1]")
    for width, size in WIDTHS.items():
        page.set_viewport_size(size)
        page.wait_for_timeout(200)
        box, row_box = error.bounding_box(), row.bounding_box()
        assert box and row_box and box["width"] >= row_box["width"] - 2, (width, box, row_box)
        lines = box["height"] / float(error.locator("p").evaluate("(p) => parseFloat(getComputedStyle(p).lineHeight)"))
        assert lines <= (2.5 if width == "1280" else 4.5), (width, lines)
    pictures(page, "polish-job-form-refused")


def test_names_navigation_and_cards_read_whole(page: Page, browser: Browser, portal: Portal, people: World) -> None:
    Workspace.objects.filter(pk=people.team_a.pk).update(display_name="Computer vision group (shared)")
    sign_in(page, portal.url, "alice", PASSWORD)
    page.goto(f"{portal.url}/w/team-a/jobs/")
    switcher = page.locator("#workspace-switcher")
    assert switcher.get_attribute("title") == "Computer vision group (shared)"
    assert switcher.evaluate(WHOLE_NAME)  # the closed menu is wide enough for the whole name

    page.set_viewport_size(WIDTHS["390"])
    page.reload()  # as a phone opens it
    assert switcher.evaluate(WHOLE_NAME)  # on a phone too
    nav = page.locator("nav.sidenav")
    assert nav.evaluate("(n) => n.scrollWidth > n.clientWidth")  # one line that scrolls...
    layers = nav.evaluate("(n) => getComputedStyle(n).backgroundImage")
    assert layers.count("gradient") == 4, layers  # ...with a shadow at the edge beyond which links lie
    current = page.locator('nav.sidenav [aria-current="page"]')
    box, strip = current.bounding_box(), nav.bounding_box()
    assert box and strip and strip["x"] <= box["x"] and box["x"] + box["width"] <= strip["x"] + strip["width"]
    pictures(page, "polish-jobs-list")

    page.goto(f"{portal.url}/tokens/")
    expect(page.locator("#live-status")).to_have_count(0)  # nothing here changes by itself
    pictures(page, "polish-tokens")

    admin = browser.new_page()
    sign_in(admin, portal.url, "admin", PASSWORD)
    admin.goto(f"{portal.url}/console/")
    # Measured in one go: a live update may swap the cards between two questions.
    row, cards = admin.locator(".stats").evaluate(
        "(s) => [s.getBoundingClientRect().right, [...s.children].map((c) => c.getBoundingClientRect())"
        ".map((r) => [r.top, r.right])]"
    )
    assert len({round(top) for top, _ in cards}) == 1, cards  # one row at a desktop's width...
    assert max(right for _, right in cards) >= row - 2, (row, cards)  # ...that the cards fill, however many
    pictures(admin, "polish-console-dashboard")
    admin.goto(f"{portal.url}/console/workspaces/team-a/")
    pictures(admin, "polish-console-workspace")
    admin.goto(f"{portal.url}/console/profiles/")
    pictures(admin, "polish-console-profiles")
    admin.close()
