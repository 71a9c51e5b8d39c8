"""`return_freed_memory`: after it, a large block freed by glibc no longer moves the mmap threshold,
so the next large block gets its own mapping (given back when freed) instead of the kept heap."""

import platform
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, sys
class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype, libc.malloc.restype = Mallinfo2, ctypes.c_void_p
libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
if sys.argv[1] == "fixed":
    from lmk_embed_tools import return_freed_memory
    assert return_freed_memory()
libc.free(libc.malloc(8 << 20))  # glibc's own rule: freeing a mapped 8 MiB block lifts the threshold past it
before = libc.mallinfo2().hblkhd
block = libc.malloc(2 << 20)
print((libc.mallinfo2().hblkhd - before) >> 20)  # MiB newly mapped for the 2 MiB block
libc.free(block)
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="mallopt and mallinfo2 are glibc's")
def test_a_large_block_is_mapped_again_after_a_large_free():
    def mapped_mib(mode):
        return int(subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                                  check=True).stdout)

    assert mapped_mib("glibc") == 0  # the dynamic threshold: the block went to the heap, kept after free
    assert mapped_mib("fixed") == 2
