"""ingest.dcgm_labels: the label blocks the line reader vouches for (``plain``) are exactly the well-formed
ones (``promtext.BLOCK_OK``) with no brace, backslash or trailing newline; its own faster pattern must agree
with the format's on every block, mutated ones included. A block read by a known block's shape (``Shape``) is
read as label by label (``_block``), or left to it."""

from __future__ import annotations

import random
import re

import pytest

from fleetscope.core.promtext import BLOCK_OK
from ingest.dcgm_labels import _block, plain, shape_of

BLOCK = ('gpu="0",UUID="GPU-e3e70682-c209-4cac-629f-6fbed82c07cd",pci_bus_id="00000000:53:00.0",device="nvidia0",'
         'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-1",DCGM_FI_DRIVER_VERSION="580.105.08"')
_FORMAT = re.compile(BLOCK_OK)


def _by_the_format(block: str) -> bool:
    return ("{" not in block and "}" not in block and "\\" not in block and not block.endswith("\n")
            and _FORMAT.match(block) is not None)


@pytest.mark.parametrize("block", [
    BLOCK, BLOCK + ",", "", 'a=""', 'a="x",', 'a="x",,', ',a="x"', 'a="x" ', ' a="x"', 'a=x', 'a="x', '1a="x"', 'a-b="x"',
    'a="x"b="y"', 'a="é ü",b="日本"', 'a="x\ny"', 'a="x"\n', 'a="x\\"y"', 'a="{x}"', 'a="x",b', 'a="x"=', '=', '"',
])
def test_plain_blocks_are_the_formats_without_escapes(block: str):
    assert plain(block) == _by_the_format(block)


def _mutated(rng: random.Random, alphabet: str = 'a"=,_ 0\n{}\\xé') -> str:
    chars = list(BLOCK)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(chars) + 1)
        op = rng.random()
        if op < 0.4:
            chars.insert(i, rng.choice(alphabet))
        elif op < 0.8 and i < len(chars):
            del chars[i]
        elif i < len(chars):
            chars[i] = rng.choice(alphabet)
    return "".join(chars)[: rng.randint(0, len(chars))] if rng.random() < 0.2 else "".join(chars)


def test_plain_agrees_with_the_format_on_mutated_blocks():
    rng = random.Random(16)
    for _ in range(20_000):
        block = _mutated(rng)
        assert plain(block) == _by_the_format(block), block


def test_a_block_of_a_known_shape_reads_as_label_by_label():
    """Another GPU's block of the same names (the new node's case) is read by the shape; blocks that break it in one
    place (a name, a quote, a separator, an escape, a brace) are left to ``_block`` or read alike."""
    for trailing in ("", ","):
        shape = shape_of(BLOCK + trailing)
        assert shape is not None
        for other in (BLOCK.replace("GPU-e3e7", "GPU-0000").replace('gpu="0"', 'gpu="7"'), BLOCK.replace("gpu-node-1", "n,1=x")):
            assert shape.read(other + trailing) == _block(other + trailing) is not None
        for hostile in ('gpu",UUID="a""', BLOCK.replace('Hostname="', 'Hostname="\\'), BLOCK.replace('gpu="0"', 'gpu="x"'),
                        BLOCK.replace('"gpu-node-1"', '"gpu-node-1","'), BLOCK + ',a=""', BLOCK.replace("node-1", "node{1}"),
                        BLOCK.replace('UUID="GPU-e3e70682-c209-4cac-629f-6fbed82c07cd"', 'UUID=""'), BLOCK.replace(",", ",\n", 1)):
            assert shape.read(hostile + trailing) is None
    # as many quotes as two labels hold, but the first has no value and the second's holds a quote
    assert shape_of('gpu="0",UUID="GPU-1"').read('gpu",UUID="a""') is None and _block('gpu",UUID="a""') is None
    rng = random.Random(1207)
    shape, read = shape_of(BLOCK), 0
    for _ in range(20_000):
        block = _mutated(rng, 'a"=,_ 0\n{}\\x3é')
        got = shape.read(block)
        assert got is None or got == _block(block), block
        read += got is not None
    assert read > 1000  # mutations inside a value keep the shape

