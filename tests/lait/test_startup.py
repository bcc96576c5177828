"""lait.startup: stage 1's processes never import pandas for pyarrow's check, and nothing else changes;
nor aiohttp for Scrapy's remote control, which is off (lait.crawler.settings)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from kit.photos import PhotoServer, PhotoSite, coco_photos
from kit.pipeline_kit import write_csv

AFTER_THE_SKIP = textwrap.dedent("""
    import sys
    from lait.startup import skip_pandas_probe
    assert skip_pandas_probe()
    from lait.workdir import WorkDir
    work = WorkDir(sys.argv[1], n_partitions=2).init()
    import pyarrow as pa
    table = pa.Table.from_pylist([{"a": 1, "b": None}, {"a": None, "b": "x"}])
    assert table.column("a").null_count == 1 and table.column("b").null_count == 1
    assert "pandas" not in sys.modules, "pyarrow's first conversion imported pandas"
    # pandas still imports, and pyarrow's pandas calls switch its support back on
    import pandas as pd
    frame = pa.Table.from_pandas(pd.DataFrame({"a": [1.0, None]}))
    assert frame.column("a").null_count == 1
    assert frame.to_pandas()["a"].isna().tolist() == [False, True]
    assert pa.array(pd.Series([1.0, None])).null_count == 1  # a Series is a Series again
    print("ok")
""")


def test_after_the_skip_pyarrow_converts_as_before_and_pandas_still_works(tmp_path):
    done = subprocess.run([sys.executable, "-c", AFTER_THE_SKIP, str(tmp_path / "W")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_skip_is_a_no_op_once_pandas_is_imported():
    code = "import pandas, sys\nfrom lait.startup import skip_pandas_probe\nprint(skip_pandas_probe())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-3000:]


def test_lait_download_and_its_fetchers_never_import_pandas(shared_data, tmp_path):
    """Python's import log of every process of a real `lait download` (the command and its fetcher
    process, which inherits PYTHONPROFILEIMPORTTIME) holds no module of pandas, nor aiohttp."""
    photos = coco_photos(shared_data / "photos" / "coco_train")[:6]
    server = PhotoServer(PhotoSite({f"/p/{p.name}": p.read_bytes() for p, _ in photos}), host="127.0.19.21").start()
    try:
        listing = write_csv(tmp_path / "list.csv",
                            [{"url": f"{server.url}/p/{p.name}", "caption": c} for p, c in photos])
        env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
        done = subprocess.run([sys.executable, "-m", "lait", "download", str(listing), "--out", str(tmp_path / "W"),
                               "--allow-loopback", "--no-autothrottle", "--processes", "2", "--no-progress",
                               "--log-level", "WARNING"], capture_output=True, text=True, timeout=300, env=env)
    finally:
        server.close()
    assert done.returncode == 0, done.stderr[-3000:]
    imported = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "scrapy.crawler" in imported and "pyarrow.lib" in imported  # the fetchers' log is there too
    # pyarrow's refused attempts are logged as a bare `pandas` of a few microseconds; pandas itself
    # would bring its submodules (pandas._libs, pandas.core, ...)
    assert not [m for m in imported if m.startswith("pandas.")]
    # nor Scrapy's remote control, which is off, and its aiohttp (lait.crawler.settings)
    assert "scrapy.extensions.remote_control" not in imported and "aiohttp" not in imported
    assert '"crawl/image_ok": 6' in done.stderr
