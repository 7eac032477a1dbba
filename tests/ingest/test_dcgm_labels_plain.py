"""ingest.dcgm_labels.plain: the label blocks the line reader vouches for are exactly the well-formed ones
(``promtext.BLOCK_OK``) with no brace, backslash or trailing newline; its own faster pattern must agree
with the format's on every block, mutated ones included."""

from __future__ import annotations

import random
import re

import pytest

from fleetscope.core.promtext import BLOCK_OK
from ingest.dcgm_labels import plain

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


def test_plain_agrees_with_the_format_on_mutated_blocks():
    rng = random.Random(16)
    alphabet = 'a"=,_ 0\n{}\\xé'
    for _ in range(20_000):
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
        block = "".join(chars)[: rng.randint(0, len(chars))] if rng.random() < 0.2 else "".join(chars)
        assert plain(block) == _by_the_format(block), block
