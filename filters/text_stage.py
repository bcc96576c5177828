"""Stage 3, `lait clean`: sentence detection and cleaning, pages/ -> candidates/ (by image URL).

`CleanStage` runs the extraction pass first (`lait.filters.extract_stage.ExtractStage`: each
page decoded and parsed once by `lait.filters.html_pages`, every image with its alt, title,
aria, figcaption and og texts, and the main-content sentences nearest to it as `context`
candidates; where each image sits decides first, `lait.filters.image_place`, so that every
text of a logo, avatar, icon or menu picture, and the texts of a teaser that repeat a link, are
dropped as `clean/image_place` before the texts of the page get their owners). Then, per
partition of `page_texts/`: texts are repaired (ftfy), long ones split into sentences, and run
through the rules of `lait.filters.text_rules`, short ones with the page's declared language as
the language rule's prior; a text the site cut short is mended from the page or dropped
(`clean/cut`); texts offered to images on many pages of a site, counted over every page of the
work directory before the partitions run (`lait.filters.site_texts`), are dropped as
`clean/site_boilerplate`. With the learned judge on (`caption_judge: default` or a path of
weights), the texts that every rule kept then go, a partition at a time, to the learned caption
judge (`lait.filters.caption_judge`), which drops the ones it reads as junk as
`clean/not_caption`. Each (page, image) pair with at least one text goes to the candidates
partition of its image URL. A page that breaks the parser or runs past the time limit is
rejected with its reason; the partition goes on. The rows of URL lists (`url_list/`, `lait
download`) add their captions as candidates with source `list`, and the image links of WAT
files (`warc_links/` rows of source `wat`, `lait ingest-warc`) their alt and title texts as
`alt` and `title` candidates, under the same rules. The settings are `CleanConfig`
(`lait.filters.config`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple
from urllib.parse import urlsplit

from lait.filters.caption_judge import JUDGED_SOURCES

# The settings, the page reading and the extraction pass lived here before they had modules of
# their own (filters/config.py, html_pages.py, extract_stage.py): their names stay importable.
from lait.filters.config import SOURCES, CleanConfig, skippable_rules  # noqa: F401
from lait.filters.extract_stage import (  # noqa: F401
    ExtractStage,
    PageTexts,
    offered,
    page_candidates,
    page_texts_json,
    page_texts_of,
    read_page_texts,
)
from lait.filters.html_pages import (  # noqa: F401
    PAGE_COLUMNS,
    PageRejected,
    PageTimeout,
    decode_page,
    parse_page,
    time_limit,
)
from lait.filters.site_texts import SiteCounts, load_site_texts, site_of, site_texts_step, step_digest, text_key
from lait.filters.text_rules import TextRules, text_filters
from lait.parts import PartContext
from lait.rules import Filter, KeepResult, first_rejection
from lait.stage import Stage
from lait.workdir import partition_of


class Offered(NamedTuple):
    """A text offered to an image, as the rules that read its page's site see it."""

    source: str
    text: str


@dataclass
class SiteBoilerplateFilter(Filter):
    """A text its site offers images on many of its pages (`lait.filters.site_texts`)."""

    repeated: SiteCounts
    site: str
    name: ClassVar[str] = "site_boilerplate"

    def keep(self, t: Offered) -> KeepResult:
        count = self.repeated.get((self.site, text_key(t.text)))
        return count is None or (False, f"{t.source} text on {count[0]} of the {count[1]} pages of {self.site}")


@dataclass
class SiteNameFilter(Filter):
    """A text that is only one of the names the page gives its site (`html_images.site_names`)."""

    names: frozenset[str]
    name: ClassVar[str] = "boilerplate"

    def keep(self, t: Offered) -> KeepResult:
        return t.text.casefold() not in self.names or (False, f"{t.source} text is the site's name")


LANGUAGE_COLUMNS = ("language", "lang", "LANGUAGE", "Language")  # as LAION's multilingual lists name it
LIST_PRIOR_MIN_WORDS = 4  # captions this long vote for their list's language
LIST_PRIOR_SHARE = 0.5  # the list's language is the one at least this share of them are in


