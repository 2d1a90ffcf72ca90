"""The API docs on a phone: a real mobile viewport (the page's viewport meta honoured, as a
phone does) 390 px wide lays the page out at 390 px and nothing scrolls sideways."""

import pytest

from .support.browser import sign_in
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_api_docs_fit_a_phone(browser, server):
    full_staff("phone")
    context = browser.new_context(
        viewport={"width": 390, "height": 844},
        is_mobile=True,
        has_touch=True,
        device_scale_factor=3,
    )
    page = context.new_page()
    sign_in(page, server, "phone")
    page.goto(server + "/api/docs")
    page.wait_for_selector(".opblock", timeout=20000)
    page.locator(".opblock-summary").first.click()  # an operation opened: its body fits too
    page.wait_for_selector(".opblock.is-open .opblock-body", timeout=10000)
    layout_width, scroll_width = page.evaluate(
        "[window.innerWidth, document.scrollingElement.scrollWidth]"
    )
    assert layout_width == 390  # without the viewport meta a phone lays out 980 px and zooms
    assert scroll_width <= 390, scroll_width
    assert page.locator("a:text('← convoyweb')").get_attribute("href") == "/"
    context.close()
