"""Stage 1: web-page collection: the Scrapy project (`lait crawl`), Common Crawl archives (`lait
ingest-warc`) and URL lists (`lait download`). The built-in webs it is tested on live in the test
kit (`lait.testkit`)."""
