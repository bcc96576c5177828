"""Stage 1: web-page collection (Scrapy project, WARC ingest, built-in demo web)."""