def _row_language(row: dict[str, Any]) -> str | None:
    """The language a list row names in a kept column (`--save-additional-columns language`)."""
    if not row.get("extra"):
        return None
    import json

    try:
        extra = json.loads(row["extra"])
    except ValueError:
        return None
    from lait.filters.langid import declared

    value = next((extra[c] for c in LANGUAGE_COLUMNS if isinstance(extra.get(c), str)), None)
    return declared(value)


def list_languages(rows: list[dict[str, Any]]) -> dict[str, str]:
    """list_file -> the language of the list: the one most of its captions of at least
    `LIST_PRIOR_MIN_WORDS` words are in (at least `LIST_PRIOR_SHARE` of them), counted over the
    rows at hand (a partition's rows are a sample of every list, drawn by the image URL's hash).
    A short caption of the list takes it as its prior, as a page's text takes the page's."""
    from lait.filters.langid import detect

    votes: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        caption = row.get("caption") or ""
        if len(caption.split()) >= LIST_PRIOR_MIN_WORDS:
            code = detect(caption)[0]
            if code is not None:
                votes[row["list_file"]][code] += 1
    out = {}
    for name, counter in votes.items():
        code, n = counter.most_common(1)[0]
        if n >= LIST_PRIOR_SHARE * sum(counter.values()):
            out[name] = code
    return out


def _fetched_images(ctx: PartContext) -> set[str]:
    """Image URLs of the partition with bytes in `images/` (fetched, no error)."""
    return {r["image_url"] for r in ctx.work.iter_rows("images", ctx.partition, columns=["image_url", "error"],
                                                        batch_size=8192) if r["error"] is None}


