"""Lighthouse scores of lab pages, served by nginx with gzip as a static host would.

Needs: npm (installs lighthouse into .cache/lighthouse on first use), Debian's
nginx and chromium (`apt-get install nginx chromium`). Builds the site, serves
it on 127.0.0.1, audits each lab page three times (mobile preset, Lighthouse
defaults) and prints the four category scores of the median-performance run. Targets: accessibility, best practices and SEO
100; performance >= 98.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infralens_docs.registry import ROOT, load_labs

LIGHTHOUSE_VERSION = "13.5.0"
PREFIX = ROOT / ".cache" / "lighthouse"
CHROME_FLAGS = (
    "--headless --no-sandbox --disable-gpu --disable-background-networking "
    "--disable-component-update --disable-sync --no-first-run"
)
NGINX_CONF = """
worker_processes 1;
error_log {tmp}/error.log;
pid {tmp}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    include /etc/nginx/mime.types;
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    gzip on;
    gzip_types text/css application/javascript application/json image/svg+xml text/plain;
    server {{
        listen 127.0.0.1:{port};
        root {site};
        location /assets/ {{ expires 1y; }}
    }}
}}
"""


RUNS = 3  # audits per page; the median performance run is reported


def audit(lighthouse: Path, url: str, tmp: Path, chromium: str) -> dict:
    """One Lighthouse run (mobile preset, Lighthouse defaults); the parsed JSON report."""
    report = tmp / "report.json"
    subprocess.run(
        [str(lighthouse), url, "--quiet", "--output=json", f"--output-path={report}",
         f"--chrome-flags={CHROME_FLAGS}"],
        env=dict(os.environ, CHROME_PATH=chromium), check=True,
    )  # fmt: skip
    return json.loads(report.read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    if not (PREFIX / "node_modules" / ".bin" / "lighthouse").exists():
        PREFIX.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", f"lighthouse@{LIGHTHOUSE_VERSION}"],
            cwd=PREFIX, check=True,
        )  # fmt: skip
    lighthouse = PREFIX / "node_modules" / ".bin" / "lighthouse"
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # nginx's workers drop root and must read the site
        site = Path(tmp) / "site"
        env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
        subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
            cwd=ROOT, env=env, check=True,
        )  # fmt: skip
        port = free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, site=site))
        nginx = subprocess.Popen(["nginx", "-c", str(conf), "-g", "daemon off;"])
        try:
            time.sleep(0.5)
            for lab in load_labs():
                url = f"http://127.0.0.1:{port}/{lab.page.with_suffix('').as_posix()}/"
                runs = [audit(lighthouse, url, Path(tmp), chromium) for _ in range(RUNS)]
                # Lighthouse's own advice: performance varies run to run; report the median run.
                runs.sort(key=lambda r: r["categories"]["performance"]["score"])
                result = runs[len(runs) // 2]
                categories = result["categories"]
                scores = {k: round(v["score"] * 100) for k, v in categories.items()}
                print(f"{lab.id:40s} " + "  ".join(f"{k} {v}" for k, v in scores.items()))
                for key in ("performance", "accessibility", "best-practices", "seo"):
                    for ref in categories[key]["auditRefs"]:
                        check = result["audits"][ref["id"]]
                        if ref["weight"] and check["score"] is not None and check["score"] < 1:
                            shown = check.get("displayValue", "")
                            print(f"    {key}: {ref['id']} score {check['score']:.2f} {shown}")
                ok &= scores["performance"] >= 98 and all(
                    scores[k] == 100 for k in ("accessibility", "best-practices", "seo")
                )
        finally:
            nginx.terminate()
            nginx.wait()
    print("targets met" if ok else "targets NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
