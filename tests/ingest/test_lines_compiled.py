"""ingest._lines, the compiled per-push loop of ingest.dcgm_lines: each function returns what the Python it
stands for returns (``dcgm_lines._VALUE_CUT.split``, ``_numbers_py``, ``_scale_ints_py``), on real,
synthetic, mutated and hostile input, to the bit."""

from __future__ import annotations

import importlib.util
import math
import os
import random
import struct
from pathlib import Path

import pytest

from ingest import dcgm_lines

REPO = Path(__file__).resolve().parents[2]
TELEMETRY = REPO.parent / "shared" / "realdata" / "telemetry"
_spec = importlib.util.spec_from_file_location("_bench_dcgm", REPO / "benchmarks" / "ingest_dcgm.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)

if dcgm_lines._c is None:
    if os.environ.get("FLEETSCOPE_REQUIRE_COMPILED") == "1":
        raise RuntimeError("ingest._lines was not built and FLEETSCOPE_REQUIRE_COMPILED=1")
    pytest.skip("ingest._lines was not built (no C compiler at install)", allow_module_level=True)

C = dcgm_lines._c


_ALPHABET = b'} \n{"=,#9aZ.-e\x00\xff'


def _mutated(rng: random.Random, base: bytes, *, ops: tuple[int, int], grow: int, shrink: int, cut_p: float) -> bytes:
    """``base``, cut short with probability ``cut_p``, then between ``ops[0]`` and ``ops[1]`` edits: a byte of ``_ALPHABET`` inserted
    up to ``grow`` times, up to ``shrink`` bytes deleted, or a byte replaced."""
    body = bytearray(base[: rng.randrange(len(base) + 1)] if rng.random() < cut_p else base)
    for _ in range(rng.randint(*ops)):
        if not body:
            break
        i = rng.randrange(len(body))
        op = rng.randrange(3)
        if op == 0:
            body[i:i] = bytes([rng.choice(_ALPHABET)]) * rng.randint(1, grow)
        elif op == 1:
            del body[i : i + rng.randint(1, shrink)]
        else:
            body[i] = rng.choice(_ALPHABET)
    return bytes(body)


def _bits(values: list) -> list:
    """Floats by their bits (-0.0 is not 0.0), anything else as it is."""
    return [struct.pack("<d", v) if isinstance(v, float) else v for v in values]


def _bodies() -> list[bytes]:
    out = [_bench.synth_scrape(8, first_gpu=8 * h, seed=h, busy_fraction=0.5, xids={8 * h + 1: 79}) for h in range(4)]
    out += [p.read_bytes() for p in sorted(TELEMETRY.glob("dcgm-exporter*.prom"))]
    return out


def test_cut_is_the_regex_split_on_real_and_agent_bodies():
    bodies = _bodies()
    assert len(bodies) >= 5
    for body in bodies:
        joined, lengths, values = C.cut(body)
        assert (joined, lengths, values) == dcgm_lines._cut_py(body)
        assert len(values) > 10


def test_cut_is_the_regex_split_on_mutated_bodies():
    rng = random.Random(5)
    base = _bench.synth_scrape(8, seed=3)
    for _ in range(400):
        data = _mutated(rng, base, ops=(1, 12), grow=3, shrink=4, cut_p=0.2)
        assert C.cut(data) == dcgm_lines._cut_py(data), data[:80]


@pytest.mark.parametrize("data", [
    b"", b"\n", b"}", b"} ", b"} \n", b"}} \n", b"} } 1\n", b"}  1\n", b"} 1 \n", b"} 1", b"a} 1\nb} 2",
    b"} 1\n} 2\n}", b"x{a} 1\r\n", b"x{a} \x00\n", b"} " * 1000 + b"\n", b"} \n" * 100_000,
    b"}" * 50_000 + b" 5\n", bytes(range(256)) * 40,
])
def test_cut_is_the_regex_split_on_hostile_input(data):
    assert C.cut(data) == dcgm_lines._cut_py(data)


def test_cut_refuses_what_is_not_bytes():
    for bad in ("} 1\n", bytearray(b"} 1\n"), None, 5):
        with pytest.raises(TypeError):
            C.cut(bad)


_HIGH = float(dcgm_lines._INT32_BLANK)


@pytest.mark.parametrize("values", [
    [], [b"0"], [b"-0"], [b"-0.0"], [b"007"], [b"1.5", b"-2.25"], [b"0.1"], [b"123456789012345"],
    [b"1234567890123456"], [b"12345678901234567890"], [b"0.000000000000001"], [b"1.0000000000000002"],
    [b"9007199254740993"], [b"1e3"], [b"1E-3"], [b"+1"], [b"1e999"], [b"-1e999"], [b"1e-400"],
    [b"4294967295", b"2147483647", b"2147483632"], [b"9223372036854775807"], [b"."], [b"-"], [b"-."],
    [b"1."], [b".5"], [b"1e"], [b"e1"], [b""], [b"+-1"], [b"1-"], [b"1..2"], [b"nan"], [b"inf"], [b"1_0"],
    [b" 1"], [b"1 "], [b"1,0"], [b"1\n"], [b"1", b"2x"], [b"0x10"], [b"\xff"], [b"1\x00"],
])
def test_numbers_are_floats_as_float_reads_them(values):
    got, want = C.numbers(values, _HIGH), dcgm_lines._numbers_py(values, _HIGH)
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert _bits(got[0]) == _bits(want[0]) and got[1:] == want[1:]


def test_numbers_agree_on_random_plain_looking_values():
    rng = random.Random(11)
    chars = "0123456789" * 4 + "eE.+-"
    for _ in range(3000):
        values = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.randrange(4)
            if kind == 0:
                values.append("".join(rng.choice(chars) for _ in range(rng.randint(0, 20))).encode())
            elif kind == 1:
                values.append(repr(rng.uniform(-1e6, 1e6)).encode())
            elif kind == 2:
                values.append(str(rng.randrange(-(10**17), 10**17)).encode())
            else:
                values.append(f"{rng.random() * 10 ** rng.randint(-30, 30):.{rng.randint(0, 17)}f}".encode())
        got, want = C.numbers(values, _HIGH), dcgm_lines._numbers_py(values, _HIGH)
        assert (got is None) == (want is None), values
        if want is not None:
            assert _bits(got[0]) == _bits(want[0]) and got[1:] == want[1:], values


def test_numbers_refuses_what_is_not_a_list_of_bytes():
    with pytest.raises(TypeError):
        C.numbers([b"1", "2"], _HIGH)
    with pytest.raises(TypeError):
        C.numbers((b"1",), _HIGH)


def test_scale_ints_rounds_as_python_and_drops_what_int64_cannot_hold():
    rng = random.Random(3)
    values = [0.5, 1.5, 2.5, -0.5, -2.5, 1e-3, 123.456, 9.3e18, -9.3e18, 9.2e18, math.inf, math.nan, 2.0**63, -(2.0**63)]
    values += [rng.uniform(-1e12, 1e12) for _ in range(200)]
    factors = [1.0, 1e-3, 1e3, 1e6, 0.5]
    at = list(range(len(values)))
    fs = [rng.choice(factors) for _ in at]
    got, want = list(values), list(values)
    finite = [i for i in at if math.isfinite(values[i])]
    lost = C.scale_ints(got, at, fs)
    # Python's round() raises on inf and nan, which a template never hands over (its blank test drops them first)
    want_lost = dcgm_lines._scale_ints_py(want, finite, [fs[i] for i in finite])
    assert lost == want_lost + 2
    assert [got[i] for i in finite] == [want[i] for i in finite]
    assert all(type(got[i]) is type(want[i]) for i in finite)
    assert got[values.index(math.inf)] is None and got[values.index(math.nan)] is None


def test_scale_ints_refuses_bad_indices_and_lengths():
    with pytest.raises(IndexError):
        C.scale_ints([1.0], [1], [1.0])
    with pytest.raises(ValueError):
        C.scale_ints([1.0], [0], [])
    with pytest.raises(TypeError):
        C.scale_ints((1.0,), [0], [1.0])


def test_a_template_learned_one_way_is_found_the_other(monkeypatch):
    """The compiled cut digests the same pieces as the regex: a process's templates do not depend on which
    loop learned them."""
    body = _bench.synth_scrape(8, seed=21)
    dcgm_lines.forget()
    first = dcgm_lines.read(body)
    assert first is not None and len(dcgm_lines._TEMPLATES) == 1
    monkeypatch.setattr(dcgm_lines, "_cut", dcgm_lines._cut_py)
    monkeypatch.setattr(dcgm_lines, "_numbers", dcgm_lines._numbers_py)
    monkeypatch.setattr(dcgm_lines, "_scale_ints", dcgm_lines._scale_ints_py)
    again = dcgm_lines.read(body)
    assert len(dcgm_lines._TEMPLATES) == 1 and again.flat == first.flat
    dcgm_lines.forget()


_FUZZ = r'''
import importlib.util, random, struct, sys
spec = importlib.util.spec_from_file_location("ingest._lines", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
rng = random.Random(int(sys.argv[3]))
with open(sys.argv[2], "rb") as f:
    while head := f.read(4):
        joined, lengths, values = m.cut(f.read(struct.unpack("<I", head)[0]))
        m.numbers(values, 2.0**31)
        got = m.numbers([v for v in values if v and set(v) <= set(b"0123456789.-")] or [b"1"], 2.0**31)
        if got is not None:
            xs = list(got[0])
            m.scale_ints(xs, list(range(len(xs))), [rng.choice([1.0, 1e3, 1e-3, 1e30]) for _ in xs])
print("clean")
'''


def test_the_loop_reads_hostile_bodies_under_the_address_and_undefined_behaviour_sanitizers(tmp_path):
    """The C loop built with AddressSanitizer and UBSan and fed cut, grown and corrupted bodies: any read past a
    buffer, overflow or use after free stops the process."""
    import shutil
    import subprocess
    import sys
    import sysconfig

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc to build the sanitized loop")
    libs = [subprocess.run([gcc, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip() for lib in ("libasan.so", "libubsan.so")]
    if not all(Path(lib).is_absolute() and Path(lib).exists() for lib in libs):
        pytest.skip("gcc has no sanitizer runtimes here")
    built = tmp_path / "_lines.so"
    subprocess.run([gcc, "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fPIC", "-shared",
                    "-I" + sysconfig.get_paths()["include"], str(REPO / "ingest" / "_lines.c"), "-o", str(built)], check=True)
    rng = random.Random(17)
    base = _bench.synth_scrape(8, seed=3)
    hostile = [b"", b"}", b"} ", b"} \n" * 70000, b"}" * 100000, bytes(range(256)) * 100]
    body = tmp_path / "bodies"
    with body.open("wb") as f:
        for data in [_mutated(rng, base, ops=(0, 20), grow=300, shrink=40, cut_p=1.0) for _ in range(600)] + hostile:
            f.write(struct.pack("<I", len(data)) + data)
    script = tmp_path / "fuzz.py"
    script.write_text(_FUZZ)
    env = {**os.environ, "LD_PRELOAD": ":".join(libs), "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    run = subprocess.run([sys.executable, str(script), str(built), str(body), "17"], capture_output=True, text=True, env=env, timeout=240)
    assert run.returncode == 0 and run.stdout.strip() == "clean", run.stderr[-3000:]
