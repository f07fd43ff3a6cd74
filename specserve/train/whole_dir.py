"""Write a trained draft's directory whole or not at all.

A run killed while saving used to leave the new weights beside the previous run's head ids (the
files were rewritten one by one in place), and the loader took the mix: a draft whose guesses are
read with another run's vocabulary, accepted almost never, with no error. Now the files go into a
fresh sibling directory that takes the old one's place once complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

# What marks a directory as a draft this module may replace: a draft model's config section,
# or an EAGLE head's own file.
_DRAFT_CONFIG, _EAGLE_CONFIG = "config.json", "eagle.json"


def _is_draft_dir(path: Path) -> bool:
    if (path / _EAGLE_CONFIG).is_file():
        return True
    try:
        return "specserve_draft" in json.loads((path / _DRAFT_CONFIG).read_text())
    except (OSError, ValueError, TypeError):
        return False


def check_draft_dir(out: Path, preflight: bool = False) -> None:
    """Raise ValueError unless out is new, empty or an earlier draft: written_whole replaces
    it, and another directory's files would go with it. Called before training as well
    (preflight, which also checks that out can be created), so that a wrong --out fails before
    the run, not after it."""
    here = Path.cwd()
    if Path(os.path.abspath(out)) in (here, *here.parents):
        # Replacing it would leave this process, and the shell it was started from, in a
        # deleted directory ("." itself cannot even be renamed: --out . failed at the save,
        # after the whole run).
        raise ValueError(f"{out} is the current directory or holds it: the draft replaces its "
                         "directory whole, so save it to another one")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not _is_draft_dir(out))):
        raise ValueError(f"{out} holds files that are not a specserve draft: save the draft "
                         "to a new or empty directory")
    if not preflight:
        return
    # The save writes beside out and renames; a parent it cannot write must fail now.
    parent = next((p for p in (out.parent, *out.parent.parents) if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{out}: cannot create it ({parent} is not a writable directory)")


@contextlib.contextmanager
def written_whole(out: Path) -> Iterator[Path]:
    """A fresh directory to write into; on success it replaces out (check_draft_dir's rule).
    A run killed between the two renames leaves no draft rather than a mix."""
    check_draft_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # as mkdir would make it (mkdtemp makes it private)
    old: Path | None = None  # where the earlier draft waits while the new one moves in
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.rename(old / out.name)
        try:
            tmp.rename(out)
        except BaseException:
            if old is not None:  # put the earlier draft back
                (old / out.name).rename(out)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
