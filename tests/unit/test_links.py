"""No dangling link in the tree, and every relative link of the Markdown docs names a file or
directory that exists (issue 33, item 6: README's `profiles/` was a link to nowhere)."""
import os
import re
import subprocess

from tests.helpers import REPO


def tracked():
    return subprocess.run(["git", "-C", REPO, "ls-files", "-z"], capture_output=True, text=True,
                          check=True).stdout.split("\0")


def test_no_symbolic_link_in_the_tree_dangles():
    bad = [p for p in tracked() if p and os.path.islink(os.path.join(REPO, p))
           and not os.path.exists(os.path.join(REPO, p))]
    assert bad == []


def test_relative_links_and_named_directories_of_the_docs_exist():
    bad = []
    for p in tracked():
        if not p.endswith(".md") or p.startswith("tests/"):
            continue
        text = open(os.path.join(REPO, p)).read()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("/"):
                continue
            if not os.path.exists(os.path.join(REPO, os.path.dirname(p), target)):
                bad.append(f"{p}: {target}")
    assert bad == []


def test_the_readmes_profiles_directory_lists_the_shipped_profiles():
    assert "(also `profiles/`)" in open(os.path.join(REPO, "README.md")).read()
    shipped = sorted(os.listdir(os.path.join(REPO, "hkgpu_tune", "profiles")))
    assert sorted(os.listdir(os.path.join(REPO, "profiles"))) == shipped and any(f.endswith(".yaml") for f in shipped)
