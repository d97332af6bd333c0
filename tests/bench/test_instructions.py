"""bench/_instructions.py reads callgrind's dumps: self cost, call cost, compressed names."""

from __future__ import annotations

from bench._instructions import parse_dump, readable

# A callgrind dump (https://valgrind.org/docs/manual/cl-format.html): main calls f twice
# (once as the compressed name defined at the call), f calls itself once (f'2).
DUMP = """\
# callgrind format
version: 1
positions: line
events: Ir
summary: 1000

ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(1) main.c
fn=(1) main
10 5
cob=(2) /site-packages/_json.cpython-311-x86_64-linux-gnu.so
cfi=(2) f.c
cfn=(2) f
calls=1 20
11 600
+1 5
cob=(2)
cfn=(2)
calls=1 20
* 390

ob=(2)
fl=(2)
fn=(2)
20 100
21 200
cfn=(3) f'2
calls=1 20
22 90
+1 200
23 400
fn=(3)
20 90

totals: 1000
"""


def test_a_dump_gives_each_function_its_self_and_call_costs(tmp_path):
    path = tmp_path / "callgrind.out.1"
    path.write_text(DUMP)
    dump = parse_dump(path)
    main = ("libpython3.11.so.1.0", "main")
    f = ("_json.cpython-311-x86_64-linux-gnu.so", "f")
    assert dump.total == 1000
    assert dump.own[main] == 10 and dump.calls[main] == 990
    assert dump.own[f] == 900 and dump.calls[f] == 90
    assert dump.inclusive(f) == dump.calls[main]  # what main's two calls of f cost
    assert dump.inclusive(main) == 1000
    assert dump.own[("_json.cpython-311-x86_64-linux-gnu.so", "f'2")] == 90


def test_cython_and_stripped_names_read_as_python_names():
    pyx = "__pyx_f_7asyncpg_8protocol_8protocol_22PreparedStatementState__encode_bind_msg"
    assert readable(pyx, "protocol.so") == (
        "asyncpg.protocol.protocol.PreparedStatementState._encode_bind_msg"
    )
    assert readable("0x0000000000210180", "_pydantic_core.cpython-311.so") == (
        "_pydantic_core+0x210180"
    )
    assert readable("type_call", "libpython3.11.so.1.0") == "type_call"
