"""Stage 3 drops a text that a site repeats on many of its pages, counted over every partition
(issue 33): `lait.filters.site_texts`."""

from __future__ import annotations

from lait.executor import LocalExecutor
from lait.filters.config import CleanConfig
from lait.filters.site_texts import site_of
from lait.filters.text_stage import CleanStage
from lait.workdir import partition_of

REPEATED = ["The Guardian", "Opel - Opel", "Author: Julia Franz", "Home News Sport Culture Lifestyle"]


def site_page(i: int, host: str = "www.news.test") -> str:
    # The repeated texts are a logo's alt, a logo's title, a byline beside the photo and a
    # navigation bar's label: none matches a pattern of the rules, only their count gives them away.
    return (f'<html lang="en"><body><header><img src="/static/logo-{i % 3}.png" alt="The Guardian">'
            f'<img src="/brands/opel.png" alt="Opel - Opel"></header>'
            f'<nav><img src="/nav.png" alt="Home News Sport Culture Lifestyle"></nav>'
            f'<article><figure><img src="/photos/{i}.jpg" alt="A ferry number {i} leaves the harbour at dawn">'
            f'<figcaption>Author: Julia Franz</figcaption></figure></article></body></html>')


def run_clean(work, **settings):
    # The count of a site's texts is tested, not where the images sit: the pages' logo and
    # byline would be dropped for their place first (clean/image_place).
    cfg = CleanConfig(work=str(work.root), progress=False, **{"rules_off": ["image_place"], **settings})
    cfg.validate()
    report = LocalExecutor(workers=1, retries=0, show_progress=False).run(CleanStage(cfg), work)
    assert report.ok, report.summary()
    return report


def kept_texts(work) -> dict[str, set[str]]:
    return {r["image_url"]: {t["text"] for t in r["texts"]} for r in work.iter_rows("candidates")}


def test_a_site_text_is_counted_over_every_partition(make_work, td):
    work = make_work(n_partitions=8)
    urls = [f"https://www.news.test/2024/story-{i}.html" for i in range(12)]
    # 12 pages over 8 partitions: no partition holds the 5 pages the limit asks for.
    assert max(sum(partition_of(u, 8) == p for u in urls) for p in range(8)) < 5
    td.write_table(work, "pages", [td.page_row(u, site_page(i)) for i, u in enumerate(urls)], "url")
    run_clean(work)
    kept = kept_texts(work)
    for i in range(12):
        assert kept[f"https://www.news.test/photos/{i}.jpg"] == {f"A ferry number {i} leaves the harbour at dawn"}
    assert not any(t in texts for texts in kept.values() for t in REPEATED)
    dropped = [r for r in work.iter_rows("rejected") if r["reason"] == "clean/site_boilerplate"]
    assert sorted({r["text"] for r in dropped}) == sorted(REPEATED)
    assert len({(r["text"], r["page_url"]) for r in dropped}) == 4 * 12  # each on every page
    assert {r["detail"] for r in dropped if r["text"] == "The Guardian"} == {"alt text on 12 of the 12 pages of news.test"}


def test_the_count_is_per_site_and_needs_enough_pages(make_work, td):
    work = make_work(n_partitions=4)
    rows = []
    for s in range(4):  # the same text on 3 pages of each of 4 sites: 12 pages, but 3 per site
        for i in range(3):
            rows.append(td.page_row(f"http://site{s}.test/p{i}.html",
                                    f'<html><body><img src="/p{i}.jpg" alt="A lighthouse on a rocky coast"></body></html>'))
    td.write_table(work, "pages", rows, "url")
    run_clean(work)
    kept = kept_texts(work)
    assert len(kept) == 12 and all(texts == {"A lighthouse on a rocky coast"} for texts in kept.values())
    assert not [r for r in work.iter_rows("rejected") if r["reason"] == "clean/site_boilerplate"]


def test_new_pages_of_a_site_redo_the_partitions_they_change(make_work, td):
    work = make_work(n_partitions=4)
    first = [td.page_row(f"http://blog.test/p{i}.html", site_page(i, "blog.test")) for i in range(3)]
    td.write_table(work, "pages", first, "url")
    run_clean(work)
    assert any("The Guardian" in texts for texts in kept_texts(work).values())  # 3 pages: under the limit
    more = [td.page_row(f"http://blog.test/q{i}.html", site_page(i + 3, "blog.test")) for i in range(5)]
    for part in {partition_of(r["url"], 4) for r in more}:  # new parts, as a later crawl writes them
        w = work.writer("pages", part, "later")
        w.write_many([r for r in more if partition_of(r["url"], 4) == part])
        w.close()
    report = run_clean(work)
    assert any(line.startswith("clean: site texts") for line in report.plan)
    assert not any("The Guardian" in texts for texts in kept_texts(work).values())


def test_a_site_is_its_host_without_www():
    assert site_of("https://WWW.News.test:8443/a") == site_of("http://news.test/b") == "news.test"
    assert site_of("http://blog.news.test/") == "blog.news.test"


def test_each_page_is_parsed_once_and_a_changed_page_redoes_its_partition(make_work, td, monkeypatch):
    # The count of site texts reads the extraction pass's rows (`page_texts/`): stage 3 parses
    # every page once, not once for the count and once for the partition.
    from lait.filters import extract_stage

    parsed: list[str] = []
    real = extract_stage.parse_page

    def counting(row, cfg):
        parsed.append(row["url"])
        return real(row, cfg)

    monkeypatch.setattr(extract_stage, "parse_page", counting)
    work = make_work(n_partitions=4)
    urls = [f"https://www.news.test/2024/story-{i}.html" for i in range(8)]
    td.write_table(work, "pages", [td.page_row(u, site_page(i)) for i, u in enumerate(urls)], "url")
    report = run_clean(work)
    assert sorted(parsed) == sorted(urls)
    assert {s["stage"] for s in report.stats} == {"clean_pages", "clean"}
    assert sum(s["counters"].get("clean/pages_in", 0) for s in report.stats) == 8
    assert not any(t in texts for texts in kept_texts(work).values() for t in REPEATED)

    parsed.clear()
    assert run_clean(work).done == [] and parsed == []  # nothing changed: nothing parsed again


def test_a_failed_extraction_partition_fails_the_run(make_work, td, monkeypatch):
    from lait.filters import extract_stage

    work = make_work(n_partitions=4)
    urls = [f"https://www.news.test/2024/story-{i}.html" for i in range(8)]
    td.write_table(work, "pages", [td.page_row(u, site_page(i)) for i, u in enumerate(urls)], "url")
    bad = partition_of(urls[0], 4)

    def broken(self, ctx):
        if ctx.partition == bad:
            raise OSError("disk gone")
        return real(self, ctx)

    real = extract_stage.ExtractStage.process
    monkeypatch.setattr(extract_stage.ExtractStage, "process", broken)
    cfg = CleanConfig(work=str(work.root), progress=False)
    report = LocalExecutor(workers=1, retries=0, show_progress=False).run(CleanStage(cfg), work)
    assert not report.ok and list(report.failed) == [bad]
    assert report.failed[bad].startswith("clean_pages: ")