class CleanStage(Stage):
    """Stage 3 of LAIT over one partition of `page_texts/` (its `ExtractStage` pass, run first),
    URL lists and WAT links; output re-partitioned by image URL."""

    name = "clean"
    input_table = "page_texts"
    # URL lists (`lait download`): each row's caption; WAT image links (`lait ingest-warc`):
    # their alt and title texts. Both are partitioned by image URL already. And `images/`, so
    # that a list row whose image was never fetched gives no candidate (nor rejects).
    extra_inputs = ("url_list", "warc_links", "images")
    output_tables = ("candidates",)
    version = 8  # 2: junk rules, page texts with one owner, language ID over all languages; 3: WAT links,
    # list rows only with their image fetched; 4: site texts counted over the whole pool; 5: the caption
    # judge; 6: the judge on static MiniLM token vectors, texts of any length, its threshold chosen in
    # training; 7: pages read from the extraction pass (ExtractStage), which also records what the site count
    # counts; 8: a short text calling its picture a logo or a banner anywhere is boilerplate

    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg
        self._rules: TextRules | None = None
        self._extract = ExtractStage(cfg)
        self._repeated: tuple[str, SiteCounts] | None = None
        self._judge: Any = None
        # Set to a list, the judge is not asked: page texts the rules keep are written, and each
        # goes to the list as (page_url, image_url, JudgeInput, whether the judge would read it)
        # (bench/captions/train_judge.py).
        self.judge_sink: list | None = None

    def __getstate__(self) -> dict[str, Any]:  # sent to worker processes without the caches
        return {**self.__dict__, "_rules": None, "_repeated": None, "_judge": None}

    def before(self) -> list[Stage]:
        """The pages, parsed once by the extraction pass."""
        return [self._extract]

    def global_steps(self, work, *, force: bool = False, report=None) -> None:
        """Count each site's texts over every page of the pool (`lait.filters.site_texts`)."""
        site_texts_step(work, self.cfg, force=force, report=report)

    def global_inputs(self, work) -> dict[str, Any]:
        """Every partition reads the site counts: a new count redoes them all."""
        return {"site_texts": step_digest(work)}

    def _site_texts(self, work) -> SiteCounts:
        """The repeated texts of every site, read once per worker and count."""
        digest = step_digest(work)
        if digest is None:
            raise RuntimeError("stage 3's count of site texts is missing: run stage 3 through an executor "
                               "(lait clean, lait run), which counts them first")
        if self._repeated is None or self._repeated[0] != digest:
            self._repeated = (digest, load_site_texts(work))
        return self._repeated[1]

    def judge(self) -> Any:
        """The caption judge of the settings (loaded once per process), or None when off."""
        if self.cfg.caption_judge in ("none", "place"):
            return None
        if self._judge is None:
            from lait.filters.caption_judge import WEIGHTS, CaptionJudge

            path = WEIGHTS if self.cfg.caption_judge == "default" else self.cfg.caption_judge
            self._judge = CaptionJudge.load(path)
            if self._judge.encoder_name != "minilm-static":  # a transformer: torch's threads
                import os

                import torch

                # MiniLM's share of the cores: local workers side by side must not each take them all.
                n = max(1, (os.cpu_count() or 1) // max(1, self.cfg.workers or os.cpu_count() or 1))
                if torch.get_num_threads() != n:
                    torch.set_num_threads(n)
        return self._judge

    def partitions(self, work) -> list[int]:
        """Partitions with pages, list rows or archived links (a work directory of `lait download`,
        or of `lait ingest-warc` of WAT files, has no pages)."""
        return sorted(set(work.partitions("page_texts")) | set(work.partitions("url_list"))
                      | set(work.partitions("warc_links")))

    def prepare(self, text: str) -> list[str]:
        """A raw text as candidates (`ExtractStage.prepare`): list captions and WAT texts."""
        return self._extract.prepare(text)

    def process(self, ctx: PartContext) -> None:
        cfg = self.cfg
        if self._rules is None:  # once per stage object: verdicts cached across its partitions
            applied = text_filters(min_words=cfg.min_words, max_words=cfg.max_words,
                                   min_letter_share=cfg.min_letter_share, languages=cfg.languages)
            self._rules = TextRules([r for r in applied if r.name not in cfg.rules_off])
        rules = self._rules
        repeated = self._site_texts(ctx.work) if "site_boilerplate" not in cfg.rules_off else None
        judged = self.judge_sink is not None or self.judge() is not None
        pages: list[tuple[str, str | None, PageTexts]] = []
        site_pages: Counter[str] = Counter()
        site_counts: dict[str, Counter[str]] = defaultdict(Counter)
        for row in ctx.work.iter_rows("page_texts", ctx.partition, batch_size=256):
            url = row["page_url"]
            found = page_texts_of(row["found"])
            if judged:  # the judge's features need the partition's counts: pages wait for them
                host = urlsplit(url).netloc.lower()
                site_pages[host] += 1
                site_counts[host].update(offered(found))
                pages.append((url, row["license"], found))
            else:
                self._emit_page(ctx, url, row["license"], found, rules, repeated, None)
        pending: list[_Pending] | None = [] if judged else None
        for url, license_, found in pages:
            host = urlsplit(url).netloc.lower()
            self._emit_page(ctx, url, license_, found, rules, repeated, (site_counts[host], site_pages[host], pending))
        if pending:
            self._judge_pending(ctx, pending)
        if "list" in cfg.sources:
            self._list_captions(ctx, rules)
        self._wat_links(ctx, rules)

    def _emit_page(self, ctx: PartContext, url: str, license_: str | None, found: PageTexts, rules: TextRules,
                   repeated: SiteCounts | None, judge_ctx: tuple[Counter[str], int, list[_Pending]] | None) -> None:
        """The texts of one page's images through the rules; with `judge_ctx` (the partition's
        counts of the page's site, its pages there, the pending rows), each row waits for the judge."""
        # The rules that read the page's site, before the text rules: made once for the page.
        page_rules: list[Filter] = []
        if repeated:
            page_rules.append(SiteBoilerplateFilter(repeated, site_of(url)))
        if found.site_names and "boilerplate" not in self.cfg.rules_off:
            page_rules.append(SiteNameFilter(found.site_names))
        for s in found.shared:  # given to another image of the page, or dropped for where its image sits
            ctx.reject("image_place" if s.rule == "image_place" else "page_text", image_url=s.image_url,
                       page_url=url, text=s.text, detail=f"{s.source} text {s.detail}")
        last = max(1, len(found.images) - 1)
        for i, (image_url, raw) in enumerate(found.images):
            where = None
            if judge_ctx is not None:
                counts, n_pages, pending = judge_ctx
                where = _Where(i / last, counts, n_pages, found.lang, pending)
            self._emit(ctx, url, image_url, raw, rules, page_rules, license_, found.lang,
                       found.image_licenses.get(image_url), where)

    def _wat_links(self, ctx: PartContext, rules: TextRules) -> None:
        """The alt and title texts of each WAT image link (`warc_links/` rows of source `wat`) as
        `alt` and `title` candidates of the image, with the page as the WAT names it, as LAION
        read WAT files: no page is fetched. A link that an archived page of the same work
        directory also has (a row of source `html`) is left to that page, which gives the same
        texts and more. Site boilerplate does not apply: a partition holds no site's pages."""
        wanted = [src for src in ("alt", "title") if src in self.cfg.sources]
        if not wanted:
            return
        from_pages: set[tuple[str, str]] = set()
        wat: dict[tuple[str, str], list[tuple[str, str]]] = {}
        langs: dict[tuple[str, str], str | None] = {}  # the page's <html lang>, as the WAT has it
        for row in ctx.work.iter_rows("warc_links", ctx.partition,
                                      columns=["page_url", "image_url", "alt", "title", "source", "page_lang"]):
            key = (row["page_url"], row["image_url"])
            if row["source"] != "wat":
                from_pages.add(key)
                continue
            if key not in wat and self.cfg.languages != ["any"]:
                from lait.filters.langid import declared

                langs[key] = declared(row["page_lang"])
            texts = wat.setdefault(key, [])
            for src in wanted:  # one image may be linked twice from a page, with other texts
                if row[src] and (src, row[src]) not in texts:
                    texts.append((src, row[src]))
        for (page_url, image_url), texts in wat.items():
            if (page_url, image_url) in from_pages:
                continue
            ctx.count("wat_links_in")
            raw = [(src, piece) for src, text in texts for piece in self.prepare(text)]
            self._emit(ctx, page_url, image_url, raw, rules, prior=langs.get((page_url, image_url)))

    def _list_captions(self, ctx: PartContext, rules: TextRules) -> None:
        """Each URL list row's caption as a `list` candidate of its image (the same rules as
        every text; site boilerplate does not apply: a list is no site). A row without a page
        column has the page URL '' (candidates need one). A row whose image has no bytes (never
        fetched: refused by a rule, an unreachable host, a failed download) is left out: it can
        never be a sample, and stage 1 already recorded why. A caption's language prior is the
        list's (`list_languages`)."""
        fetched = _fetched_images(ctx)
        rows = list(ctx.work.iter_rows("url_list", ctx.partition,
                                       columns=["image_url", "caption", "page_url", "extra", "list_file"]))
        langs = list_languages(rows) if self.cfg.languages != ["any"] else {}
        for row in rows:
            ctx.count("list_rows_in")
            if row["image_url"] not in fetched:
                ctx.count("list_rows_not_fetched")
                continue
            raw = [("list", piece) for piece in self.prepare(row["caption"])] if row["caption"] else []
            prior = _row_language(row) or langs.get(row["list_file"])
            self._emit(ctx, row["page_url"] or "", row["image_url"], raw, rules, prior=prior)

    def _emit(self, ctx: PartContext, page_url: str, image_url: str, raw: list[tuple[str, str]],
              rules: TextRules, page_rules: Sequence[Filter] = (), license_: str | None = None,
              prior: str | None = None, image_license: str | None = None, where: _Where | None = None) -> None:
        seen: set[str] = set()
        texts: list[dict[str, Any]] = []
        # Texts an image also has from an unjudged source (an alt that is also its figcaption): the
        # judge leaves them alone, as it would the figcaption that the duplicate check folded away.
        unjudged: set[str] = set()
        for source, text in raw:
            if where is not None and source not in JUDGED_SOURCES:
                unjudged.add(text)
            dropped = first_rejection(page_rules, Offered(source, text)) if page_rules else None
            if dropped is not None:
                ctx.reject(dropped.rule, image_url=image_url, page_url=page_url, text=text, detail=dropped.detail)
                continue
            if text in seen:
                continue
            verdict = rules.judge(text, prior)
            if verdict.rule is not None:
                ctx.reject(verdict.rule, image_url=image_url, page_url=page_url, text=text, detail=verdict.detail)
                continue
            seen.add(text)
            texts.append({"text": text, "source": source, "lang": verdict.lang})
        if not texts:
            ctx.reject("no_text", image_url=image_url, page_url=page_url, detail="no candidate text left")
            return
        row = {"page_url": page_url, "image_url": image_url, "texts": texts, "license": license_,
               "image_license": image_license}
        if where is not None:  # written once the judge has read the partition's texts
            where.pending.append(_Pending(row, where, frozenset(unjudged)))
            return
        self._write(ctx, row)

    @staticmethod
    def _write(ctx: PartContext, row: dict[str, Any]) -> None:
        ctx.write("candidates", row, partition=partition_of(row["image_url"], ctx.work.n_partitions))

    def _judge_pending(self, ctx: PartContext, pending: list[_Pending]) -> None:
        """Ask the caption judge about every text of the partition's pending rows at once (one
        batch of embeddings), drop those it reads as junk, and write the rest."""
        from lait.filters.caption_judge import JudgeInput, judged
        from lait.filters.langid import detect

        # With languages 'any' no rule ran language ID: the judge reads the language all the same.
        inputs = [JudgeInput(t["text"], t["source"], p.where.position, p.where.counts[t["text"]],
                             p.where.site_pages, t["lang"] or detect(t["text"])[0], p.where.page_lang)
                  for p in pending for t in p.row["texts"]]
        asked = [judged(x) and t["text"] not in p.unjudged for x, (p, t) in
                 zip(inputs, ((p, t) for p in pending for t in p.row["texts"]))]
        if self.judge_sink is not None:
            k = 0
            for p in pending:
                for _ in p.row["texts"]:
                    self.judge_sink.append((p.row["page_url"], p.row["image_url"], inputs[k], asked[k]))
                    k += 1
                self._write(ctx, p.row)
            return
        probs = iter(self.judge().p_junk([x for x, a in zip(inputs, asked) if a]))
        asked_of = iter(asked)
        threshold = self.cfg.caption_judge_threshold or self.judge().threshold
        for p in pending:
            kept = []
            for t in p.row["texts"]:
                if not next(asked_of):
                    kept.append(t)
                    continue
                prob = float(next(probs))
                if prob >= threshold:
                    ctx.reject("not_caption", image_url=p.row["image_url"], page_url=p.row["page_url"],
                               text=t["text"], detail=f"{t['source']} text: p(junk) {prob:.3f} >= {threshold:g}")
                else:
                    kept.append(t)
            if kept:
                self._write(ctx, {**p.row, "texts": kept})
            else:
                ctx.reject("no_text", image_url=p.row["image_url"], page_url=p.row["page_url"],
                           detail="no candidate text left")


@dataclass
class _Where:
    """What the caption judge knows of an image's place: its rank on the page (0 to 1), the
    site's text counts and pages in the partition, the page's language, and where rows wait."""

    position: float
    counts: Counter[str]
    site_pages: int
    page_lang: str | None
    pending: list[_Pending]


@dataclass
class _Pending:
    row: dict[str, Any]
    where: _Where
    unjudged: frozenset[str] = frozenset()  # its texts that the image also has from an unjudged source
