"""Atomic writes (d2l_gpu._fs) go through symbolic links: the link stays, its target changes."""

from __future__ import annotations

import os

import pytest

from d2l_gpu._fs import write_atomic


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="POSIX links")
def test_a_write_through_a_link_changes_the_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real.name)  # a relative link, as users make them
    write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == real.name
    assert real.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]  # no temp left


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="POSIX links")
def test_a_chain_of_links_and_a_plain_file(tmp_path):
    real = tmp_path / "sub" / "real.txt"
    real.parent.mkdir()
    real.write_text("old")
    (tmp_path / "a").symlink_to(real)
    (tmp_path / "b").symlink_to(tmp_path / "a")
    write_atomic(tmp_path / "b", "new")
    assert real.read_text() == "new" and (tmp_path / "b").is_symlink()
    plain = tmp_path / "plain.txt"
    write_atomic(plain, "x")  # the negative control: a plain path is written in place
    assert plain.read_text() == "x" and not plain.is_symlink()
