"""Read the built book in a real browser, as a reader would, and fail on what a reader would see as broken.

    python tests/browser_check.py [_build/html] [--screenshots _build/screenshots] [--json _build/browser-report.json]

Opens every page of the built HTML book in headless Chromium (Debian's ``chromium`` package; ``make browser-deps``
installs it) served over a local HTTP server, waits for MathJax to finish typesetting, and checks, per page:

* ``mathjax``   a MathJax error (``mjx-merror``) or TeX left untypeset in the text (``$…$``, ``\\begin{``, ``\\frac``);
* ``wide``      at 1280 px: a display equation, table, image or figure whose rendered box is wider than the
                article column or sticks out of it (the column is the content box of ``article.bd-article``);
* ``image``     an image that did not load (``naturalWidth`` 0);
* ``raw-table`` Markdown table syntax in the text (``|---|``, or ``|—|`` after typographic dashes), i.e. a table
                that was not parsed;
* ``nan``       ``nan``, ``NaN`` or ``None`` as a word in the text (code cells excluded; "None of" is English);
* ``leak``      ``{glue`` or ``PosixPath`` in the text (an unresolved glue or a machine path);
* ``provenance`` a figure without a provenance line. A provenance line is the text of ``Result.provenance()``:
                ``profile <name>, computed on <device>, commit …``; it is recognised by the regular expression
                ``profile \\S+, computed on`` in the figure itself (caption) or in one of the two blocks right after it.

At 390 px the same geometry check is reported as warnings (``wide@390``) without failing, and so is error output
(stderr, tracebacks) shown on a page. A full-page screenshot
per page and width is saved under ``--screenshots`` for reviewers. Prints a per-page report and a count per kind;
exits 1 when any check failed, 2 when the browser or the book is missing.

The browser is driven with the Chrome DevTools protocol over ``--remote-debugging-pipe`` using only the standard
library: no driver, no browser download, nothing to pin.
"""

from __future__ import annotations

import argparse
import base64
import collections
import fcntl
import functools
import http.server
import io
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# After a change of width the theme slides its primary sidebar off-canvas (a CSS transition of about 0.3 s); a
# check or screenshot taken before it ends sees the drawer half-way across the text.
SETTLE_ANIMATIONS_JS = """new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => {
  const running = document.getAnimations().filter((a) => a.playState === "running").map((a) => a.finished.catch(() => 0));
  Promise.race([Promise.all(running), new Promise((t) => setTimeout(t, 3000))])
    .then(() => requestAnimationFrame(() => r(running.length)));
})))"""
ONE_SHOT = 16000  # px: a page up to this tall is captured in one piece
MAX_SHOT = 60000  # px: a stitched screenshot stops here (JPEG allows 65 535)
HIDE_STICKY_JS = """for (const el of document.querySelectorAll("body *")) {
  const pos = getComputedStyle(el).position;
  if (pos === "sticky" || pos === "fixed") { el.dataset.gsVis = el.style.visibility; el.style.visibility = "hidden"; }
}"""
SHOW_STICKY_JS = """for (const el of document.querySelectorAll("[data-gs-vis]")) {
  el.style.visibility = el.dataset.gsVis; delete el.dataset.gsVis;
}
window.scrollTo(0, 0);"""
WIDTHS = {"1280": dict(width=1280, height=900, deviceScaleFactor=1, mobile=False),
          "390": dict(width=390, height=844, deviceScaleFactor=1, mobile=True)}
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
                "--force-device-scale-factor=1", "--remote-debugging-pipe"]
SKIP_DIRS = {"_static", "_sources", "_images", "_downloads"}
PAGE_TIMEOUT = 30.0


def _whole_chars(v):
    """Strings from the page with lone UTF-16 surrogates (a JavaScript ``slice`` can cut a math letter such as 𝜎 in
    half) replaced by U+FFFD, recursively, so that printing and JSON never fail on them."""
    if isinstance(v, str):
        return v.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(v, list):
        return [_whole_chars(x) for x in v]
    if isinstance(v, dict):
        return {k: _whole_chars(x) for k, x in v.items()}
    return v


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise BrowserError("no Chromium found: install Debian's package with `make browser-deps` "
                       "(apt-get install -y chromium) or set CHROMIUM=/path/to/chromium")


