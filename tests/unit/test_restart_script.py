"""dmtcp_restart_script.sh: rendering and atomic writing."""
from __future__ import annotations

import os
import shlex
import stat
import subprocess

import pytest

from dmtcp_py.coordinator import restart_script
from dmtcp_py.protocol.messages import ImageInfo

LINK = "dmtcp_restart_script.sh"
ODD_PATH = "/ck pt/it's $(touch x) `y`;\"z\".dmtcp"


def image(host: str, path: str) -> ImageInfo:
    return ImageInfo(host=host, path=path, tree_id="t", program="prog", bytes=1)


DEFAULTS = {"comp_id": "c0ffee", "generation": 7, "coord_host": "node1", "coord_port": 7779}


def render(images, **kw) -> str:
    return restart_script.render(images, **{**DEFAULTS, **kw})


def write(images, ckptdir, **kw) -> list:
    return restart_script.write(images, ckptdir=ckptdir, **{**DEFAULTS, **kw})


def restart_lines(text: str) -> list[tuple[list[str], bool]]:
    """(argv after restart_on, runs in background) for every call in the body."""
    calls = []
    for line in text.splitlines():
        if line.startswith("restart_on "):
            background = line.endswith(" &")
            argv = shlex.split(line[:-2] if background else line)
            calls.append((argv[1:], background))
    return calls


def bash_syntax_ok(path) -> None:
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr


def test_one_host_is_one_foreground_line(tmp_path):
    images = [image("node1", "/ckpt/a.dmtcp"), image("node1", "/ckpt/b.dmtcp")]
    text = render(images)
    assert restart_lines(text) == [(["node1", "/ckpt/a.dmtcp", "/ckpt/b.dmtcp"], False)]
    assert "wait" not in text and "pids+=" not in text
    assert text.startswith("#!/bin/bash\n")
    assert "computation c0ffee, generation 7" in text
    assert "coord_host=${DMTCP_COORD_HOST:-node1}" in text
    assert "coord_port=${DMTCP_COORD_PORT:-7779}" in text
    script = tmp_path / "s.sh"
    script.write_text(text)
    bash_syntax_ok(script)


def test_several_hosts_run_in_background_and_wait(tmp_path):
    images = [image("h1", "/c/1"), image("h2", "/c/2"), image("h1", "/c/3"), image("h3", "/c/4")]
    text = render(images)
    # grouped by host, hosts in order of first appearance
    assert restart_lines(text) == [(["h1", "/c/1", "/c/3"], True), (["h2", "/c/2"], True),
                                   (["h3", "/c/4"], True)]
    assert text.count("pids+=($!)") == 3
    assert 'for p in "${pids[@]}"; do wait "$p" || rc=$?; done' in text
    assert text.rstrip().endswith("exit $rc")
    script = tmp_path / "s.sh"
    script.write_text(text)
    bash_syntax_ok(script)


@pytest.mark.parametrize("hosts", [1, 2])
def test_odd_paths_and_hosts_are_quoted(tmp_path, hosts):
    images = [image("host one", ODD_PATH)] + [image("h'2", "/plain")] * (hosts - 1)
    text = render(images, coord_host="we ird'host")
    assert restart_lines(text)[0][0] == ["host one", ODD_PATH]
    assert "$(touch x)" not in text.replace(shlex.quote(ODD_PATH), "")
    assert "coord_host=${DMTCP_COORD_HOST:-" + shlex.quote("we ird'host") + "}" in text
    script = tmp_path / "s.sh"
    script.write_text(text)
    bash_syntax_ok(script)


def test_port_is_an_int():
    assert "coord_port=${DMTCP_COORD_PORT:-8000}" in render([image("h", "/p")], coord_port="8000")
    with pytest.raises(ValueError):
        render([image("h", "/p")], coord_port="80; rm -rf /")


def assert_script(directory, comp_id: str, generation: int) -> None:
    target = directory / f"dmtcp_restart_script_{comp_id}.sh"
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert f"computation {comp_id}, generation {generation}," in target.read_text()
    link = directory / LINK
    assert link.is_symlink()
    assert os.readlink(link) == target.name  # relative: the directory can move
    assert link.resolve() == target.resolve()
    assert not [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]
    bash_syntax_ok(link)


def test_write_into_ckptdir(tmp_path):
    images = [image("h1", "/elsewhere/a.dmtcp")]
    written = write(images, tmp_path)
    assert written == [tmp_path / "dmtcp_restart_script_c0ffee.sh"]
    assert_script(tmp_path, "c0ffee", 7)


def test_rewriting_replaces_script_and_link(tmp_path):
    images = [image("h1", str(tmp_path / "a.dmtcp"))]
    write(images, tmp_path, generation=7)
    write(images, tmp_path, generation=8)
    assert_script(tmp_path, "c0ffee", 8)
    # a later computation (restarted under a new id) takes over the link
    write(images, tmp_path, comp_id="beef", generation=9)
    assert_script(tmp_path, "beef", 9)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".sh")) == [
        LINK, "dmtcp_restart_script_beef.sh", "dmtcp_restart_script_c0ffee.sh"]


def test_write_over_a_stale_temporary_link(tmp_path):
    os.symlink("nowhere", tmp_path / ".dmtcp_restart_script.sh.tmp")
    write([image("h", "/p")], tmp_path)
    assert_script(tmp_path, "c0ffee", 7)


def test_without_ckptdir_every_image_directory_gets_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    images = [image("h1", str(one / "a.dmtcp")), image("h2", str(two / "b.dmtcp")),
              image("h1", str(one / "c.dmtcp")),
              image("h3", str(tmp_path / "missing" / "d.dmtcp"))]
    written = write(images, None)
    assert written == [one / "dmtcp_restart_script_c0ffee.sh",
                       two / "dmtcp_restart_script_c0ffee.sh"]
    for directory in (one, two):
        assert_script(directory, "c0ffee", 7)
        # each copy restarts the whole computation
        hosts = [argv[0] for argv, _ in restart_lines((directory / LINK).read_text())]
        assert hosts == ["h1", "h2", "h3"]
    assert not (tmp_path / "missing").exists()


def test_missing_ckptdir_writes_nothing(tmp_path):
    assert write([image("h", "/p")], tmp_path / "nope") == []
