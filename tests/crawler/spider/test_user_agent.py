"""Issue 18: the user agent names lait and a page of this project for site owners."""

from __future__ import annotations

import tomllib

import lait
from lait.crawler import settings


def test_user_agent_points_at_the_site_owners_section(repo_root):
    assert settings.USER_AGENT.startswith(f"lait/{lait.__version__} ")
    assert lait.SITE_OWNERS_URL in settings.USER_AGENT and "pypi" not in settings.USER_AGENT.lower()
    urls = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Homepage"] == lait.HOMEPAGE and urls["For site owners"] == lait.SITE_OWNERS_URL
    readme = (repo_root / "README.md").read_text()
    anchor = lait.SITE_OWNERS_URL.split("#", 1)[1]
    assert "\n## For site owners\n" in readme and anchor == "for-site-owners"
    section = readme.split("\n## For site owners\n", 1)[1].split("\n## ", 1)[0]
    assert f"User-agent: {settings.ROBOTSTXT_USER_AGENT}" in section
    assert "tdmrep.json" in section and "noai" in section