class Chromium:
    """A headless Chromium driven over the DevTools pipe (fd 3: commands in, fd 4: replies out, NUL-separated)."""

    def __init__(self, exe: str):
        self.profile = tempfile.mkdtemp(prefix="grokspectra-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def child_fds():  # runs in the child between fork and exec
            a = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        self.proc = subprocess.Popen([exe, *CHROME_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     preexec_fn=child_fds, close_fds=False)
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        version = self.call("Browser.getVersion", timeout=30)
        self.version = version.get("product", "?")

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for the browser")
            ready, _, _ = select.select([self._out_r], [], [], left)
            if ready:
                chunk = os.read(self._out_r, 1 << 20)
                if not chunk:
                    raise BrowserError(f"the browser exited (code {self.proc.poll()}); see {self.log.name}")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = PAGE_TIMEOUT):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, session: str, timeout: float = PAGE_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("method") == method and ev.get("sessionId") == session:
                    return self.events.pop(i)
            msg = self._read_message(deadline)
            if "method" in msg:
                self.events.append(msg)

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Chromium):
        self.b = browser
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page.enable", "Runtime.enable"):
            self.call(domain)

    def call(self, method, params=None, timeout=PAGE_TIMEOUT):
        return self.b.call(method, params, self.session, timeout)

    def viewport(self, name: str):
        self.call("Emulation.setDeviceMetricsOverride", WIDTHS[name])

    def goto(self, url: str):
        self.b.events = [e for e in self.b.events if e.get("sessionId") != self.session]
        reply = self.call("Page.navigate", {"url": url})
        if reply.get("errorText"):
            raise BrowserError(f"cannot open {url}: {reply['errorText']}")
        self.b.wait_event("Page.loadEventFired", self.session)

    def js(self, expression: str, timeout: float = PAGE_TIMEOUT):
        r = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True},
                      timeout=timeout)
        if "exceptionDetails" in r:
            raise BrowserError(f"script error: {r['exceptionDetails'].get('exception', {}).get('description') or r['exceptionDetails'].get('text')}")
        return _whole_chars(r["result"].get("value"))

    def screenshot(self, path: Path, width: int):
        """A full-page JPEG. Up to ``ONE_SHOT`` px tall, one capture beyond the viewport; a taller page is captured
        viewport by viewport while scrolling and stitched (Chromium lays a page taller than its largest texture,
        16 384 px, out at another width when asked to capture it whole: the sidebar vanished and the article
        shifted). Sticky and fixed elements (header, sidebars) are hidden after the first viewport, as they scroll
        away in a one-shot capture."""
        height = int(self.js("Math.ceil(Math.max(document.documentElement.scrollHeight, document.body.scrollHeight))"))
        if height <= ONE_SHOT:
            data = self.call("Page.captureScreenshot", {"format": "jpeg", "quality": 85, "captureBeyondViewport": True,
                                                        "fromSurface": True, "clip": {"x": 0, "y": 0, "width": width,
                                                                                      "height": max(1, height), "scale": 1}},
                             timeout=60)["data"]
            path.write_bytes(base64.b64decode(data))
            return
        from PIL import Image  # matplotlib's dependency, so in the environment

        height = min(height, MAX_SHOT)
        out, y = Image.new("RGB", (width, height), "white"), 0
        while y < height:
            sy = int(self.js(f"new Promise((r) => {{ window.scrollTo(0, {y}); requestAnimationFrame(() => "
                             "requestAnimationFrame(() => r(window.scrollY))); })"))
            data = self.call("Page.captureScreenshot", {"format": "png", "fromSurface": True}, timeout=60)["data"]
            tile = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
            out.paste(tile.crop((0, y - sy, width, tile.height)), (0, y))
            if y == 0:
                self.js(HIDE_STICKY_JS)
            y = sy + tile.height
        self.js(SHOW_STICKY_JS)
        out.save(path, quality=85)


