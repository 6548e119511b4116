"""Load time of a report's ``index.html`` in headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven
by selenium), with screenshots of the top of the page and of the sample browser.

    python benchmarks/report_page.py runs/quickstart/report/index.html --shots /tmp/quickstart
    python benchmarks/report_page.py runs/quickstart/report/index.html --select f-filter=2 f-view=fa

``--select ID=VALUE`` picks an option of the browser's controls (by value, else by visible text) before the
sample screenshot. Prints the page size, DOMContentLoaded, the load event, when the first page of samples was
rendered (ms since navigation) and the sample count; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path, help="an index.html written by halsift")
    ap.add_argument("--shots", default="", help="screenshot prefix: writes PREFIX_top.png and PREFIX_samples.png")
    ap.add_argument("--select", nargs="*", default=[], metavar="ID=VALUE", help="browser controls to set first")
    ap.add_argument("--repeat", type=int, default=3, help="page loads to time")
    args = ap.parse_args(argv)
    from selenium import webdriver
    from selenium.common.exceptions import NoSuchElementException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import Select

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        print(f"{args.page}: {args.page.stat().st_size / 1e6:.2f} MB")
        for i in range(args.repeat):
            t0 = time.perf_counter()
            driver.get(args.page.resolve().as_uri())
            wall = 1000 * (time.perf_counter() - t0)
            dom, load = driver.execute_script("const n = performance.getEntriesByType('navigation')[0]; "
                                              "return [n.domContentLoadedEventEnd, n.loadEventEnd]")
            first = driver.execute_script("return window.halsiftRenderedMs || -1")
            print(f"load {i + 1}: DOMContentLoaded {dom:.0f} ms, load event {load:.0f} ms, first page of samples "
                  f"{first:.0f} ms (driver.get {wall:.0f} ms)")
        count = driver.find_elements("id", "count")
        print("samples:", count[0].text if count else "none on this page")
        if args.shots:
            driver.save_screenshot(f"{args.shots}_top.png")
        for spec in args.select:
            key, _, value = spec.partition("=")
            box = Select(driver.find_element("id", key))
            try:
                box.select_by_value(value)
            except NoSuchElementException:  # not a value: try the option's label
                box.select_by_visible_text(value)
        if args.select and count:
            print("after", " ".join(args.select) + ":", driver.find_element("id", "count").text)
        if args.shots and count:
            driver.execute_script("document.getElementById('browser').scrollIntoView()")
            driver.save_screenshot(f"{args.shots}_samples.png")
            print(f"screenshots: {args.shots}_top.png, {args.shots}_samples.png")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
