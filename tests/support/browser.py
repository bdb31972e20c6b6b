"""Screenshots of local HTML pages with headless Chromium (Debian's `chromium`, installed by
scripts/lib/setup.sh): what the report tests and the benchmark show a person.

    from tests.support.browser import screenshot
    screenshot("out/report.html", "out/report.png", width=1400, height=2000)

The page is loaded from the file (it must be self-contained: no network here) and the window,
`width` x `height` CSS pixels, is saved as PNG. Chromium missing or failing raises
`BrowserError` (tests that need it fail, they do not skip).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class BrowserError(RuntimeError):
    """Chromium is missing or did not write the screenshot."""


def chromium_path() -> str:
    """The Chromium binary (`CHROMIUM` in the environment overrides)."""
    for candidate in (os.environ.get("CHROMIUM"), *CHROMIUM_CANDIDATES):
        if candidate and (found := shutil.which(candidate)):
            return found
    raise BrowserError(
        "headless Chromium not found: install Debian's `chromium` package "
        "(scripts/lib/setup.sh does: apt-get install -y chromium) or set CHROMIUM"
    )


def screenshot(
    html_path: str | os.PathLike[str],
    png_path: str | os.PathLike[str],
    *,
    width: int = 1400,
    height: int = 1800,
    timeout_s: float = 60.0,
) -> Path:
    """Load `html_path` in headless Chromium with a `width` x `height` window and write what
    it shows to `png_path` (PNG); returns that path."""
    page = Path(html_path).resolve(strict=True)
    out = Path(png_path).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [
            chromium_path(),
            "--headless",
            "--no-sandbox",  # tests run as root here
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={out}",
            page.as_uri(),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise BrowserError(f"chromium took longer than {timeout_s} s on {page}") from exc
    if not out.exists() or out.read_bytes()[:8] != PNG_MAGIC:
        raise BrowserError(
            f"chromium wrote no screenshot of {page} (exit {proc.returncode}):\n"
            f"{proc.stderr[-2000:]}"
        )
    return out


def dump_dom(
    html_path: str | os.PathLike[str],
    *,
    width: int = 1400,
    height: int = 1800,
    timeout_s: float = 60.0,
) -> str:
    """The page's DOM (serialized HTML) after Chromium loaded it and ran its scripts, in a
    `width` x `height` window: a test can let a script write measurements into the page."""
    page = Path(html_path).resolve(strict=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [
            chromium_path(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "--virtual-time-budget=2000",
            "--dump-dom",
            page.as_uri(),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise BrowserError(f"chromium took longer than {timeout_s} s on {page}") from exc
    if proc.returncode != 0 or "<html" not in proc.stdout:
        raise BrowserError(
            f"chromium dumped no DOM of {page} (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
        )
    return proc.stdout


def png_size(png_path: str | os.PathLike[str]) -> tuple[int, int]:
    """(width, height) of a PNG, from its header."""
    head = Path(png_path).read_bytes()[:24]
    if head[:8] != PNG_MAGIC:
        raise ValueError(f"{png_path} is not a PNG")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