# Waits for MathJax's first typeset, web fonts and every image (lazy ones are made eager), then one frame.
SETTLE_JS = r"""
(async () => {
  const timeout = (ms) => new Promise((r) => setTimeout(r, ms));
  const mj = (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) || null;
  let mathjax = "absent";
  if (document.querySelector('script[src*="mathjax"]')) {
    for (let i = 0; i < 100 && !(window.MathJax && window.MathJax.startup && window.MathJax.startup.promise); i++)
      await timeout(50);
    if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
      mathjax = await Promise.race([window.MathJax.startup.promise.then(() => "ok"), timeout(20000).then(() => "timeout")]);
    } else mathjax = "not started";
  }
  const imgs = Array.from(document.images);
  imgs.forEach((im) => { if (im.loading === "lazy") im.loading = "eager"; });
  await Promise.race([Promise.all(imgs.map((im) => im.complete ? null :
    new Promise((r) => { im.addEventListener("load", r); im.addEventListener("error", r); }))), timeout(10000)]);
  if (document.fonts) await Promise.race([document.fonts.ready, timeout(5000)]);
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  return mathjax;
})()
"""

# Geometry: every display equation, table, image and figure against the article column.
GEOMETRY_JS = r"""
(() => {
  const art = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
  const cs = getComputedStyle(art), ar = art.getBoundingClientRect();
  const left = ar.left + parseFloat(cs.paddingLeft), right = ar.right - parseFloat(cs.paddingRight);
  const out = [];
  const TOL = 3;  // px: borders and sub-pixel rounding of a table sized to the column are not an overflow
  const label = (el) => {
    const eq = el.closest("div.math");
    if (eq) {
      const no = eq.querySelector(".eqno");
      return "equation " + (no ? no.textContent.replace(/[^\d.()]/g, "") : "") + (eq.id ? " #" + eq.id : "");
    }
    const fig = el.closest("figure");
    if (fig) return "figure" + (fig.id ? " #" + fig.id : "") + ": " + ((fig.querySelector("figcaption") || {}).textContent || "").trim().slice(0, 60);
    if (el.tagName === "TABLE") return "table: " + el.innerText.trim().slice(0, 60).replace(/\s+/g, " ");
    return el.tagName.toLowerCase() + (el.id ? " #" + el.id : "") + (el.src ? " " + el.src.split("/").pop() : "");
  };
  // the visible box of an element: the column, cut by every ancestor that clips or scrolls its overflow
  const visible = (el) => {
    let lo = left, hi = right;
    for (let a = el; a && a !== art; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== "visible") {
        const r = a.getBoundingClientRect();
        lo = Math.max(lo, r.left + a.clientLeft);
        hi = Math.min(hi, r.left + a.clientLeft + a.clientWidth);
      }
    }
    return [lo, hi];
  };
  // the extent of what an element draws: its own box, and for typeset math every glyph in it
  const extent = (el) => {
    const r = el.getBoundingClientRect();
    let lo = r.left, hi = r.right;
    if (el.tagName === "MJX-CONTAINER") {
      for (const g of el.querySelectorAll("mjx-c, mjx-mi, mjx-mo, mjx-mn, mjx-mtext")) {
        const q = g.getBoundingClientRect();
        if (q.width > 0) { lo = Math.min(lo, q.left); hi = Math.max(hi, q.right); }
      }
    }
    return [lo, hi, r.width];
  };
  const sel = 'mjx-container[display="true"], table, img, figure, .cell_output svg, .output svg';
  for (const el of art.querySelectorAll(sel)) {
    if (!el.checkVisibility || !el.checkVisibility()) continue;
    if (el.getBoundingClientRect().width === 0) continue;
    const [lo, hi] = el.tagName === "MJX-CONTAINER" ? visible(el) : [left, right];
    const [a, b] = extent(el);
    const over = Math.max(b - hi, lo - a);
    if (over > TOL) out.push({what: label(el), width: Math.round(b - a), column: Math.round(hi - lo),
                            over: Math.round(over)});
  }
  return {column: Math.round(right - left), wide: out};
})()
"""

