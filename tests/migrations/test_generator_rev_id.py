"""``alkstore alembic-revision --rev-id ID`` names the file it writes and becomes the
revision's literal: an id that is not 1 to 32 ASCII letters, digits or underscores (a path
separator, ``..``, a quote, a space, a newline, a control character, too long for
``alembic_version.version_num``) is refused with exit 2 and one line, and nothing is
written anywhere. A good id still writes a file that compiles. The revision it revises,
given without an alembic.ini to check it against, cannot break the file's Python either."""

from __future__ import annotations

from pathlib import Path

import pytest

from alkstore_sa import migrations
from alkstore_sa.cli import main
from alkstore_sa.cli.alembic_revision import MAX_REV_ID

ABSOLUTE = "<an absolute path in tmp_path>"  # made per test: a failure must not write outside it
BAD = [
    "../evil", "..", "a/b", ABSOLUTE, "a\\b", "a b", 'a"b', "a'b", "a\nb", "a\x1bb",
    "", "x" * (MAX_REV_ID + 1), "a-b", "a.b", "é1", "a@b",
]


@pytest.fixture(autouse=True)
def _no_alembic_ini(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run where no alembic.ini is (the checkout's own would be read)."""
    monkeypatch.chdir(tmp_path)


def generate(tmp_path: Path, *extra: str, down: str = "base") -> int:
    """The generator without an alembic.ini: every choice explicit, writing into ./out."""
    return main(["alembic-revision", "--version-path", str(tmp_path / "out"),
                 "--down-revision", down, "--from-step", "0", *extra])


def files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("rev_id", BAD, ids=repr)
def test_a_bad_rev_id_is_refused_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], rev_id: str,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a relative "../evil" would land beside it, in tmp_path
    if rev_id == ABSOLUTE:
        rev_id = str(tmp_path / "abs")
    assert generate(work, "--rev-id", rev_id) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert "--rev-id" in line and "letters, digits or underscores" in line, line
    assert captured.out == ""
    assert files(tmp_path) == [] and not (work / "out").exists()


@pytest.mark.parametrize("rev_id", ["alk_0001", "A1", "x" * MAX_REV_ID])
def test_a_good_rev_id_writes_its_revision(tmp_path: Path, rev_id: str) -> None:
    assert generate(tmp_path, "--rev-id", rev_id) == 0
    (path,) = files(tmp_path)
    assert path == tmp_path / "out" / f"{rev_id}_alkstore_steps_0_to_{migrations.steps.HEAD}.py"
    text = path.read_text()
    assert f'revision = "{rev_id}"' in text
    compile(text, str(path), "exec")


def test_without_a_rev_id_a_random_one_is_chosen(tmp_path: Path) -> None:
    assert generate(tmp_path) == 0
    (path,) = files(tmp_path)
    compile(path.read_text(), str(path), "exec")


@pytest.mark.parametrize("down", ['app"""x', "app\\N", "app\nrevision = 'x'"], ids=repr)
def test_an_unchecked_down_revision_cannot_break_the_file(tmp_path: Path, down: str) -> None:
    """Without an alembic.ini nothing checks --down-revision against the app's chain: it
    is written as a literal, and into the docstring escaped, so the file stays Python."""
    assert generate(tmp_path, "--rev-id", "alk_1", down=down) == 0
    (path,) = files(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - the file we wrote
    assert namespace["revision"] == "alk_1" and namespace["down_revision"] == down
