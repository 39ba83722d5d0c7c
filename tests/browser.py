"""Headless Chromium for page tests and screenshots: Debian's `chromium` and `chromium-driver`
(`apt-get install chromium chromium-driver`) driven by Selenium, with the driver given by path
(Selenium then downloads nothing)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} not found (apt-get install chromium chromium-driver)"
    return None


def open_browser(width: int = 1280, height: int = 900):
    """A headless Chromium WebDriver (quit it when done)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_for(check: Callable[[], Any], timeout: float = 30.0, every: float = 0.2) -> Any:
    """`check()` once it is truthy; AssertionError after `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout} s: {check}")
        time.sleep(every)