# Content checks on the rendered text and elements.
CONTENT_JS = r"""
(() => {
  const art = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
  const res = {mathjax: [], image: [], rawtable: [], nan: [], leak: [], provenance: [], stats: {}};
  // MathJax errors
  for (const e of document.querySelectorAll("mjx-merror, [data-mjx-error]")) {
    const c = e.closest("mjx-container");
    let tex = "";
    try { tex = window.MathJax.startup.document.getMathItemsWithin(c)[0].math; } catch (err) {}
    res.mathjax.push(((e.getAttribute("data-mjx-error") || e.textContent || "error") + (tex ? " in: " + tex : "")).slice(0, 160));
  }
  // images
  for (const im of art.querySelectorAll("img")) {
    if (im.naturalWidth === 0) res.image.push((im.getAttribute("src") || "?").slice(0, 120));
  }
  // visible text outside code cells and typeset math, one entry per text node
  const skip = "pre, code, script, style, mjx-container, .cell_input, .highlight, .headerlink, .MathJax_Preview";
  const walker = document.createTreeWalker(art, NodeFilter.SHOW_TEXT);
  const pieces = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const p = n.parentElement;
    if (!p || p.closest(skip)) continue;
    if (p.checkVisibility && !p.checkVisibility()) continue;
    if (n.textContent.trim()) pieces.push(n.textContent);
  }
  const text = pieces.join(" ");
  const ctx = (s, i, len) => s.slice(Math.max(0, i - 50), i + len + 50).replace(/\s+/g, " ").trim();
  const each = (re, s, sink, len) => { let m; while ((m = re.exec(s)) !== null) sink.push(ctx(s, m.index, m[0].length)); };
  // block-level text keeps line structure for the table check
  const blockText = art.innerText;
  // the separator row of a Markdown table; typographic quotes turn "---" into an em dash, "--" into an en dash
  each(/(?:\|\s*:?(?:-{3,}|[\u2013\u2014]+)\s*:?\s*)+\|/g, blockText, res.rawtable, 10);
  each(/\$\$|\\begin\{|\\frac\b|\\mathbb\b|\$[^$\n]{1,80}\$/g, text, res.mathjax, 8);
  // error output shown to the reader (warnings, tracebacks): reported, not failed
  res.stderr = Array.from(art.querySelectorAll(".stderr, .output.error, .output.traceback"))
    .filter((e) => !e.checkVisibility || e.checkVisibility()).map((e) => e.innerText.trim().slice(0, 100));
  each(/(?<![\w.-])(nan|NaN)(?![\w-])|\bNone\b(?! of\b)/g, text, res.nan, 4);
  // leaks: unresolved glue, machine paths (also in outputs of code cells)
  const all = art.innerText;
  each(/\{glue|PosixPath/g, all, res.leak, 10);
  // figures without provenance
  const prov = /profile\s+\S+,\s+computed on/;
  const figs = Array.from(art.querySelectorAll("figure"));
  for (const im of art.querySelectorAll(".cell_output img, .output img")) if (!im.closest("figure")) figs.push(im.closest(".cell") || im);
  const blocks = (el) => {
    const out = [el];
    let s = el;
    for (let k = 0; k < 2; k++) {
      while (s && !s.nextElementSibling && s.parentElement && s.parentElement !== art) s = s.parentElement;
      s = s && s.nextElementSibling;
      if (!s || s.matches("figure, section, h1, h2, h3, h4") || s.querySelector("figure")) break;
      out.push(s);
    }
    return out;
  };
  for (const f of figs) {
    if (!blocks(f).some((b) => prov.test(b.innerText || ""))) {
      const cap = f.querySelector && f.querySelector("figcaption");
      res.provenance.push(((f.id ? "#" + f.id + " " : "") + ((cap && cap.innerText) || "").trim()).slice(0, 100));
    }
  }
  res.stats = {equations: art.querySelectorAll('mjx-container[display="true"]').length,
               figures: figs.length, tables: art.querySelectorAll("table").length};
  return res;
})()
"""

KINDS = ["load", "mathjax", "wide", "image", "raw-table", "nan", "leak", "provenance"]


