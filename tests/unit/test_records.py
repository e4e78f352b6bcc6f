"""The shim link's records agree between C (hijack/include/dmtcp_record.h)
and Python (dmtcp_py/agent/records.py).

A small C program, made from the header's own names, includes it and
prints every constant and the layout of struct dmtcp_record as the C
compiler sees them; each is compared with records.py.  Compiled in a
temporary directory.
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from dmtcp_py.agent import records

INCLUDE = Path(__file__).resolve().parents[2] / "hijack" / "include"
HEADER = (INCLUDE / "dmtcp_record.h").read_text()

pytestmark = pytest.mark.skipif(not shutil.which("cc"), reason="needs cc")


def record_types() -> list[str]:
    """The names of enum dmtcp_record_type, as written: DMTCP_REC_HELLO, ..."""
    body = re.search(r"enum dmtcp_record_type\s*{(.*?)}", HEADER, re.S).group(1)
    return re.findall(r"\b(DMTCP_REC_\w+)\b", body)


def numeric_defines() -> list[str]:
    """DMTCP_RECORD_MAGIC, DMTCP_DONE_FAILED, ...: every #define with a
    number (not the environment variables' names, not the include guard)."""
    return [name for name, value in re.findall(r"#define\s+(DMTCP_\w+)[ \t]+(\S[^\n]*)", HEADER)
            if not value.startswith('"')]


def fields() -> list[str]:
    body = re.search(r"struct dmtcp_record\s*{(.*?)}", HEADER, re.S).group(1)
    return re.findall(r"\bu?int\d+_t\s+(\w+)\s*;", body)


def python_name(c_name: str) -> str:
    for prefix in ("DMTCP_RECORD_", "DMTCP_REC_", "DMTCP_"):
        if c_name.startswith(prefix):
            return c_name[len(prefix):]
    raise AssertionError(c_name)


@pytest.fixture(scope="module")
def c_values(tmp_path_factory) -> dict[str, int]:
    """name -> value as the C compiler sees it: the constants, and per
    field of the record its offset, size and signedness."""
    lines = [f'    printf("{n} %llu\\n", (unsigned long long)({n}));'
             for n in numeric_defines() + record_types()]
    lines.append('    printf("sizeof %zu\\n", sizeof(struct dmtcp_record));')
    for f in fields():
        lines += [f'    printf("offset.{f} %zu\\n", offsetof(struct dmtcp_record, {f}));',
                  f'    printf("size.{f} %zu\\n", sizeof(r.{f}));',
                  f'    printf("signed.{f} %d\\n", (__typeof__(r.{f}))-1 < 0);']
    source = "\n".join(["#include <stddef.h>", "#include <stdio.h>", '#include "dmtcp_record.h"',
                        "int main(void)", "{", "    struct dmtcp_record r = { 0 };", "",
                        *lines, "    (void)r;", "    return 0;", "}", ""])
    tmp = tmp_path_factory.mktemp("records")
    (tmp / "records.c").write_text(source)
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I", str(INCLUDE),
                    "-o", str(tmp / "records"), str(tmp / "records.c")],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(tmp / "records")], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


def test_the_header_is_read():
    """The parsing above found what it should, so the checks below mean something."""
    assert "DMTCP_REC_HELLO" in record_types() and "DMTCP_REC_DONE" in record_types()
    assert {"DMTCP_RECORD_MAGIC", "DMTCP_RECORD_VERSION", "DMTCP_DONE_FAILED",
            "DMTCP_RESUME_RESTORED", "DMTCP_PARK_LEADER", "DMTCP_PARK_MAX"} <= set(numeric_defines())
    assert fields() == ["magic", "version", "type", "pid", "ppid", "arg"]


def test_constants_agree(c_values):
    for c_name in numeric_defines() + record_types():
        py = python_name(c_name)
        assert hasattr(records, py), f"{c_name} has no {py} in records.py"
        assert getattr(records, py) == c_values[c_name], f"{py}: C says {c_values[c_name]}"


def test_no_constant_python_alone_knows():
    in_c = {python_name(n) for n in numeric_defines() + record_types()}
    in_python = {name for name, value in vars(records).items()
                 if name.isupper() and isinstance(value, int)}
    assert in_python == in_c


def test_layout_agrees(c_values):
    codes = records.RECORD.format.lstrip("=")
    assert records.RECORD.size == c_values["sizeof"]
    assert len(codes) == len(fields())
    for i, (f, code) in enumerate(zip(fields(), codes)):
        assert struct.calcsize("=" + codes[:i]) == c_values[f"offset.{f}"], f
        assert struct.calcsize("=" + code) == c_values[f"size.{f}"], f
        assert code.islower() == bool(c_values[f"signed.{f}"]), f


def test_pack():
    raw = records.pack(records.RESUME, 7 | records.RESUME_RESTORED)
    assert records.RECORD.unpack(raw) == (records.MAGIC, records.VERSION, records.RESUME, 0, 0,
                                          7 | records.RESUME_RESTORED)
