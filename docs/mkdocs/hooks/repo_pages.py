"""MkDocs hook: the repository's own Markdown as the manual's pages, links and all.

Every page is written for GitHub: its links are relative to where the file lies in the
repository. The site is the docs/ folder (docs_dir), so a page under docs/ keeps its path and
its links as they are; this hook adds the pages from outside docs/ and makes their links (and
links to them) mean the same in the site:

- README.md is the site's home page (``index.md``), deploy/README.md the page ``deploy.md``;
- each folder of docs/bench-logs/ gets a page listing its files (GitHub lists a folder's files;
  a link to the folder lands there);
- a relative link is resolved from the page's place in the repository and rewritten to the page
  it names in the site; one that names nothing in the site is left as written, so MkDocs reports
  it and ``--strict`` fails the build;
- GitHub's Markdown, rendered by Python-Markdown: a list, a table or a code fence that follows a
  line of text without a blank line between (GitHub allows it) gets one, and a fence inside a
  list item indented by 2 spaces (GitHub's rule) is indented by 4 (Python-Markdown's), in the
  rendered copy only.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"
BENCH_LOGS = DOCS / "bench-logs"

#: Repository files outside docs/ that are pages of the site: repository path -> page in the site.
EXTRA_PAGES = {"README.md": "index.md", "deploy/README.md": "deploy.md"}

LINK = re.compile(r"(\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^( *)(```|~~~)")
LIST_ITEM = re.compile(r"^ {0,3}([-*+]|\d+[.)]) ")
TABLE_ROW = re.compile(r"^ {0,3}\|")


def _listing_pages() -> dict[str, str]:
    """docs/bench-logs/<folder>/index.md (site path) -> its Markdown: the folder's files."""
    pages = {}
    for folder in sorted(p for p in BENCH_LOGS.iterdir() if p.is_dir()):
        files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
        lines = [f"# Bench logs: {folder.name}", "",
                 "The raw output of the benchmarks, as they printed it; the figures drawn from it are in",
                 "[Performance](../../PERFORMANCE.md) and its [history](../PERFORMANCE-HISTORY.md).", ""]
        lines += [f"- [{name}]({name})" for name in files]
        pages[f"bench-logs/{folder.name}/index.md"] = "\n".join(lines) + "\n"
    return pages


def on_files(files: Files, config) -> Files:
    for repo_path, page in EXTRA_PAGES.items():
        files.append(File.generated(config, page, abs_src_path=str(REPO / repo_path)))
    for page, text in _listing_pages().items():
        if files.get_file_from_path(page) is None:
            files.append(File.generated(config, page, content=text))
    return files


def _repo_path(src_uri: str) -> str:
    """Where the page lies in the repository (its links are relative to that)."""
    for repo_path, page in EXTRA_PAGES.items():
        if page == src_uri:
            return repo_path
    return f"docs/{src_uri}"


def _site_path(repo_path: str) -> str | None:
    """The page (or file) of the site a repository path is, or None."""
    if repo_path in EXTRA_PAGES:
        return EXTRA_PAGES[repo_path]
    if not repo_path.startswith("docs/"):
        return None
    inside = repo_path[len("docs/"):]
    if (REPO / repo_path).is_dir() and inside.startswith("bench-logs/"):
        return f"{inside.rstrip('/')}/index.md"
    return inside


def _rewrite_link(target: str, src_uri: str) -> str:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "/")):
        return target  # a URL, an anchor on this page, an absolute path (MkDocs judges those)
    path, hash_, anchor = target.partition("#")
    repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(_repo_path(src_uri)), path))
    site = _site_path(repo_target)
    if site is None:
        return target  # outside the site: MkDocs says so
    relative = posixpath.relpath(site, posixpath.dirname(src_uri) or ".")
    return relative + hash_ + anchor


def _kind(line: str) -> str:
    if not line.strip():
        return "blank"
    if LIST_ITEM.match(line):
        return "list"
    if TABLE_ROW.match(line):
        return "table"
    if line.startswith((" ", "\t")):
        return "indented"
    return "text"


def gfm_to_python_markdown(markdown: str) -> str:
    """The blank lines and indents Python-Markdown needs where GitHub needs none (module doc)."""
    out: list[str] = []
    fence: tuple[str, bool] | None = None  # (the fence's indent and marker, whether it is in a list item)
    in_list = False
    for line in markdown.split("\n"):
        opening = FENCE.match(line)
        if fence is not None:  # inside a code block: as written (re-indented with its list item)
            marker, listed = fence
            if opening and opening.group(1) + opening.group(2) == marker:
                fence = None
            out.append("  " + line if listed and line.startswith("  ") else line)
            continue
        previous = _kind(out[-1]) if out else "blank"
        if opening:
            listed = in_list and len(opening.group(1)) == 2
            fence = (opening.group(1) + opening.group(2), listed)
            if previous != "blank" and not listed:
                out.append("")
            out.append("  " + line if listed else line)
            continue
        kind = _kind(line)
        if kind == "list" and previous in ("text", "table"):
            out.append("")
        elif kind == "table" and previous in ("text", "list", "indented"):
            out.append("")
        if kind == "list":
            in_list = True
        elif kind in ("text", "table"):
            in_list = False
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    src_uri = page.file.src_uri

    def rewrite(match: re.Match[str]) -> str:
        return match.group(1) + _rewrite_link(match.group(2), src_uri) + match.group(3)

    pieces = []
    fence = False
    for line in markdown.split("\n"):  # links outside code blocks only
        if FENCE.match(line):
            fence = not fence
        pieces.append(line if fence else LINK.sub(rewrite, line))
    return gfm_to_python_markdown("\n".join(pieces))