def pages_of(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*.html")):
        rel = p.relative_to(root)
        if rel.parts[0] in SKIP_DIRS or rel.name in ("genindex.html", "search.html"):
            continue
        head = p.read_text(errors="replace")[:2000].lower()
        if 'http-equiv="refresh"' in head and "bd-article" not in head:
            continue  # a redirect (index.html -> the root page)
        out.append(rel)
    # reading order: index first, then the chapters, then the rest
    return sorted(out, key=lambda r: (r.name != "index.html", "generated" not in r.parts, str(r)))


def serve(root: Path):
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def check_page(page: Page, url: str, shots: Path | None, stem: str) -> tuple[list[tuple[str, str]], list[str], dict]:
    fails: list[tuple[str, str]] = []
    warns: list[str] = []
    stats: dict = {}
    for name in ("1280", "390"):
        page.viewport(name)
        if name == "1280":
            page.goto(url)
            mj = page.js(SETTLE_JS, timeout=45)
            if mj not in ("ok", "absent"):
                fails.append(("mathjax", f"MathJax did not finish ({mj})"))
        else:  # the same document re-laid out at the narrow width, once the transitions it starts have ended
            page.js(SETTLE_ANIMATIONS_JS)
        geo = page.js(GEOMETRY_JS)
        for w in geo["wide"]:
            line = f"{w['what']}: {w['width']} px, sticks out {w['over']} px (column {w['column']} px)"
            if name == "1280":
                fails.append(("wide", line))
            else:
                warns.append(f"wide@390 {line}")
        if name == "1280":
            c = page.js(CONTENT_JS)
            stats = c["stats"]
            warns += [f"stderr     {x}" for x in c["stderr"]]
            for kind, key in (("mathjax", "mathjax"), ("image", "image"), ("raw-table", "rawtable"), ("nan", "nan"),
                              ("leak", "leak"), ("provenance", "provenance")):
                fails += [(kind, x) for x in c[key]]
        if shots is not None:
            page.screenshot(shots / f"{stem}@{name}.jpg", WIDTHS[name]["width"])
    return fails, warns, stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html", nargs="?", default="_build/html", help="the built book (default _build/html)")
    ap.add_argument("--screenshots", default="_build/screenshots", help="folder for screenshots ('' for none)")
    ap.add_argument("--json", default="_build/browser-report.json", help="machine-readable report ('' for none)")
    ap.add_argument("--page", action="append", default=[], help="check only pages whose path contains this")
    args = ap.parse_args(argv)
    root = Path(args.html)
    if not (root / "index.html").is_file():
        print(f"browser check: no built book at {root} (run `make book` first)")
        return 2
    try:
        exe = find_chromium()
    except BrowserError as e:
        print(f"browser check: {e}")
        return 2
    shots = Path(args.screenshots) if args.screenshots else None
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
    pages = [p for p in pages_of(root) if not args.page or any(s in str(p) for s in args.page)]
    t0 = time.monotonic()
    httpd, base = serve(root)
    browser = Chromium(exe)
    print(f"browser check: {len(pages)} pages of {root} in {browser.version} (headless), widths 1280 and 390 px")
    report, counts = {}, collections.Counter()
    try:
        page = Page(browser)
        for rel in pages:
            t = time.monotonic()
            stem = str(rel.with_suffix("")).replace("/", "__")
            try:
                fails, warns, stats = check_page(page, f"{base}/{rel.as_posix()}", shots, stem)
            except BrowserError as e:
                fails, warns, stats = [("load", str(e))], [], {}
            dt = time.monotonic() - t
            counts.update(k for k, _ in fails)
            report[str(rel)] = {"failures": [{"kind": k, "detail": d} for k, d in fails], "warnings": warns,
                                "stats": stats, "seconds": round(dt, 2)}
            info = ", ".join(f"{v} {k}" for k, v in stats.items())
            print(f"{'FAIL' if fails else 'ok  '} {rel}  ({dt:.1f} s; {info})")
            for k, d in fails:
                print(f"     {k:<10} {d}")
            for w in warns:
                print(f"     warn       {w}")
    finally:
        browser.close()
        httpd.shutdown()
    total = time.monotonic() - t0
    n_fail = sum(1 for r in report.values() if r["failures"])
    summary = ", ".join(f"{counts[k]} {k}" for k in KINDS if counts[k]) or "none"
    print(f"browser check: {len(pages) - n_fail} of {len(pages)} pages clean; failures by kind: {summary}; "
          f"{total:.0f} s" + (f"; screenshots in {shots}" if shots else ""))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"pages": report, "counts": dict(counts), "seconds": round(total, 1)},
                                              indent=1))
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
