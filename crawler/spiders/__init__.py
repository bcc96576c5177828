"""Spiders of the lait Scrapy project (`scrapy list` from the repository root)."""
